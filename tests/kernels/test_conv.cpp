// kernels/conv: the oneDNN convolution against the float64 reference (tests/cnn_reference.h) at
// shapes where oneDNN runs its blocked JIT kernels, the gradient rule, and determinism.
//
// Tolerance: every output or gradient element is a sum of K products (K = IC*KH*KW = 144 for
// the output, N*OH*OW = 6272 for the weight gradient). Float32 summation errs by about
// eps_f32 * sqrt(K) * |partial sums|, which scales with the size of the terms, not with the
// element's value (a weight-gradient element near 0 is a cancelled sum of terms of size ~80).
// So each element is held to |got - want| <= 1e-4 * max(1, rms(want)), rms over the tensor:
// measured at the large shape, the worst error is 2e-6 of the rms for the output and input
// gradient, 9e-6 for the weight and bias gradients (relative L2 errors 2e-7 and 1.4e-6): a
// margin of 10, while a wrong index or a dropped term errs by the order of the rms itself.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include "cnn_reference.h"
#include "kernel_test_util.h"
#include "meshtrain/kernels/conv.h"
#include "meshtrain/kernels/layout.h"

using namespace meshtrain;
using namespace meshtrain::kernels;
using meshtrain::kernels::testing::randn;
namespace ref = meshtrain::testing::ref;

namespace {

constexpr double kTol = 1e-4;

struct Problem {
  Conv2dShape s;
  std::vector<float> x, w, b, dy;
  Problem(const Conv2dShape& shape, bool bias) : s(shape) {
    x = randn(s.N * s.IC * s.H * s.W, 1);
    w = randn(s.OC * s.IC * s.KH * s.KW, 2, 0.2f);
    if (bias) b = randn(s.OC, 3);
    dy = randn(s.N * s.OC * s.OH() * s.OW(), 4);
  }
  int64_t out_numel() const { return s.N * s.OC * s.OH() * s.OW(); }
};

void check_against_reference(const Conv2dShape& s, bool bias, int threads) {
  Problem p(s, bias);
  std::vector<float> y(p.out_numel()), dx(p.x.size()), dw(p.w.size(), 0.0f), db(s.OC, 0.0f);
  conv2d_forward(y.data(), p.x.data(), p.w.data(), bias ? p.b.data() : nullptr, s, threads);
  conv2d_backward(dx.data(), dw.data(), bias ? db.data() : nullptr, p.dy.data(), p.x.data(), p.w.data(), s,
                  threads);

  const ref::Vec xd(p.x.begin(), p.x.end()), wd(p.w.begin(), p.w.end()), bd(p.b.begin(), p.b.end());
  const ref::Vec dyd(p.dy.begin(), p.dy.end());
  ref::Vec rdx, rdw, rdb;
  ref::conv2d_backward(rdx, rdw, rdb, dyd, xd, wd, s);
  EXPECT_TRUE(ref::close_scaled(y.data(), ref::conv2d(xd, wd, bd, s), kTol)) << "forward";
  EXPECT_TRUE(ref::close_scaled(dx.data(), rdx, kTol)) << "input gradient";
  EXPECT_TRUE(ref::close_scaled(dw.data(), rdw, kTol)) << "weight gradient";
  if (bias) {
    EXPECT_TRUE(ref::close_scaled(db.data(), rdb, kTol)) << "bias gradient";
  }
}

}  // namespace

// The brief's large shape: oneDNN's blocked AVX-512 kernels (16-channel blocks) and their
// layout conversions, with bias, on one and two threads.
TEST(Conv2dKernel, LargeShapeMatchesFloat64Reference) {
  const Conv2dShape s{.N = 8, .IC = 16, .H = 28, .W = 28, .OC = 32, .KH = 3, .KW = 3, .pad_h = 1, .pad_w = 1};
  check_against_reference(s, true, 1);
  check_against_reference(s, true, 2);
}

// Channel counts that are no multiple of the 16-channel blocks, stride 2, no padding, an odd
// image, a non-square kernel and no bias.
TEST(Conv2dKernel, OddShapesMatchFloat64Reference) {
  check_against_reference({.N = 3, .IC = 5, .H = 13, .W = 11, .OC = 7, .KH = 3, .KW = 2, .stride_h = 2, .stride_w = 2},
                          false, 2);
  check_against_reference({.N = 2, .IC = 3, .H = 9, .W = 9, .OC = 20, .KH = 5, .KW = 5, .stride_h = 2, .stride_w = 1,
                           .pad_h = 2, .pad_w = 1},
                          true, 1);
  check_against_reference({.N = 4, .IC = 24, .H = 7, .W = 7, .OC = 40, .KH = 1, .KW = 1}, true, 2);  // pointwise
}

