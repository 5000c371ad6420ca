// bf16: the rounding itself (hand-worked cases), and the bf16 GEMM against the exact product
// of the float32 operands, within the bound bf16 rounding of the operands allows:
//   bf16 has 8 significant bits, so rounding to nearest changes x by at most u|x|, u = 2^-8.
//   Each product a'b' = ab(1 + da)(1 + db) is exact in float32 and differs from ab by at most
//   (2u + u^2)|a||b|; float32 accumulation adds at most about K 2^-24 |a'||b'| per term. So
//     |C_bf16 - C| <= (2u + u^2 + K 2^-23) (|A||B|)_ij        (alpha = 1, beta = 0)
//   elementwise, and a path that did not round (plain float32) would sit far inside it, which
//   the second check (against the exactly rounded operands) tells apart.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernel_test_util.h"
#include "meshtrain/kernels/bf16.h"
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/kernels/linear.h"

using namespace meshtrain::kernels;
using namespace meshtrain::kernels::testing;

namespace {

float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Prod {
  std::vector<double> exact, abs, rounded;  // A B, |A||B|, round(A) round(B), all in double
};

Prod products(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const std::vector<float>& A, int64_t lda,
              const std::vector<float>& B, int64_t ldb) {
  Prod p{std::vector<double>(M * N), std::vector<double>(M * N), std::vector<double>(M * N)};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double e = 0, a = 0, r = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float x = ta == Trans::N ? A[i * lda + k] : A[k * lda + i];
        const float y = tb == Trans::N ? B[k * ldb + j] : B[j * ldb + k];
        e += double(x) * y;
        a += std::fabs(double(x) * y);
        r += double(round_bf16(x)) * round_bf16(y);
      }
      p.exact[i * N + j] = e, p.abs[i * N + j] = a, p.rounded[i * N + j] = r;
    }
  return p;
}

}  // namespace

// ---- rounding ----
TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 (mantissa 0, even) and 1 + 2^-7 (mantissa 1): to 1.
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above the halfway point rounds up; just below rounds down.
  EXPECT_EQ(to_bf16(bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(to_bf16(bits(0x3f807fffu)), 0x3f80);
  // The largest float rounds to infinity (as vcvtneps2bf16 does); infinities and NaN survive.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(bits(0x7f800001u)))));  // a NaN whose top bits are inf's
  // Relative error at most 2^-8 over many values; the array form equals the scalar one.
  std::vector<float> x = randn(4096, 7, 3.0f);
  std::vector<bf16_t> h(x.size());
  to_bf16(x.data(), h.data(), static_cast<int64_t>(x.size()), 2);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], to_bf16(x[i])) << i;
    worst = std::max(worst, std::fabs(double(from_bf16(h[i])) - x[i]) / std::fabs(x[i]));
  }
  EXPECT_LE(worst, 0x1p-8);
  EXPECT_GT(worst, 0x1p-10);  // and it does round: 4096 random values come near the bound
}

TEST(Bf16, ParsesPrecisionNames) {
  EXPECT_EQ(parse_precision("bf16"), Precision::bf16);
  EXPECT_EQ(parse_precision("fp32"), Precision::f32);
  EXPECT_THROW(parse_precision("fp16"), std::invalid_argument);
  EXPECT_STREQ(to_string(Precision::bf16), "bf16");
}

// ---- GEMM ----
TEST(Bf16, GemmWithinTheRoundingBoundForEveryTranspose) {
  struct Case {
    int64_t M, N, K;
  };
  const double u = 0x1p-8;
  for (Case c : {Case{1, 1, 1}, Case{7, 9, 70}, Case{33, 31, 17}, Case{64, 192, 64}, Case{96, 48, 256}})
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T})
        for (int threads : {1, 2}) {
          const int64_t lda = (ta == Trans::N ? c.K : c.M) + 3, ldb = (tb == Trans::N ? c.N : c.K) + 1;
          const int64_t ar = ta == Trans::N ? c.M : c.K, br = tb == Trans::N ? c.K : c.N;
          std::vector<float> A = randn(ar * lda, 11), B = randn(br * ldb, 12), C(c.M * c.N, 0.f);
          gemm(ta, tb, c.M, c.N, c.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), c.N, {threads, Precision::bf16});
          const Prod p = products(ta, tb, c.M, c.N, c.K, A, lda, B, ldb);
          const double acc = static_cast<double>(c.K) * 0x1p-23;
          for (int64_t i = 0; i < c.M * c.N; ++i) {
            ASSERT_LE(std::fabs(C[i] - p.exact[i]), (2 * u + u * u + acc) * p.abs[i] + 1e-30)
                << "M N K " << c.M << " " << c.N << " " << c.K << " element " << i;
            // Against the exactly rounded operands only float32 accumulation remains.
            ASSERT_LE(std::fabs(C[i] - p.rounded[i]), acc * p.abs[i] * 1.02 + 1e-30) << "element " << i;
          }
        }
}

TEST(Bf16, GemmAlphaBetaAndAccumulateIntoC) {
  // alpha scales the product, beta the float32 C that is already there (not rounded to bf16).
  const int64_t M = 16, N = 24, K = 40;
  std::vector<float> A = randn(M * K, 3), B = randn(K * N, 4), C0 = randn(M * N, 5);
  std::vector<float> C = C0;
  gemm(Trans::N, Trans::N, M, N, K, 0.5f, A.data(), K, B.data(), N, 1.0f, C.data(), N, {1, Precision::bf16});
  const Prod p = products(Trans::N, Trans::N, M, N, K, A, K, B, N);
  for (int64_t i = 0; i < M * N; ++i)
    ASSERT_NEAR(C[i], 0.5 * p.rounded[i] + C0[i], 1e-5 * (p.abs[i] + std::fabs(C0[i]))) << i;
}

