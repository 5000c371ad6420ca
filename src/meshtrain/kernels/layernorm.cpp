// LayerNorm forward/backward over rows of (N, C). Rows are split over the thread budget;
// the parameter gradients (dweight, dbias) are reduced from per-thread partial sums so
// threads never write the same element. Statistics are accumulated in float over a row
// (C <= a few thousand), with the variance taken around the mean (two passes over a row
// that sits in L1), which avoids the E[x^2] - E[x]^2 cancellation.
#include "meshtrain/kernels/layernorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace meshtrain::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements
}  // namespace

// ---- forward ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C, int threads,
                       float eps) {
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && N * C > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;  // (C)
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < C; ++j) s += x[j];
    const float m = s / float(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < C; ++j) v += (x[j] - m) * (x[j] - m);
    const float r = 1.0f / std::sqrt(v / float(C) + eps);
    float* o = out + i * C;  // (C)
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) o[j] = (x[j] - m) * r * weight[j] + bias[j];
    mean[i] = m;
    rstd[i] = r;
  }
}

// ---- backward ----
// With xhat = (x - mean) rstd and g = dout * weight:
//   dinp += rstd (g - mean(g) - xhat mean(g xhat)),  dweight += dout xhat,  dbias += dout
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C, int threads) {
  const bool par = threads > 1 && N * C > kParallelMin;
  const int nt = par ? threads : 1;
  // Per-thread partials of dweight, dbias: (nt, 2, C). Thread 0 of a serial run writes
  // straight into its partial and the reduction below adds it once.
  std::vector<float> part(static_cast<size_t>(nt) * 2 * C, 0.0f);
#pragma omp parallel num_threads(nt) if (parallel : par)
  {
    const int tid = omp_get_thread_num();
    float* pw = part.data() + static_cast<size_t>(tid) * 2 * C;  // (C)
    float* pb = pw + C;                                          // (C)
#pragma omp for
    for (int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* d = dout + i * C;
      const float m = mean[i], r = rstd[i];
      float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < C; ++j) {
        const float xh = (x[j] - m) * r;
        const float g = d[j] * weight[j];
        sg += g;
        sgx += g * xh;
        pw[j] += d[j] * xh;
        pb[j] += d[j];
      }
      sg /= float(C);
      sgx /= float(C);
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) {
        const float xh = (x[j] - m) * r;
        dx[j] += r * (d[j] * weight[j] - sg - xh * sgx);
      }
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* pw = part.data() + static_cast<size_t>(t) * 2 * C;
    const float* pb = pw + C;
#pragma omp simd
    for (int64_t j = 0; j < C; ++j) {
      dweight[j] += pw[j];
      dbias[j] += pb[j];
    }
  }
}

}  // namespace meshtrain::kernels
