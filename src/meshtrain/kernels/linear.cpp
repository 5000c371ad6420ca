// Linear layer = GEMM + bias. The three backward products each go to gemm(); the bias
// gradient is a column sum split over column ranges (no reduction between threads needed).
#include "meshtrain/kernels/linear.h"

#include <vector>

#include "meshtrain/kernels/gemm.h"

namespace meshtrain::kernels {

// ---- forward ----
void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t N, int64_t C, int64_t OC, const GemmOptions& opt) {
  const int threads = opt.threads;
  // out(N, OC) = inp(N, C) @ weight(C, OC) (+ bias broadcast first, then beta = 1)
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && N * OC > 32768)
    for (int64_t i = 0; i < N; ++i) {
      float* o = out + i * OC;
#pragma omp simd
      for (int64_t j = 0; j < OC; ++j) o[j] = bias[j];
    }
    beta = 1.0f;
  }
  gemm(Trans::N, Trans::N, N, OC, C, 1.0f, inp, C, weight, OC, beta, out, OC, opt);
}

// ---- backward ----
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC,
                     const GemmOptions& opt) {
  const int threads = opt.threads;
  // In bf16, dout is an operand of both products: converted once.
  thread_local std::vector<bf16_t> dout16;
  const bf16_t* d16 = dinp && dweight ? bf16_operand(dout, N * OC, dout16, opt) : nullptr;
  // dinp(N, C) = dout(N, OC) @ weight(C, OC)^T
  if (dinp) {
    GemmOptions dx = opt;
    dx.a16 = d16;
    gemm(Trans::N, Trans::T, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C, dx);
  }
  // dweight(C, OC) += inp(N, C)^T @ dout(N, OC)
  if (dweight) {
    GemmOptions dw = opt;
    dw.b16 = d16;  // B is dout here, not the weight
    gemm(Trans::T, Trans::N, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC, dw);
  }
  // dbias(OC) += sum over rows of dout; threads own column blocks of 64.
  if (dbias) {
    const int64_t blk = 64;
    const int64_t nblk = (OC + blk - 1) / blk;
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && N * OC > 32768)
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t j0 = b * blk, j1 = j0 + blk < OC ? j0 + blk : OC;
      float acc[64] = {};
      for (int64_t i = 0; i < N; ++i) {
        const float* d = dout + i * OC;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += d[j];
      }
      for (int64_t j = j0; j < j1; ++j) dbias[j] += acc[j - j0];
    }
  }
}

}  // namespace meshtrain::kernels
