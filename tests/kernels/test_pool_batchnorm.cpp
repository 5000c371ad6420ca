// kernels/pool, relu, concat and batchnorm beyond what the layer gradient checks cover
// (tests/nn/test_cnn_gradcheck.cpp): max-pool ties and NaN, results independent of the thread
// budget, and batch-norm sums that add up over slices of a batch.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <string>
#include <limits>

#include "kernel_test_util.h"
#include "meshtrain/kernels/batchnorm.h"
#include "meshtrain/kernels/concat.h"
#include "meshtrain/kernels/layout.h"
#include "meshtrain/kernels/pool.h"
#include "meshtrain/kernels/relu.h"

using namespace meshtrain::kernels;
using meshtrain::kernels::testing::randn;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// A window of equal values gives its gradient to its first position (row-major), as PyTorch;
// a NaN in a window wins (the last one, as PyTorch).
TEST(PoolKernel, MaxTiesGoToTheFirstPositionAndNaNWins) {
  const Pool2dShape s{.N = 1, .C = 1, .H = 2, .W = 4, .KH = 2, .KW = 2, .stride_h = 2, .stride_w = 2};
  std::vector<float> x{1, 1, 2, 2,
                       1, 1, 2, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> y(2), dx(8);
  std::vector<int32_t> am(2);
  maxpool2d_forward(y.data(), am.data(), x.data(), s, 1);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(am[0], 0);
  EXPECT_EQ(am[1], 7);
  const std::vector<float> dy{3, 5};
  maxpool2d_backward(dx.data(), dy.data(), am.data(), s, 1);
  EXPECT_EQ(dx, (std::vector<float>{3, 0, 0, 0, 0, 0, 0, 5}));
}

// Against a plain loop over every window, written here: shapes with padding, strides above and
// below the window, rectangular windows, odd sizes; inputs on a coarse grid (many ties) with
// NaNs (some windows hold two: the last one wins, PyTorch's rule), and each value and argmax
// compared exactly.
TEST(PoolKernel, MaxMatchesAPlainLoopOverEveryWindow) {
  int cases = 0;
  for (int64_t kh = 1; kh <= 3; ++kh)
    for (int64_t kw = 1; kw <= 3; ++kw)
      for (int64_t st = 1; st <= 3; ++st)
        for (int64_t pad = 0; pad <= std::min(kh, kw) / 2; ++pad)
          for (auto [hh, ww] : {std::pair<int64_t, int64_t>{3, 5}, {7, 9}, {10, 12}, {9, 2}, {2, 9}}) {
            // (9, 2): rows inside the image, and no column whose window is (where W + 2 pad >= K).
            if (hh + 2 * pad < kh || ww + 2 * pad < kw) continue;
            const int64_t hw = hh;
            const Pool2dShape s{.N = 2, .C = 3, .H = hh, .W = ww, .KH = kh, .KW = kw, .stride_h = st,
                                .stride_w = st, .pad_h = pad, .pad_w = pad};
            std::vector<float> x = randn(s.N * s.C * s.H * s.W, 7 + cases);
            for (size_t i = 0; i < x.size(); ++i) {
              x[i] = std::round(x[i] * 2.0f);  // ties
              if (i % 11 == 5) x[i] = std::numeric_limits<float>::quiet_NaN();
            }
            const int64_t OH = s.OH(), OW = s.OW();
            std::vector<float> y(s.N * s.C * OH * OW), y_eval(y.size());
            std::vector<int32_t> am(y.size());
            maxpool2d_forward(y.data(), am.data(), x.data(), s, 2);
            maxpool2d_forward(y_eval.data(), nullptr, x.data(), s, 1);
            for (int64_t p = 0; p < s.N * s.C; ++p)
              for (int64_t oh = 0; oh < OH; ++oh)
                for (int64_t ow = 0; ow < OW; ++ow) {
                  int64_t best = -1;
                  for (int64_t h = oh * st - pad; h < oh * st - pad + kh; ++h)
                    for (int64_t w = ow * st - pad; w < ow * st - pad + kw; ++w) {
                      if (h < 0 || h >= s.H || w < 0 || w >= s.W) continue;
                      const float u = x[p * s.H * s.W + h * s.W + w];
                      if (best < 0) {
                        best = h * s.W + w;
                        continue;
                      }
                      if (std::isnan(u) || u > x[p * s.H * s.W + best]) best = h * s.W + w;
                    }
                  const size_t o = p * OH * OW + oh * OW + ow;
                  const float want = x[p * s.H * s.W + best];
                  const std::string at = "window " + std::to_string(kh) + "x" + std::to_string(kw) + " stride " +
                                         std::to_string(st) + " pad " + std::to_string(pad) + " H " +
                                         std::to_string(hw) + " W " + std::to_string(ww) + " output " + std::to_string(o);
                  ASSERT_EQ(am[o], best) << at;
                  if (std::isnan(want)) {
                    EXPECT_TRUE(std::isnan(y[o]) && std::isnan(y_eval[o])) << at;
                  } else {
                    EXPECT_EQ(y[o], want) << at;
                    EXPECT_EQ(y_eval[o], want) << at;
                  }
                }
            ++cases;
          }
  EXPECT_GT(cases, 100);
}

// Every output is computed by one thread in a fixed order: the budget does not change a bit.
TEST(PoolKernel, ResultsDoNotDependOnTheThreadBudget) {
  const Pool2dShape s{.N = 4, .C = 16, .H = 24, .W = 24, .KH = 3, .KW = 3, .stride_h = 2, .stride_w = 2,
                      .pad_h = 1, .pad_w = 1};
  const std::vector<float> x = randn(s.N * s.C * s.H * s.W, 1);
  const std::vector<float> dy = randn(s.N * s.C * s.OH() * s.OW(), 2);
  auto run = [&](int threads) {
    std::vector<float> ym(dy.size()), ya(dy.size()), dxm(x.size()), dxa(x.size()), g(s.N * s.C), dg(x.size());
    std::vector<int32_t> am(dy.size());
    maxpool2d_forward(ym.data(), am.data(), x.data(), s, threads);
    maxpool2d_backward(dxm.data(), dy.data(), am.data(), s, threads);
    avgpool2d_forward(ya.data(), x.data(), s, true, threads);
    avgpool2d_backward(dxa.data(), dy.data(), s, false, threads);
    global_avgpool_forward(g.data(), x.data(), s.N * s.C, s.H * s.W, threads);
    global_avgpool_backward(dg.data(), dy.data(), s.N * s.C, s.H * s.W, threads);
    return std::vector<std::vector<float>>{ym, ya, dxm, dxa, g, dg};
  };
  const auto one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_bits(one[i], two[i])) << "output " << i;
}

