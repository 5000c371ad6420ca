// GEMM: the one entry point for every matrix product in meshtrain. Row-major, BLAS semantics:
//   C(M, N) = alpha * op(A) * op(B) + beta * C,  op(X) = X or X^T.
// The library behind it is chosen at build time (cmake/blas.cmake; figures that chose it in
// docs/benchmarks.md). `threads` is this call's thread budget: several ranks sharing one
// process each pass their own and never oversubscribe the cores. A later bf16 path keeps this
// interface and adds a precision field to GemmOptions.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

enum class Trans { N, T };

struct GemmOptions {
  // Thread budget of this call. With oneDNN or OpenBLAS (OpenMP builds) gemm() sets it as the
  // calling thread's own omp_set_num_threads() value, which that thread's later parallel
  // regions without a num_threads clause also see; no other thread's setting changes.
  int threads = 1;
};

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
          const GemmOptions& opt = {});

// Name of the BLAS library compiled in ("dnnl" by default, "openblas" or "blis").
const char* gemm_backend();

}  // namespace meshtrain::kernels
