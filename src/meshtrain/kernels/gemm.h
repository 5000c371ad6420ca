// GEMM: the one entry point for every matrix product in meshtrain. Row-major, BLAS semantics:
//   C(M, N) = alpha * op(A) * op(B) + beta * C,  op(X) = X or X^T.
// The library behind it is chosen at build time (cmake/blas.cmake; figures that chose it in
// docs/benchmarks.md). `threads` is this call's thread budget: several ranks sharing one
// process each pass their own and never oversubscribe the cores. `precision` bf16 rounds A and
// B to bfloat16 (kernels/bf16.h) and multiplies them with float32 accumulation into the float32
// C: through oneDNN's matmul (AMX or AVX512-BF16 kernels, whichever the CPU has), or, where
// neither exists or another BLAS is built in, through the float32 GEMM on the rounded operands
// (the same numbers up to summation order, no speed-up; bf16_isa() says which).
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/kernels/bf16.h"

namespace meshtrain::kernels {

enum class Trans { N, T };

struct GemmOptions {
  GemmOptions() = default;
  // From a thread budget alone (float32), so callers that pass `threads` read as before.
  GemmOptions(int threads, Precision precision = Precision::f32) : threads(threads), precision(precision) {}  // NOLINT
  // Thread budget of this call. With oneDNN or OpenBLAS (OpenMP builds) gemm() sets it as the
  // calling thread's own omp_set_num_threads() value, which that thread's later parallel
  // regions without a num_threads clause also see; no other thread's setting changes.
  int threads = 1;
  Precision precision = Precision::f32;
  // bf16 only: B already converted (kernels::to_bf16 of the stored B, packed: ldb = its row
  // length), e.g. a weight's bf16 copy kept for the step (nn::Param::bf16_value); gemm() then
  // converts only A. Null: B is converted here, like A.
  const bf16_t* b16 = nullptr;
  // bf16 only: A already converted, likewise (lda = its row length), e.g. an output gradient
  // that is the operand of two products (bf16_operand converts it once for both).
  const bf16_t* a16 = nullptr;
};

// X (n packed floats) converted to bf16 into `buf` (grown as needed, kept by the caller) when
// `opt` asks for bf16 products, for several products that share the operand as
// GemmOptions::a16 / b16; null otherwise. The same numbers as gemm() converting it each time.
const bf16_t* bf16_operand(const float* X, int64_t n, std::vector<bf16_t>& buf, const GemmOptions& opt);

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
          const GemmOptions& opt = {});

// Name of the BLAS library compiled in ("dnnl" by default, "openblas" or "blis").
const char* gemm_backend();

}  // namespace meshtrain::kernels
