// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//   forward:  out(n) = gelu(inp)
//   backward: dinp(n) = gelu'(inp) * dout   (written)
// gelu_erf_*: the exact form, PyTorch's default nn.GELU(): x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)),
// its derivative Phi(x) + x phi(x). Each element is computed on its own (the same result at any
// thread count).
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

void gelu_forward(float* out, const float* inp, int64_t n, int threads);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, int threads);
void gelu_erf_forward(float* out, const float* inp, int64_t n, int threads);
void gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n, int threads);

}  // namespace meshtrain::kernels