// Gradient rule: the weight and bias gradients add to what they hold; the input gradient is
// written whatever it held; a null gradient is skipped.
TEST(Conv2dKernel, AccumulatesParameterGradientsAndWritesInputGradient) {
  const Conv2dShape s{.N = 2, .IC = 16, .H = 8, .W = 8, .OC = 16, .KH = 3, .KW = 3, .pad_h = 1, .pad_w = 1};
  Problem p(s, true);
  std::vector<float> dw1(p.w.size(), 0.0f), db1(s.OC, 0.0f), dx1(p.x.size());
  conv2d_backward(dx1.data(), dw1.data(), db1.data(), p.dy.data(), p.x.data(), p.w.data(), s, 1);

  std::vector<float> dw2 = randn(p.w.size(), 7), db2 = randn(s.OC, 8);
  const std::vector<float> dw0 = dw2, db0 = db2;
  std::vector<float> dx2(p.x.size(), std::numeric_limits<float>::quiet_NaN());
  conv2d_backward(dx2.data(), dw2.data(), db2.data(), p.dy.data(), p.x.data(), p.w.data(), s, 1);
  EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * sizeof(float)));
  for (size_t i = 0; i < dw2.size(); ++i) ASSERT_NEAR(dw2[i], dw0[i] + dw1[i], 1e-5f * (1 + std::fabs(dw1[i]))) << i;
  for (size_t i = 0; i < db2.size(); ++i) ASSERT_NEAR(db2[i], db0[i] + db1[i], 1e-5f * (1 + std::fabs(db1[i]))) << i;

  // Only the input gradient (weights deferred), then only the weight gradient.
  std::vector<float> dx3(p.x.size());
  conv2d_backward(dx3.data(), nullptr, nullptr, p.dy.data(), p.x.data(), p.w.data(), s, 1);
  EXPECT_EQ(dx1, dx3);
  std::vector<float> dw4(p.w.size(), 0.0f);
  conv2d_backward(nullptr, dw4.data(), nullptr, p.dy.data(), p.x.data(), nullptr, s, 1);
  EXPECT_EQ(dw1, dw4);
}

// Determinism. oneDNN 2.6's CPU convolutions partition the work statically by the thread
// count the primitive was made for, so a fixed budget gives bit-identical results call after
// call (forward, input and weight gradient). Across budgets the weight gradient's reduction
// over the batch is split differently: equal up to float32 round-off, not bit-identical.
TEST(Conv2dKernel, BitIdenticalForAFixedBudgetCloseAcrossBudgets) {
  const Conv2dShape s{.N = 8, .IC = 16, .H = 28, .W = 28, .OC = 32, .KH = 3, .KW = 3, .pad_h = 1, .pad_w = 1};
  Problem p(s, true);
  struct Out {
    std::vector<float> y, dx, dw, db;
  };
  auto run = [&](int threads) {
    Out o{std::vector<float>(p.out_numel()), std::vector<float>(p.x.size()), std::vector<float>(p.w.size(), 0.0f),
          std::vector<float>(s.OC, 0.0f)};
    conv2d_forward(o.y.data(), p.x.data(), p.w.data(), p.b.data(), s, threads);
    conv2d_backward(o.dx.data(), o.dw.data(), o.db.data(), p.dy.data(), p.x.data(), p.w.data(), s, threads);
    return o;
  };
  for (int threads : {1, 2}) {
    const Out a = run(threads), b = run(threads), c = run(threads);
    EXPECT_EQ(a.y, b.y) << threads;
    EXPECT_EQ(a.dx, b.dx) << threads;
    EXPECT_EQ(a.dw, b.dw) << threads;
    EXPECT_EQ(a.db, b.db) << threads;
    EXPECT_EQ(a.dw, c.dw) << threads;
  }
  // Across budgets: within the reference tolerance of each other (both are within it of the
  // float64 result); the forward and input gradient happen to be bit-identical, since their
  // sums are not split between threads, but that is not promised.
  const Out one = run(1), two = run(2);
  auto d = [](const std::vector<float>& v) { return ref::Vec(v.begin(), v.end()); };
  EXPECT_TRUE(ref::close_scaled(two.y.data(), d(one.y), kTol));
  EXPECT_TRUE(ref::close_scaled(two.dx.data(), d(one.dx), kTol));
  EXPECT_TRUE(ref::close_scaled(two.dw.data(), d(one.dw), kTol));
  EXPECT_TRUE(ref::close_scaled(two.db.data(), d(one.db), kTol));
}