TEST(Bf16, LinearBackwardProductsTakeRoundedOperands) {
  // dW += x^T dy in bf16: the float32 gradient already in dW is kept exactly (beta = 1).
  const int64_t N = 32, C = 48, OC = 40;
  std::vector<float> x = randn(N * C, 1), w = randn(C * OC, 2), dy = randn(N * OC, 3);
  std::vector<float> dx(N * C), dw(C * OC, 0.25f), db(OC, 0.f);
  linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, {1, Precision::bf16});
  const Prod pw = products(Trans::T, Trans::N, C, OC, N, x, C, dy, OC);
  for (int64_t i = 0; i < C * OC; ++i) ASSERT_NEAR(dw[i], 0.25 + pw.rounded[i], 1e-5 * (pw.abs[i] + 1)) << i;
  const Prod px = products(Trans::N, Trans::T, N, C, OC, dy, OC, w, OC);
  for (int64_t i = 0; i < N * C; ++i) ASSERT_NEAR(dx[i], px.rounded[i], 1e-5 * px.abs[i] + 1e-30) << i;
}

TEST(Bf16, PreconvertedBIsThePackedWeightAndRefusesAStride) {
  // A B handed over already in bf16 (a weight's copy) gives the bits of converting it here.
  const int64_t M = 8, N = 24, K = 40;
  std::vector<float> A = randn(M * K, 6), B = randn(K * N, 7), C1(M * N), C2(M * N);
  std::vector<bf16_t> b16(K * N);
  to_bf16(B.data(), b16.data(), K * N);
  gemm(Trans::N, Trans::N, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C1.data(), N, {1, Precision::bf16});
  GemmOptions o{1, Precision::bf16};
  o.b16 = b16.data();
  gemm(Trans::N, Trans::N, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C2.data(), N, o);
  EXPECT_EQ(C1, C2);
  // A packed copy cannot stand for a strided B.
  std::vector<float> wide(K * (N + 3));
  EXPECT_THROW(gemm(Trans::N, Trans::N, M, N, K, 1.f, A.data(), K, wide.data(), N + 3, 0.f, C2.data(), N, o),
               std::invalid_argument);
}

TEST(Bf16, OperandConvertedOnceServesAsAOrBInBothOrientations) {
  // An output gradient dY (N x OC) is A of dX = dY W^T and B of dW = X^T dY. Converted once by
  // bf16_operand it gives the bits of each product converting it itself, transposed A too.
  const int64_t N = 12, C = 20, OC = 36;
  std::vector<float> dY = randn(N * OC, 8), W = randn(C * OC, 9), X = randn(N * C, 10);
  std::vector<bf16_t> buf;
  const GemmOptions o{1, Precision::bf16};
  const bf16_t* d16 = bf16_operand(dY.data(), N * OC, buf, o);
  ASSERT_NE(d16, nullptr);
  GemmOptions oa = o, ob = o;
  oa.a16 = d16;
  ob.b16 = d16;
  std::vector<float> dx1(N * C), dx2(N * C), dw1(C * OC, 0.5f), dw2(C * OC, 0.5f), dt1(OC * C), dt2(OC * C);
  gemm(Trans::N, Trans::T, N, C, OC, 1.f, dY.data(), OC, W.data(), OC, 0.f, dx1.data(), C, o);
  gemm(Trans::N, Trans::T, N, C, OC, 1.f, dY.data(), OC, W.data(), OC, 0.f, dx2.data(), C, oa);
  EXPECT_EQ(dx1, dx2);
  gemm(Trans::T, Trans::N, C, OC, N, 1.f, X.data(), C, dY.data(), OC, 1.f, dw1.data(), OC, o);
  gemm(Trans::T, Trans::N, C, OC, N, 1.f, X.data(), C, dY.data(), OC, 1.f, dw2.data(), OC, ob);
  EXPECT_EQ(dw1, dw2);
  // dY^T as a transposed A (the head's dW = dlogits^T h).
  gemm(Trans::T, Trans::N, OC, C, N, 1.f, dY.data(), OC, X.data(), C, 0.f, dt1.data(), C, o);
  gemm(Trans::T, Trans::N, OC, C, N, 1.f, dY.data(), OC, X.data(), C, 0.f, dt2.data(), C, oa);
  EXPECT_EQ(dt1, dt2);
  // It is what gets multiplied: A's floats are not read again (a zero A16 gives a zero C).
  std::vector<bf16_t> zeros(N * OC, 0);
  GemmOptions oz = o;
  oz.a16 = zeros.data();
  gemm(Trans::N, Trans::T, N, C, OC, 1.f, dY.data(), OC, W.data(), OC, 0.f, dx2.data(), C, oz);
  EXPECT_EQ(dx2, std::vector<float>(N * C, 0.f));
  // Not a bf16 product: nothing converted. A packed A cannot stand for a strided one.
  EXPECT_EQ(bf16_operand(dY.data(), N * OC, buf, GemmOptions{1}), nullptr);
  std::vector<float> wide(N * (OC + 5));
  EXPECT_THROW(gemm(Trans::N, Trans::T, N, C, OC, 1.f, wide.data(), OC + 5, W.data(), OC, 0.f, dx2.data(), C, oa),
               std::invalid_argument);
}

TEST(Bf16, ReportsWhatRunsTheProducts) {
  const std::string isa = bf16_isa();
  EXPECT_TRUE(isa == "avx512_core_amx" || isa == "avx512_core_bf16" || isa == "emulated") << isa;
  EXPECT_FALSE(bf16_fallback_note().empty());
}
