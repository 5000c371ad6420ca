// AdamW (Loshchilov & Hutter) with bias correction, on a flat span of one parameter:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)
// `grad_scale` multiplies g first (global-norm clipping passes min(1, clip / norm)).
// Bias and norm parameters pass weight_decay = 0 (the optimizer decides, see train/).
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  int64_t step = 1;  // 1-based, for bias correction
};

// bf16_out, if set, receives to_bf16 of each updated parameter (kernels/bf16.h, the same bits
// as converting afterwards) in the same pass: the bf16 weight copy of the next step.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWParams& p, int threads, uint16_t* bf16_out = nullptr);

// Sum of squares of x[0..n) in double (for the global gradient norm).
double sum_squares(const float* x, int64_t n, int threads);

}  // namespace meshtrain::kernels