TEST(PoolKernel, RefusesPaddingOverHalfTheWindow) {
  std::vector<float> buf(64);
  EXPECT_THROW(avgpool2d_forward(buf.data(), buf.data(),
                                 {.N = 1, .C = 1, .H = 4, .W = 4, .KH = 2, .KW = 2, .pad_h = 2}, true, 1),
               std::invalid_argument);
}

TEST(ReluKernel, GradientFlowsWhereTheOutputIsPositive) {
  const std::vector<float> x{-1.0f, 0.0f, 2.0f, -0.0f, 3.5f};
  std::vector<float> y(5), dx(5);
  relu_forward(y.data(), x.data(), 5, 1);
  EXPECT_EQ(y, (std::vector<float>{0, 0, 2, 0, 3.5f}));
  const std::vector<float> dy{1, 2, 3, 4, 5};
  relu_backward(dx.data(), y.data(), dy.data(), 5, 1);
  EXPECT_EQ(dx, (std::vector<float>{0, 0, 3, 0, 5}));
}

TEST(ConcatKernel, EmptyPartsAndASkippedGradient) {
  // Parts of 2, 0 and 1 channels, N = 2, HW = 3.
  const std::vector<float> a{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, c{-1, -2, -3, -4, -5, -6};
  const float* parts[] = {a.data(), nullptr, c.data()};
  const int64_t channels[] = {2, 0, 1};
  std::vector<float> out(18);
  concat_channels_forward(out.data(), parts, channels, 2, 3, 1);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, 6, -1, -2, -3, 7, 8, 9, 10, 11, 12, -4, -5, -6}));
  std::vector<float> da(12, 0.0f);
  float* dparts[] = {da.data(), nullptr, nullptr};
  concat_channels_backward(dparts, out.data(), channels, 2, 3, 1);
  EXPECT_EQ(da, a);
}

