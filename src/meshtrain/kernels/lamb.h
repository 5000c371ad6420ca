// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2) on a flat
// span of one parameter, in two passes around the norms the trust ratio needs:
//   pass 1 (lamb_moments): m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//                          u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p
//                          returns sum p^2 and sum u^2 over the span (in double)
//   the caller sums those over every part of the logical tensor and forms
//   step_size = lr * ||p|| / ||u|| (the layer-wise trust ratio; 1 where a norm is 0)
//   pass 2 (lamb_apply):   p -= step_size * u, u recomputed from (m, v, p) by the same code
// `grad_scale` multiplies g first (global-norm clipping). u is not stored between the passes
// (no buffer the size of the parameter): pass 2 recomputes it with the same function from the
// m, v and p that pass 1 wrote or read. Both passes are deterministic for a given span, so a
// run and its resume apply the same updates.
// The sums are made per block of kLambBlock elements and the blocks added in order, so they do
// not depend on the thread count.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

struct LAMBParams {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-6f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  int64_t step = 1;  // 1-based, for bias correction
};

inline constexpr int64_t kLambBlock = 4096;

struct LAMBSums {
  double param_sq = 0;   // sum of p^2 (before the update)
  double update_sq = 0;  // sum of u^2
};

LAMBSums lamb_moments(const float* param, const float* grad, float* m, float* v, int64_t n, const LAMBParams& p,
                      int threads);

// bf16_out, if set, receives to_bf16 of each updated parameter (the next step's bf16 copy).
void lamb_apply(float* param, const float* m, const float* v, int64_t n, const LAMBParams& p, float step_size,
                int threads, uint16_t* bf16_out = nullptr);

}  // namespace meshtrain::kernels
