#include "meshtrain/kernels/relu.h"

namespace meshtrain::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 16;  // elements
}  // namespace

void relu_forward(float* out, const float* inp, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void add_relu_forward(float* out, const float* a, const float* b, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float s = a[i] + b[i];
    out[i] = s > 0.0f ? s : 0.0f;
  }
}

void relu_backward(float* dinp, const float* out, const float* dout, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

}  // namespace meshtrain::kernels