TEST(Conv2dKernel, RejectsImpossibleShapes) {
  std::vector<float> buf(1024);
  EXPECT_THROW(conv2d_forward(buf.data(), buf.data(), buf.data(), nullptr,
                              {.N = 1, .IC = 1, .H = 2, .W = 2, .OC = 1, .KH = 3, .KW = 3}, 1),
               std::invalid_argument);
  EXPECT_THROW(conv2d_forward(buf.data(), buf.data(), buf.data(), nullptr,
                              {.N = 1, .IC = 1, .H = 4, .W = 4, .OC = 1, .KH = 3, .KW = 3, .stride_h = 0}, 1),
               std::invalid_argument);
}

// Activations kept in the blocked layouts (kernels/layout.h): the same convolution read and
// written in nChw8c or nChw16c gives the NCHW results, permuted, to the bit (the primitive is
// the one the NCHW call converts into and out of), for every mix of input and output layouts.
TEST(Conv2dKernel, BlockedActivationsGiveTheNchwResults) {
  for (int block : {8, 16})
    for (int in_b : {0, block})
      for (int out_b : {0, block}) {
        const Conv2dShape plain{.N = 3, .IC = 32, .H = 9, .W = 7, .OC = 16, .KH = 3, .KW = 3, .stride_h = 2,
                                .stride_w = 1, .pad_h = 1, .pad_w = 1};
        Conv2dShape s = plain;
        s.src_block = in_b, s.dst_block = out_b;
        Problem p(plain, true);
        const int64_t HW = s.H * s.W, OHW = s.OH() * s.OW();
        std::vector<float> y(p.out_numel()), dx(p.x.size()), dw(p.w.size(), 0.0f), db(s.OC, 0.0f);
        conv2d_forward(y.data(), p.x.data(), p.w.data(), p.b.data(), plain, 2);
        conv2d_backward(dx.data(), dw.data(), db.data(), p.dy.data(), p.x.data(), p.w.data(), plain, 2);

        std::vector<float> xb(p.x.size()), dyb(p.dy.size()), yb(y.size()), dxb(dx.size());
        std::vector<float> dwb(dw.size(), 0.0f), dbb(db.size(), 0.0f);
        to_activation_layout(xb.data(), p.x.data(), s.N, s.IC, HW, in_b);
        to_activation_layout(dyb.data(), p.dy.data(), s.N, s.OC, OHW, out_b);
        conv2d_forward(yb.data(), xb.data(), p.w.data(), p.b.data(), s, 2);
        conv2d_backward(dxb.data(), dwb.data(), dbb.data(), dyb.data(), xb.data(), p.w.data(), s, 2);
        std::vector<float> y_back(y.size()), dx_back(dx.size());
        from_activation_layout(y_back.data(), yb.data(), s.N, s.OC, OHW, out_b);
        from_activation_layout(dx_back.data(), dxb.data(), s.N, s.IC, HW, in_b);
        const std::string at = "block " + std::to_string(block) + ", in " + std::to_string(in_b) + ", out " +
                               std::to_string(out_b);
        EXPECT_EQ(y, y_back) << at;
        EXPECT_EQ(dx, dx_back) << at;
        EXPECT_EQ(dw, dwb) << at;
        EXPECT_EQ(db, dbb) << at;
      }
  Conv2dShape bad{.N = 1, .IC = 12, .H = 4, .W = 4, .OC = 16, .KH = 3, .KW = 3};
  bad.src_block = 8;  // 12 channels are not whole blocks of 8
  std::vector<float> x(12 * 16), w(16 * 12 * 9), y(16 * 4);
  EXPECT_THROW(conv2d_forward(y.data(), x.data(), w.data(), nullptr, bad, 1), std::invalid_argument);
}
