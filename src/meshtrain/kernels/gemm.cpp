// GEMM over the BLAS chosen at build time (cmake/blas.cmake), with a per-call thread budget.
// How the budget reaches the library:
//   openblas (OpenMP build), dnnl (OpenMP build): both size their parallel regions from the
//     calling thread's omp_get_max_threads(), so we set that ICV in the calling thread only
//     (each rank thread owns its ICV; no global setter is touched).
//   blis: the expert API takes a per-call rntm_t with the thread count.
// Limits: float32 only for now; M, N or K = 0 is a no-op apart from C *= beta when K = 0.
#include "meshtrain/kernels/gemm.h"

#include <omp.h>

#include <stdexcept>
#include <string>

#if defined(MESHTRAIN_BLAS_OPENBLAS)
#include <cblas.h>
#elif defined(MESHTRAIN_BLAS_BLIS)
#include <blis.h>
#elif defined(MESHTRAIN_BLAS_DNNL)
#include <dnnl.h>
#else
#error "no BLAS selected (cmake/blas.cmake defines MESHTRAIN_BLAS_<NAME>)"
#endif

namespace meshtrain::kernels {

namespace {

// ---- budget ----
// Sets the calling thread's OpenMP budget for the next library call.
void set_budget(int threads) {
  int t = threads < 1 ? 1 : threads;
  if (omp_get_max_threads() != t) omp_set_num_threads(t);
}

// ---- k = 0 ----
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

}  // namespace

// ---- gemm ----
void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
          const GemmOptions& opt) {
  if (M < 0 || N < 0 || K < 0) throw std::invalid_argument("gemm: negative dimension");
  if (M == 0 || N == 0) return;
  if (K == 0) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
#if defined(MESHTRAIN_BLAS_OPENBLAS)
  set_budget(opt.threads);
  cblas_sgemm(CblasRowMajor, ta == Trans::T ? CblasTrans : CblasNoTrans,
              tb == Trans::T ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
#elif defined(MESHTRAIN_BLAS_BLIS)
  // Row-major X(r, c) with leading dim ld: row stride ld, column stride 1.
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(opt.threads < 1 ? 1 : opt.threads, &rntm);
  float a = alpha, b = beta;
  bli_sgemm_ex(ta == Trans::T ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
               tb == Trans::T ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K, &a,
               const_cast<float*>(A), lda, 1, const_cast<float*>(B), ldb, 1, &b, C, ldc, 1,
               nullptr, &rntm);
#elif defined(MESHTRAIN_BLAS_DNNL)
  set_budget(opt.threads);
  dnnl_status_t st = dnnl_sgemm(ta == Trans::T ? 'T' : 'N', tb == Trans::T ? 'T' : 'N', M, N, K,
                                alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw std::runtime_error("gemm: dnnl_sgemm failed with status " + std::to_string(st));
#endif
}

const char* gemm_backend() {
#if defined(MESHTRAIN_BLAS_OPENBLAS)
  return "openblas";
#elif defined(MESHTRAIN_BLAS_BLIS)
  return "blis";
#else
  return "dnnl";
#endif
}

}  // namespace meshtrain::kernels