// The statistics of a batch are the sums of its slices' statistics (what the group all-reduce
// relies on), and the thread budget changes no bit: each channel is summed by one thread.
TEST(BatchNormKernel, SumsAddUpOverSlicesAndIgnoreTheBudget) {
  const int64_t N = 6, C = 5, HW = 40 * 40;  // large enough for the threaded path
  const std::vector<float> x = randn(N * C * HW, 3, 2.0f), dy = randn(N * C * HW, 4);
  std::vector<double> whole(1 + 2 * C), a(1 + 2 * C), b(1 + 2 * C), whole2(1 + 2 * C);
  batchnorm_local_stats(whole.data(), x.data(), N, C, HW, 1);
  batchnorm_local_stats(whole2.data(), x.data(), N, C, HW, 2);
  EXPECT_EQ(whole, whole2);
  batchnorm_local_stats(a.data(), x.data(), 2, C, HW, 1);
  batchnorm_local_stats(b.data(), x.data() + 2 * C * HW, N - 2, C, HW, 1);
  EXPECT_EQ(a[0] + b[0], static_cast<double>(N * HW));
  for (int64_t i = 1; i < 1 + 2 * C; ++i) EXPECT_NEAR(a[i] + b[i], whole[i], 1e-12 * (1 + std::fabs(whole[i]))) << i;

  std::vector<float> mean(C), rstd(C), w(C, 1.5f), bias(C, 0.25f);
  std::vector<double> var(C);
  batchnorm_stats(mean.data(), rstd.data(), var.data(), whole.data(), C, 1e-5f);
  std::vector<double> s1(2 * C), s2(2 * C);
  batchnorm_backward_sums(s1.data(), dy.data(), x.data(), mean.data(), rstd.data(), N, C, HW, 1);
  batchnorm_backward_sums(s2.data(), dy.data(), x.data(), mean.data(), rstd.data(), N, C, HW, 2);
  EXPECT_EQ(s1, s2);
  std::vector<float> y1(x.size()), y2(x.size()), dx1(x.size()), dx2(x.size());
  batchnorm_normalize(y1.data(), x.data(), w.data(), bias.data(), mean.data(), rstd.data(), N, C, HW, 1);
  batchnorm_normalize(y2.data(), x.data(), w.data(), bias.data(), mean.data(), rstd.data(), N, C, HW, 2);
  EXPECT_TRUE(same_bits(y1, y2));
  batchnorm_backward_data(dx1.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), s1.data(),
                          whole[0], N, C, HW, 1);
  batchnorm_backward_data(dx2.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), s1.data(),
                          whole[0], N, C, HW, 2);
  EXPECT_TRUE(same_bits(dx1, dx2));
}

// With |mean| / std = 1e3 the float64 sums still give the variance to float32 precision.
TEST(BatchNormKernel, VarianceSurvivesALargeMean) {
  const int64_t N = 64, C = 1, HW = 64;
  std::vector<float> x = randn(N * HW, 5);  // std 1
  for (float& v : x) v += 1000.0f;
  double m = 0, v2 = 0;
  for (float v : x) m += v;
  m /= static_cast<double>(x.size());
  for (float v : x) v2 += (v - m) * (v - m);
  v2 /= static_cast<double>(x.size());
  std::vector<double> stats(3), var(1);
  std::vector<float> mean(1), rstd(1);
  batchnorm_local_stats(stats.data(), x.data(), N, C, HW, 1);
  batchnorm_stats(mean.data(), rstd.data(), var.data(), stats.data(), C, 0.0f);
  EXPECT_NEAR(var[0], v2, 1e-9 * v2);
  EXPECT_NEAR(mean[0], m, 1e-4);
}

