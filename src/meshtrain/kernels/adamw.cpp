// AdamW update and the sum of squares used by global-norm clipping. One pass over
// (param, grad, m, v) per update; bias corrections are folded into two scalars.
#include "meshtrain/kernels/adamw.h"

#include <cmath>

#include "meshtrain/kernels/bf16.h"

namespace meshtrain::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
}

// ---- adamw_update ----
namespace {

// One pass; kCopy also writes bf16 of each updated weight (two instantiations of one body, so
// the update is the same arithmetic with and without the copy).
template <bool kCopy>
void adamw_pass(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                int threads, uint16_t* bf16_out) {
  const double t = static_cast<double>(p.step);
  const float bc1 = static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta1), t)));
  const float bc2 = static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta2), t)));
  // Plain locals (read through a struct inside the loop they were reloaded every iteration).
  const float b1 = p.beta1, b2 = p.beta2, lr = p.lr, eps = p.eps, wd = p.weight_decay;
  const float gs = p.grad_scale;
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * gs;
    float mi = b1 * m[i] + (1.0f - b1) * g;
    float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi * bc1, vhat = vi * bc2;
    const float w = param[i] - lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
    param[i] = w;
    if constexpr (kCopy) bf16_out[i] = to_bf16(w);
  }
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWParams& p, int threads, uint16_t* bf16_out) {
  if (bf16_out)
    adamw_pass<true>(param, grad, m, v, n, p, threads, bf16_out);
  else
    adamw_pass<false>(param, grad, m, v, n, p, threads, nullptr);
}

// ---- sum_squares ----
double sum_squares(const float* x, int64_t n, int threads) {
  double s = 0.0;
#pragma omp parallel for simd num_threads(threads) reduction(+ : s) \
    if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace meshtrain::kernels
