// GEMM over the BLAS chosen at build time (cmake/blas.cmake), with a per-call thread budget.
// How the budget reaches the library:
//   openblas (OpenMP build), dnnl (OpenMP build): both size their parallel regions from the
//     calling thread's omp_get_max_threads(), so we set that ICV in the calling thread only
//     (each rank thread owns its ICV; no global setter is touched).
//   blis: the expert API takes a per-call rntm_t with the thread count.
// bf16 (GemmOptions::precision): both operands are converted into thread-local bf16 buffers
// (packed, same orientation: transposes become strides of the memory descriptors), unless the
// caller hands one over already converted (GemmOptions::a16 / b16), then a
// oneDNN matmul primitive (bf16 x bf16 -> f32, alpha as output scale, beta as a sum post-op)
// runs them. Primitives are cached per thread by shape, transposes, alpha, beta, ldc and
// thread budget: a training step uses a handful of shapes, so each is created once.
// M, N or K = 0 is a no-op apart from C *= beta when K = 0.
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/kernels/flops.h"

#include <omp.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#if defined(MESHTRAIN_BLAS_OPENBLAS)
#include <cblas.h>
#elif defined(MESHTRAIN_BLAS_BLIS)
#include <blis.h>
#elif defined(MESHTRAIN_BLAS_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
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

// ---- float32 ----
void sgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const GemmOptions& opt) {
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

// ---- bf16 ----
// The stored operand X (rows x cols, leading dimension ld) converted into a packed buffer of
// the same orientation.
void pack_bf16(const float* X, int64_t rows, int64_t cols, int64_t ld, std::vector<bf16_t>& out, int threads) {
  out.resize(static_cast<size_t>(rows * cols));
  if (ld == cols) return to_bf16(X, out.data(), rows * cols, threads);
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) to_bf16(X + r * ld, out.data() + r * cols, cols, 1);
}

void pack_rounded(const float* X, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out, int threads) {
  out.resize(static_cast<size_t>(rows * cols));
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = round_bf16(X[r * ld + c]);
}

#if defined(MESHTRAIN_BLAS_DNNL)
const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

bool dnnl_has_bf16() {
  static const bool has = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return has;
}

using MatmulKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, float, float, int64_t, int>;

