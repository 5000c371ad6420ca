// LAMB's two passes (see lamb.h): the moments and the sums of squares, then the scaled update.
#include "meshtrain/kernels/lamb.h"

#include <cmath>
#include <vector>

#include "meshtrain/kernels/bf16.h"

namespace meshtrain::kernels {

namespace {

constexpr int64_t kParallelMin = 1 << 15;

// The bias corrections as AdamW folds them (kernels/adamw.cpp).
struct Corrections {
  float bc1, bc2;
  explicit Corrections(const LAMBParams& p) {
    const double t = static_cast<double>(p.step);
    bc1 = static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta1), t)));
    bc2 = static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta2), t)));
  }
};

// The update direction of one element: both passes call this one function.
inline float direction(float mi, float vi, float w, float bc1, float bc2, float eps, float wd) {
  return (mi * bc1) / (std::sqrt(vi * bc2) + eps) + wd * w;
}

template <bool kCopy>
void apply_pass(float* param, const float* m, const float* v, int64_t n, const LAMBParams& p, float step_size,
                int threads, uint16_t* bf16_out) {
  const Corrections c(p);
  const float bc1 = c.bc1, bc2 = c.bc2, eps = p.eps, wd = p.weight_decay;
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float w = param[i] - step_size * direction(m[i], v[i], param[i], bc1, bc2, eps, wd);
    param[i] = w;
    if constexpr (kCopy) bf16_out[i] = to_bf16(w);
  }
}

}  // namespace

LAMBSums lamb_moments(const float* param, const float* grad, float* m, float* v, int64_t n, const LAMBParams& p,
                      int threads) {
  const Corrections c(p);
  const float bc1 = c.bc1, bc2 = c.bc2, eps = p.eps, wd = p.weight_decay;
  const float b1 = p.beta1, b2 = p.beta2, gs = p.grad_scale;
  const int64_t blocks = (n + kLambBlock - 1) / kLambBlock;
  std::vector<double> pw(static_cast<size_t>(blocks)), pu(static_cast<size_t>(blocks));
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kLambBlock, hi = lo + kLambBlock < n ? lo + kLambBlock : n;
    double sw = 0, su = 0;
#pragma omp simd reduction(+ : sw, su)
    for (int64_t i = lo; i < hi; ++i) {
      const float g = grad[i] * gs;
      const float mi = b1 * m[i] + (1.0f - b1) * g;
      const float vi = b2 * v[i] + (1.0f - b2) * g * g;
      m[i] = mi;
      v[i] = vi;
      const float u = direction(mi, vi, param[i], bc1, bc2, eps, wd);
      sw += double(param[i]) * double(param[i]);
      su += double(u) * double(u);
    }
    pw[static_cast<size_t>(b)] = sw, pu[static_cast<size_t>(b)] = su;
  }
  LAMBSums s;
  for (size_t b = 0; b < pw.size(); ++b) s.param_sq += pw[b], s.update_sq += pu[b];
  return s;
}

void lamb_apply(float* param, const float* m, const float* v, int64_t n, const LAMBParams& p, float step_size,
                int threads, uint16_t* bf16_out) {
  if (bf16_out)
    apply_pass<true>(param, m, v, n, p, step_size, threads, bf16_out);
  else
    apply_pass<false>(param, m, v, n, p, step_size, threads, nullptr);
}

}  // namespace meshtrain::kernels
