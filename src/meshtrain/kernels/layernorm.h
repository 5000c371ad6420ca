// LayerNorm over the last dimension, eps 1e-5 unless given (PyTorch's default).
//   forward:  out(N, C) = (inp - mean) * rstd * weight + bias; saves mean(N), rstd(N)
//   backward: dinp(N, C) += (accumulates: the residual stream adds into it),
//             dweight(C) +=, dbias(C) +=
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C, int threads,
                       float eps = 1e-5f);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C, int threads);

}  // namespace meshtrain::kernels
