// Cross-entropy fused with softmax, and a plain softmax. Rows are independent and split over
// the thread budget. Each row takes two passes (max, then sum of exp) in the forward and one
// in the backward, which rewrites the logits in place with the gradient.
#include "meshtrain/kernels/crossentropy.h"

#include <cmath>
#include <limits>

#include "meshtrain/kernels/vecmath.h"

namespace meshtrain::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements

// ---- row helpers ----
float row_max(const float* x, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < V; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// sum_j exp((x[j] - m) * s). Blocks of 256 are summed in float (16 lanes x 16 terms), the
// block sums in double: a plain float reduction over V = 50257 terms lost ~5e-5 of the sum.
float row_sumexp(const float* x, int64_t V, float m, float s) {
  double total = 0.0;
  for (int64_t j0 = 0; j0 < V; j0 += 256) {
    const int64_t j1 = j0 + 256 < V ? j0 + 256 : V;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = j0; j < j1; ++j) sum += detail::exp_approx((x[j] - m) * s);
    total += sum;
  }
  return static_cast<float>(total);
}
}  // namespace

// ---- forward ----
void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int64_t N, int64_t V, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && N * V > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * V;  // (V)
    const float m = row_max(x, V);
    const float l = m + std::log(row_sumexp(x, V, m, 1.0f));
    lse[i] = l;
    const int32_t t = targets[i];
    losses[i] = t < 0 ? 0.0f : l - x[t];
  }
}

// ---- backward ----
void crossentropy_backward_inplace(float* logits, const float* lse, const int32_t* targets,
                                   const float* dloss, int64_t N, int64_t V, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && N * V > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    float* x = logits + i * V;  // (V): logits in, dlogits out
    const int32_t t = targets[i];
    if (t < 0) {
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) x[j] = 0.0f;
      continue;
    }
    const float l = lse[i], d = dloss[i];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) x[j] = detail::exp_approx(x[j] - l) * d;
    x[t] -= d;
  }
}

// ---- softmax ----
void softmax_forward(float* probs, const float* logits, int64_t N, int64_t V, float temperature,
                     int threads) {
  const float s = 1.0f / temperature;
#pragma omp parallel for num_threads(threads) if (threads > 1 && N * V > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * V;
    float* p = probs + i * V;
    const float m = row_max(x, V);
    double total = 0.0;  // blocked as in row_sumexp
    for (int64_t j0 = 0; j0 < V; j0 += 256) {
      const int64_t j1 = j0 + 256 < V ? j0 + 256 : V;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = j0; j < j1; ++j) {
        const float e = detail::exp_approx((x[j] - m) * s);
        p[j] = e;
        sum += e;
      }
      total += sum;
    }
    const float inv = static_cast<float>(1.0 / total);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) p[j] *= inv;
  }
}

}  // namespace meshtrain::kernels
