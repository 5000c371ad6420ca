// Token + position embedding. Forward splits rows (b, t) over threads. Backward must scatter
// into dwte rows chosen by token ids (two rows may share a token), so threads split the
// channel range instead: each owns columns [c0, c1) of every row and no two write the same
// element; dwpe is split by position t (each t sums over b).
// A null wpe skips the position table (the header's "add_positions = false"); a null dwpe
// skips its gradient.
#include "meshtrain/kernels/embedding.h"

#include <omp.h>

namespace meshtrain::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // elements
}

// ---- forward ----
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t vocab_start, int64_t vocab_size,
                       int threads) {
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && B * T * C > kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    const int64_t row = int64_t(tokens[bt]) - vocab_start;
    const bool own = row >= 0 && row < vocab_size;
    float* o = out + bt * C;            // (C)
    const float* e = wte + row * C;     // (C), valid only when own
    const float* p = wpe ? wpe + t * C : nullptr;
    if (own && p) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else if (own) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    } else if (p) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = p[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
    }
  }
}

// ---- backward ----
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t vocab_start, int64_t vocab_size,
                        int threads) {
  const bool par = threads > 1 && B * T * C > kParallelMin;
#pragma omp parallel num_threads(threads) if (parallel : par)
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    // Column range of this thread, in multiples of 16 floats (one cache line).
    const int64_t chunks = (C + 15) / 16;
    const int64_t c0 = chunks * tid / nt * 16;
    const int64_t c1 = chunks * (tid + 1) / nt * 16 < C ? chunks * (tid + 1) / nt * 16 : C;
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t row = int64_t(tokens[bt]) - vocab_start;
      if (row < 0 || row >= vocab_size) continue;
      const float* d = dout + bt * C;
      float* w = dwte + row * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) w[c] += d[c];
    }
    if (dwpe) {
#pragma omp for
      for (int64_t t = 0; t < T; ++t) {
        float* p = dwpe + t * C;
        for (int64_t b = 0; b < B; ++b) {
          const float* d = dout + (b * T + t) * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) p[c] += d[c];
        }
      }
    }
  }
}

}  // namespace meshtrain::kernels