// A (M x K) and B (K x N) packed bf16 in their stored orientation; C float32 with ldc.
void matmul_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
                 const bf16_t* B, float beta, float* C, int64_t ldc, int threads) {
  using dnnl::memory;
  // The primitive and the scratchpad size it asked for. User scratchpad mode: one buffer per
  // thread, grown to the largest asked for, where oneDNN's own mode allocates and frees one at
  // every call (docs/architecture.md, "Allocator settings").
  struct Cached {
    dnnl::matmul prim;
    size_t scratch_bytes;
  };
  thread_local std::map<MatmulKey, Cached> cache;
  thread_local std::vector<uint8_t> scratch;
  thread_local dnnl::stream stream(cpu_engine());
  const memory::desc ad({M, K}, memory::data_type::bf16, ta == Trans::N ? memory::dims{K, 1} : memory::dims{1, M});
  const memory::desc bd({K, N}, memory::data_type::bf16, tb == Trans::N ? memory::dims{N, 1} : memory::dims{1, K});
  const memory::desc cd({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
  const MatmulKey key{M, N, K, ta == Trans::T, tb == Trans::T, alpha, beta, ldc, threads};
  auto it = cache.find(key);
  if (it == cache.end()) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, cpu_engine());
    it = cache.emplace(key, Cached{dnnl::matmul(pd), pd.scratchpad_desc().get_size()}).first;
  }
  const size_t sb = it->second.scratch_bytes;
  if (scratch.size() < sb) scratch.resize(sb);
  memory am(ad, cpu_engine(), const_cast<bf16_t*>(A)), bm(bd, cpu_engine(), const_cast<bf16_t*>(B)),
      cm(cd, cpu_engine(), C);
  memory sm({{static_cast<memory::dim>(sb)}, memory::data_type::u8, memory::format_tag::a}, cpu_engine(),
            sb ? scratch.data() : nullptr);
  it->second.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                                   {DNNL_ARG_SCRATCHPAD, sm}});
  stream.wait();
}
#endif

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
               const GemmOptions& opt) {
  const int threads = opt.threads < 1 ? 1 : opt.threads;
  // Stored shapes: A is M x K (N) or K x M (T); B is K x N (N) or N x K (T).
  const int64_t ar = ta == Trans::N ? M : K, ac = ta == Trans::N ? K : M;
  const int64_t br = tb == Trans::N ? K : N, bc = tb == Trans::N ? N : K;
  if (opt.b16 && ldb != bc)
    throw std::invalid_argument("gemm: a bf16 B (GemmOptions::b16) is packed, so ldb must equal its row length");
  if (opt.a16 && lda != ac)
    throw std::invalid_argument("gemm: a bf16 A (GemmOptions::a16) is packed, so lda must equal its row length");
#if defined(MESHTRAIN_BLAS_DNNL)
  if (dnnl_has_bf16()) {
    thread_local std::vector<bf16_t> a16, b16;
    const bf16_t* ap = opt.a16;
    if (!ap) pack_bf16(A, ar, ac, lda, a16, threads), ap = a16.data();
    const bf16_t* bp = opt.b16;
    if (!bp) pack_bf16(B, br, bc, ldb, b16, threads), bp = b16.data();
    set_budget(threads);
    matmul_bf16(ta, tb, M, N, K, alpha, ap, bp, beta, C, ldc, threads);
    return;
  }
#endif
  thread_local std::vector<float> ar32, br32;
  if (opt.a16) {
    ar32.resize(static_cast<size_t>(ar * ac));
    from_bf16(opt.a16, ar32.data(), ar * ac, threads);
  } else {
    pack_rounded(A, ar, ac, lda, ar32, threads);
  }
  if (opt.b16) {
    br32.resize(static_cast<size_t>(br * bc));
    from_bf16(opt.b16, br32.data(), br * bc, threads);
  } else {
    pack_rounded(B, br, bc, ldb, br32, threads);
  }
  sgemm(ta, tb, M, N, K, alpha, ar32.data(), ac, br32.data(), bc, beta, C, ldc, opt);
}

}  // namespace

// ---- the FLOP count (kernels/flops.h) ----
namespace {
thread_local double flops_counted = 0;
}  // namespace
void count_flops(double flops) { flops_counted += flops; }
double flops_counted_thread() { return flops_counted; }
void reset_flops_counted_thread() { flops_counted = 0; }

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
  count_flops(2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K));
  if (opt.precision == Precision::bf16) return gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, opt);
  sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, opt);
}

const bf16_t* bf16_operand(const float* X, int64_t n, std::vector<bf16_t>& buf, const GemmOptions& opt) {
  if (opt.precision != Precision::bf16 || n <= 0) return nullptr;
  buf.resize(static_cast<size_t>(n));
  to_bf16(X, buf.data(), n, opt.threads < 1 ? 1 : opt.threads);
  return buf.data();
}

std::string bf16_isa() {
#if defined(MESHTRAIN_BLAS_DNNL)
  if (dnnl_has_bf16())
    return dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx ? "avx512_core_amx" : "avx512_core_bf16";
#endif
  return "emulated";
}

std::string bf16_fallback_note() {
#if defined(MESHTRAIN_BLAS_DNNL)
  return "this CPU has neither AMX nor AVX512-BF16 (oneDNN reports no bf16 ISA): bf16 products run as "
         "float32 GEMMs on bf16-rounded operands, the same numbers without the speed-up";
#else
  return std::string("the GEMM library built in is ") + gemm_backend() +
         ", which has no bf16 kernels here: bf16 products run as float32 GEMMs on bf16-rounded operands, "
         "the same numbers without the speed-up (build with -DMESHTRAIN_BLAS=dnnl)";
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
