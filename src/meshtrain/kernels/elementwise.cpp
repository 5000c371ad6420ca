// Element-wise helpers: one vectorised pass, split over the thread budget when large enough
// to pay for waking threads (below ~64k elements a single thread is faster).
#include "meshtrain/kernels/elementwise.h"

namespace meshtrain::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 16;
}

// ---- add ----
void add(float* out, const float* a, const float* b, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---- accumulate ----
void accumulate(float* y, const float* x, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// ---- scale ----
void scale(float* x, float s, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace meshtrain::kernels
