// GELU (tanh approximation) forward and backward, vectorised through detail::tanh_approx.
#include "meshtrain/kernels/gelu.h"

#include <cmath>

#include "meshtrain/kernels/vecmath.h"

namespace meshtrain::kernels {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kA = 0.044715f;
constexpr int64_t kParallelMin = 1 << 15;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)
}  // namespace

// ---- forward ----
void gelu_forward(float* out, const float* inp, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float t = detail::tanh_approx(kS * (x + kA * x * x * x));
    out[i] = 0.5f * x * (1.0f + t);
  }
}

// ---- backward ----
// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) kS (1 + 3 kA x^2),  t = tanh(kS (x + kA x^3))
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float x = inp[i];
    float t = detail::tanh_approx(kS * (x + kA * x * x * x));
    float g = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kS * (1.0f + 3.0f * kA * x * x);
    dinp[i] = g * dout[i];
  }
}

// ---- the exact form ----
void gelu_erf_forward(float* out, const float* inp, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
  }
}

void gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
    dinp[i] = (cdf + x * kInvSqrt2Pi * std::exp(-0.5f * x * x)) * dout[i];
  }
}

}  // namespace meshtrain::kernels