// The blocked layouts (kernels/layout.h): the batch-norm passes and the global average pool on
// nChw8c / nChw16c activations give what they give on NCHW. The float64 sums may differ in
// their last bits (another order of vector partial sums); every elementwise pass, given the
// same statistics and sums, is the same to the bit; and the blocked passes do not depend on
// the thread budget either.
TEST(BatchNormKernel, BlockedLayoutsGiveTheNchwResults) {
  const int64_t N = 5, C = 32, HW = 19 * 21;  // large enough for the threaded path
  const std::vector<float> x = randn(N * C * HW, 11, 2.0f), dy = randn(N * C * HW, 12);
  const std::vector<float> w = randn(C, 13), bias = randn(C, 14);
  const ReluAfter relu{w.data(), bias.data()};
  std::vector<double> stats(1 + 2 * C);
  batchnorm_local_stats(stats.data(), x.data(), N, C, HW, 2);
  std::vector<float> mean(C), rstd(C);
  batchnorm_stats(mean.data(), rstd.data(), nullptr, stats.data(), C, 1e-5f);
  for (int block : {8, 16})
    for (bool with_relu : {false, true}) {
      const std::string at = "block " + std::to_string(block) + (with_relu ? ", with relu" : "");
      const ReluAfter* mask = with_relu ? &relu : nullptr;
      std::vector<float> xb(x.size()), dyb(dy.size());
      to_activation_layout(xb.data(), x.data(), N, C, HW, block);
      to_activation_layout(dyb.data(), dy.data(), N, C, HW, block);
      std::vector<double> sb(1 + 2 * C), sb1(1 + 2 * C);
      batchnorm_local_stats(sb.data(), xb.data(), N, C, HW, 2, block);
      batchnorm_local_stats(sb1.data(), xb.data(), N, C, HW, 1, block);
      EXPECT_EQ(sb, sb1) << at;
      EXPECT_EQ(sb[0], stats[0]) << at;
      for (int64_t i = 1; i < 1 + 2 * C; ++i)
        EXPECT_NEAR(sb[i], stats[i], 1e-12 * (1 + std::fabs(stats[i]))) << at << " " << i;

      std::vector<float> y(x.size()), yb(x.size()), yb_back(x.size());
      batchnorm_normalize(y.data(), x.data(), w.data(), bias.data(), mean.data(), rstd.data(), N, C, HW, 2, with_relu);
      batchnorm_normalize(yb.data(), xb.data(), w.data(), bias.data(), mean.data(), rstd.data(), N, C, HW, 2,
                          with_relu, block);
      from_activation_layout(yb_back.data(), yb.data(), N, C, HW, block);
      EXPECT_TRUE(same_bits(y, yb_back)) << at;

      std::vector<double> g(2 * C), gb(2 * C), gb1(2 * C);
      batchnorm_backward_sums(g.data(), dy.data(), x.data(), mean.data(), rstd.data(), N, C, HW, 2, mask);
      batchnorm_backward_sums(gb.data(), dyb.data(), xb.data(), mean.data(), rstd.data(), N, C, HW, 2, mask, block);
      batchnorm_backward_sums(gb1.data(), dyb.data(), xb.data(), mean.data(), rstd.data(), N, C, HW, 1, mask, block);
      EXPECT_EQ(gb, gb1) << at;
      for (int64_t i = 0; i < 2 * C; ++i) EXPECT_NEAR(gb[i], g[i], 1e-12 * (1 + std::fabs(g[i]))) << at << " " << i;

      std::vector<float> dx(x.size()), dxb(x.size()), dxb_back(x.size());
      batchnorm_backward_data(dx.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), g.data(), stats[0],
                              N, C, HW, 2, mask);
      batchnorm_backward_data(dxb.data(), dyb.data(), xb.data(), w.data(), mean.data(), rstd.data(), g.data(),
                              stats[0], N, C, HW, 2, mask, block);
      from_activation_layout(dxb_back.data(), dxb.data(), N, C, HW, block);
      EXPECT_TRUE(same_bits(dx, dxb_back)) << at;

      std::vector<float> p(N * C), pb(N * C), dp(x.size()), dpb(x.size()), dpb_back(x.size());
      global_avgpool_forward(p.data(), x.data(), N * C, HW, 2);
      global_avgpool_blocked_forward(pb.data(), xb.data(), N, C, HW, block, 2);
      EXPECT_TRUE(same_bits(p, pb)) << at;
      global_avgpool_backward(dp.data(), dy.data(), N * C, HW, 2);
      global_avgpool_blocked_backward(dpb.data(), dy.data(), N, C, HW, block, 2);
      from_activation_layout(dpb_back.data(), dpb.data(), N, C, HW, block);
      EXPECT_TRUE(same_bits(dp, dpb_back)) << at;
    }
  std::vector<double> s(1 + 2 * 12);
  EXPECT_THROW(batchnorm_local_stats(s.data(), x.data(), 1, 12, 4, 1, 8), std::invalid_argument);  // 12 % 8
}
