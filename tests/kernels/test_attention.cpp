// Causal attention against a plain double implementation that materialises the (T x T)
// scores. The reference backward is checked against finite differences of the reference
// forward; the kernel is then compared with both forward and backward references on sizes
// around the tile edges (T = 1, tile - 1, tile + 1, several tiles) and head sizes that are
// not multiples of 16.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "meshtrain/kernels/attention.h"

using namespace meshtrain::kernels;
using namespace meshtrain::kernels::testing;

namespace {

// ---- reference ----
// out(B, T, C), lse(B, NH, T) from qkv(B, T, 3C).
void ref_forward(std::vector<double>& out, std::vector<double>& lse, const std::vector<double>& qkv,
                 int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const double sc = 1.0 / std::sqrt(double(hs));
  out.assign(B * T * C, 0.0);
  lse.assign(B * NH * T, 0.0);
  std::vector<double> s(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const double* q = &qkv[(b * T + i) * 3 * C + h * hs];
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double d = 0;
          for (int64_t x = 0; x < hs; ++x) d += q[x] * k[x];
          s[j] = d * sc;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        for (int64_t j = 0; j <= i; ++j) l += std::exp(s[j] - mx);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - mx) / l;
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hs];
          for (int64_t x = 0; x < hs; ++x) out[(b * T + i) * C + h * hs + x] += p * v[x];
        }
        lse[(b * NH + h) * T + i] = mx + std::log(l);
      }
}

// dqkv from dout by the textbook softmax Jacobian (full probability rows).
std::vector<double> ref_backward(const std::vector<double>& dout, const std::vector<double>& qkv,
                                 int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const double sc = 1.0 / std::sqrt(double(hs));
  std::vector<double> d(B * T * 3 * C, 0.0), p(T), dp(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        auto at = [&](int64_t t, int part) { return (b * T + t) * 3 * C + part * C + h * hs; };
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t x = 0; x < hs; ++x) s += qkv[at(i, 0) + x] * qkv[at(j, 1) + x];
          p[j] = s * sc;
          mx = std::max(mx, p[j]);
        }
        double l = 0;
        for (int64_t j = 0; j <= i; ++j) l += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = 0; j <= i; ++j) p[j] /= l;
        const double* go = &dout[(b * T + i) * C + h * hs];
        double pdp = 0;
        for (int64_t j = 0; j <= i; ++j) {
          dp[j] = 0;
          for (int64_t x = 0; x < hs; ++x) {
            dp[j] += go[x] * qkv[at(j, 2) + x];
            d[at(j, 2) + x] += p[j] * go[x];  // dv
          }
          pdp += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * sc;  // d(score before scaling)
          for (int64_t x = 0; x < hs; ++x) {
            d[at(i, 0) + x] += ds * qkv[at(j, 1) + x];
            d[at(j, 1) + x] += ds * qkv[at(i, 0) + x];
          }
        }
      }
  return d;
}

}  // namespace

TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5, C = 6, NH = 2;
  auto qkv = to_double(randn(B * T * 3 * C, 1));
  auto dout = to_double(randn(B * T * C, 2));
  auto grad = ref_backward(dout, qkv, B, T, C, NH);
  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> o, l;
    ref_forward(o, l, x, B, T, C, NH);
    double s = 0;
    for (size_t k = 0; k < o.size(); ++k) s += o[k] * dout[k];
    return s;
  };
  const double h = 1e-6;  // double central differences: error ~1e-10
  for (size_t k = 0; k < qkv.size(); ++k) {
    auto xp = qkv, xm = qkv;
    xp[k] += h;
    xm[k] -= h;
    EXPECT_NEAR(grad[k], (loss(xp) - loss(xm)) / (2 * h), 1e-6) << "element " << k;
  }
}

TEST(Attention, KernelMatchesReference) {
  struct Case {
    int64_t B, T, C, NH;
  };
  // T around the 16-row / 16-key tiles (1, 15, 17, 31, 33, ...); hs = 3, 8, 20, 32, 64 and
  // 72 (padded to 80: the run-time head-size path, the others take compiled-in sizes).
  const Case cases[] = {{1, 1, 8, 1},    {2, 3, 6, 2},   {1, 15, 48, 3},  {1, 17, 16, 1},
                        {1, 31, 40, 2},  {2, 33, 24, 3}, {1, 64, 64, 2},  {3, 65, 32, 4},
                        {1, 100, 60, 3}, {1, 130, 128, 2}, {1, 40, 144, 2}};
  for (auto [B, T, C, NH] : cases)
    for (int threads : {1, 2}) {
      // qkv ~ N(0, 1): scores up to ~sqrt(hs) spread, so softmax rows are neither flat nor
      // one-hot. Float32 sums over <= 130 keys and exp_approx (~2 ulp): errors ~1e-6;
      // rtol 1e-4 / atol 1e-5 leave margin while a masking or rescaling bug is O(0.1).
      auto qkv = randn(B * T * 3 * C, uint32_t(T * 7 + C));
      auto dout = randn(B * T * C, uint32_t(T + 1));
      std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C, 77.0f);
      attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, threads);
      std::vector<double> wout, wlse;
      ref_forward(wout, wlse, to_double(qkv), B, T, C, NH);
      EXPECT_TRUE(all_close(out, wout, 1e-4, 1e-5)) << "B=" << B << " T=" << T << " C=" << C;
      EXPECT_TRUE(all_close(lse, wlse, 1e-5, 1e-5)) << "B=" << B << " T=" << T << " C=" << C;

      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C,
                         NH, threads);
      auto wd = ref_backward(to_double(dout), to_double(qkv), B, T, C, NH);
      EXPECT_TRUE(all_close(dqkv, wd, 1e-3, 1e-4)) << "B=" << B << " T=" << T << " C=" << C;
    }
}

TEST(Attention, RejectsHeadsThatDoNotDivideC) {
  std::vector<float> x(3 * 10), o(10), l(3);
  EXPECT_THROW(attention_forward(o.data(), l.data(), x.data(), 1, 1, 10, 3, 1),
               std::invalid_argument);
}

TEST(Attention, LargeScoresStayStable) {
  // q scaled by 30: scores spread over hundreds, softmax rows nearly one-hot, and the running
  // max changes between key tiles, which exercises the online rescaling. Float scores of
  // magnitude ~300 carry ~3e-5 absolute error, so p carries ~3e-5 relative: rtol 1e-3; the
  // gradients reach tens (dk carries q), so their atol is 1e-2.
  const int64_t B = 2, T = 50, C = 32, NH = 2;
  auto qkv = randn(B * T * 3 * C, 11);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) qkv[bt * 3 * C + c] *= 30.0f;
  auto dout = randn(B * T * C, 12);
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, 2);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, 2);
  std::vector<double> wout, wlse;
  ref_forward(wout, wlse, to_double(qkv), B, T, C, NH);
  auto wd = ref_backward(to_double(dout), to_double(qkv), B, T, C, NH);
  EXPECT_TRUE(all_close(out, wout, 1e-3, 1e-4));
  EXPECT_TRUE(all_close(lse, wlse, 1e-5, 1e-3));
  EXPECT_TRUE(all_close(dqkv, wd, 1e-3, 1e-2));
}
