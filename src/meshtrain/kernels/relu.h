// ReLU: max(x, 0).
//   forward:  out(n) = max(inp, 0)
//   backward: dinp(n) = out > 0 ? dout : 0   (written; reads the forward's output, so the
//             input need not be kept: the gradient at 0 is 0, as PyTorch's)
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

void relu_forward(float* out, const float* inp, int64_t n, int threads);
// out(n) = max(a + b, 0) in one pass (a residual block's sum and ReLU): the same bits as add then
// relu_forward.
void add_relu_forward(float* out, const float* a, const float* b, int64_t n, int threads);
void relu_backward(float* dinp, const float* out, const float* dout, int64_t n, int threads);

}  // namespace meshtrain::kernels
