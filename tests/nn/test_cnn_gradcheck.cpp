// Strict gradient checks of the CNN layers (nn/conv.h, pool.h, batchnorm.h, activation.h,
// shape.h). For each layer and small shape: the float32 module's forward against a float64
// reference written plainly (tests/cnn_reference.h), and its analytic gradients of
// L = sum(y * R) (R fixed, random) against central differences of the reference in float64,
// for EVERY element of the input and of every parameter.
//
// Tolerances and why:
//  - forward: max |y - y_ref| <= 1e-5. Outputs are O(1) sums of at most ~30 float32 products:
//    round-off ~1e-7 (measured worst 3e-7).
//  - gradients: |analytic - numeric| <= 1e-5 * max(1, |numeric|) per element. The numeric side
//    is float64: the layers are linear (conv, pools) or piecewise linear (ReLU, max pool, whose
//    inputs keep every kink and near-tie more than 10 h away) in each element, where a central
//    difference is exact up to round-off (1e-16 |L| / h ~ 1e-11), and batch norm is smooth,
//    where the truncation error h^2 |L'''| stays below 1e-7 at h = 1e-4. The analytic side is
//    float32 sums of at most a few hundred terms: ~1e-6 relative at worst (measured worst
//    1e-6 over these cases). A 1e-5 bound thus leaves a margin of 10 over round-off, while a
//    missing term, a wrong index or a wrong divisor errs by 1e-2 or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "cnn_reference.h"
#include "gradcheck.h"
#include "meshtrain/nn/activation.h"
#include "meshtrain/nn/batchnorm.h"
#include "meshtrain/nn/conv.h"
#include "meshtrain/nn/pool.h"
#include "meshtrain/nn/shape.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

constexpr double kForwardTol = 1e-5;
constexpr double kGradTol = 1e-5;
constexpr double kStep = 1e-4;

using RefForward = std::function<ref::Vec(const ref::Vec& x, const std::vector<ref::Vec>& params)>;

// The check described at the top, for a Layer whose parameters are layer.params() in order.
void strict_check(nn::Layer& layer, const Tensor& x, const RefForward& reference, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<nn::Param*> params = layer.params();
  std::vector<ref::Vec> pd;
  for (nn::Param* p : params) pd.push_back(ref::to_double(p->value));
  ref::Vec xd = ref::to_double(x);

  layer.zero_grad();
  nn::Context ctx(1, true);
  const Tensor y = layer.forward(ctx, x);
  const ref::Vec y_ref = reference(xd, pd);
  ASSERT_EQ(y.numel(), static_cast<int64_t>(y_ref.size()));
  EXPECT_LE(ref::max_abs_error(y, y_ref), kForwardTol) << "forward";

  const Tensor R = random_tensor(y.shape(), 99, "R");
  const ref::Vec Rd = ref::to_double(R);
  const Tensor dx = layer.backward(ctx, R);
  EXPECT_EQ(ctx.saved_bytes(), 0) << "backward left saved tensors behind";
  ASSERT_EQ(dx.shape(), x.shape());

  auto objective = [&] { return ref::dot(reference(xd, pd), Rd); };
  EXPECT_TRUE(ref::close_elementwise(dx, ref::numeric_gradient(xd, objective, kStep), kGradTol)) << "input gradient";
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(ref::close_elementwise(params[i]->grad, ref::numeric_gradient(pd[i], objective, kStep), kGradTol))
        << "gradient of " << params[i]->name;
}

// Values k * 0.05 (k = 0..n-1, shifted to straddle 0) in a seeded random order: no two
// elements closer than 0.05, so max-pool windows have no ties or near-ties.
Tensor distinct_values(Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(std::move(shape));
  std::vector<int64_t> order(static_cast<size_t>(t.numel()));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = 0.05f * static_cast<float>(order[i] - t.numel() / 2);
  return t;
}

}  // namespace

// ---- convolution ----
TEST(CnnGradCheck, Conv2d) {
  struct Case {
    int64_t H, W, K, stride, pad;
    bool bias;
  };
  for (const Case c : {Case{5, 5, 3, 1, 0, true}, Case{5, 5, 3, 1, 1, true}, Case{5, 5, 3, 2, 0, true},
                       Case{5, 5, 3, 2, 1, true}, Case{5, 6, 3, 2, 1, false}, Case{4, 5, 1, 1, 0, true},
                       Case{6, 6, 2, 2, 1, true}}) {
    const std::string what = "Conv2d H" + std::to_string(c.H) + " W" + std::to_string(c.W) + " K" +
                             std::to_string(c.K) + " stride " + std::to_string(c.stride) + " pad " +
                             std::to_string(c.pad) + (c.bias ? "" : " no bias");
    nn::Conv2d conv("conv", 3, 4, c.K, {.stride = c.stride, .padding = c.pad, .bias = c.bias, .seed = 7});
    const kernels::Conv2dShape s{.N = 2, .IC = 3, .H = c.H, .W = c.W, .OC = 4, .KH = c.K, .KW = c.K,
                                 .stride_h = c.stride, .stride_w = c.stride, .pad_h = c.pad, .pad_w = c.pad};
    strict_check(conv, random_tensor({2, 3, c.H, c.W}, 1, "x"),
                 [&](const ref::Vec& x, const std::vector<ref::Vec>& p) {
                   return ref::conv2d(x, p[0], c.bias ? p[1] : ref::Vec{}, s);
                 },
                 what);
  }
}

// ---- pooling ----
TEST(CnnGradCheck, MaxPool2d) {
  struct Case {
    int64_t K, stride, pad;
  };
  for (const Case c : {Case{2, 2, 0}, Case{3, 2, 1}, Case{3, 1, 1}, Case{2, 1, 0}}) {
    nn::MaxPool2d pool(c.K, {.stride = c.stride, .padding = c.pad});
    const kernels::Pool2dShape s{.N = 2, .C = 3, .H = 5, .W = 5, .KH = c.K, .KW = c.K, .stride_h = c.stride,
                                 .stride_w = c.stride, .pad_h = c.pad, .pad_w = c.pad};
    strict_check(pool, distinct_values({2, 3, 5, 5}, 11),
                 [&](const ref::Vec& x, const std::vector<ref::Vec>&) { return ref::maxpool2d(x, s); },
                 "MaxPool2d K" + std::to_string(c.K) + " stride " + std::to_string(c.stride) + " pad " +
                     std::to_string(c.pad));
  }
}

TEST(CnnGradCheck, AvgPool2d) {
  struct Case {
    int64_t K, stride, pad;
  };
  for (bool include_pad : {true, false})
    for (const Case c : {Case{2, 2, 0}, Case{3, 2, 1}, Case{3, 1, 1}}) {
      nn::AvgPool2d pool(c.K, {.stride = c.stride, .padding = c.pad, .count_include_pad = include_pad});
      const kernels::Pool2dShape s{.N = 2, .C = 3, .H = 5, .W = 5, .KH = c.K, .KW = c.K, .stride_h = c.stride,
                                   .stride_w = c.stride, .pad_h = c.pad, .pad_w = c.pad};
      strict_check(pool, random_tensor({2, 3, 5, 5}, 12, "x"),
                   [&](const ref::Vec& x, const std::vector<ref::Vec>&) { return ref::avgpool2d(x, s, include_pad); },
                   "AvgPool2d K" + std::to_string(c.K) + " stride " + std::to_string(c.stride) + " pad " +
                       std::to_string(c.pad) + (include_pad ? " count_include_pad" : ""));
    }
}

TEST(CnnGradCheck, GlobalAvgPool) {
  nn::GlobalAvgPool pool;
  strict_check(pool, random_tensor({2, 3, 5, 4}, 13, "x"),
               [](const ref::Vec& x, const std::vector<ref::Vec>&) {
                 ref::Vec y(6, 0.0);
                 for (size_t i = 0; i < x.size(); ++i) y[i / 20] += x[i] / 20.0;
                 return y;
               },
               "GlobalAvgPool");
}

// ---- element-wise and shape ----
TEST(CnnGradCheck, ReLU) {
  // Every |x| >= 0.01, a hundred steps from the kink at 0.
  Tensor x = random_tensor({2, 3, 5, 5}, 14, "x");
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = x[i] >= 0 ? x[i] + 0.01f : x[i] - 0.01f;
  nn::ReLU relu;
  strict_check(relu, x,
               [](const ref::Vec& v, const std::vector<ref::Vec>&) {
                 ref::Vec y(v.size());
                 for (size_t i = 0; i < v.size(); ++i) y[i] = std::max(v[i], 0.0);
                 return y;
               },
               "ReLU");
}

TEST(CnnGradCheck, Flatten) {
  nn::Flatten flat;
  const Tensor x = random_tensor({2, 3, 2, 2}, 15, "x");
  nn::Context ctx(1, true);
  EXPECT_EQ(flat.forward(ctx, x).shape(), (Shape{2, 12}));
  flat.backward(ctx, random_tensor({2, 12}, 16, "dy"));
  strict_check(flat, x, [](const ref::Vec& v, const std::vector<ref::Vec>&) { return v; }, "Flatten");
}

TEST(CnnGradCheck, ConcatChannels) {
  nn::ConcatChannels cat;
  std::vector<Tensor> xs{random_tensor({2, 2, 3, 3}, 17, "a"), random_tensor({2, 3, 3, 3}, 18, "b"),
                         random_tensor({2, 1, 3, 3}, 19, "c")};
  nn::Context ctx(1, true);
  const Tensor y = cat.forward(ctx, xs);
  ASSERT_EQ(y.shape(), (Shape{2, 6, 3, 3}));
  const int64_t offs[] = {0, 2, 5};
  for (size_t i = 0; i < xs.size(); ++i)
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < xs[i].dim(1); ++c)
        for (int64_t k = 0; k < 9; ++k)
          ASSERT_EQ(y[(n * 6 + offs[i] + c) * 9 + k], xs[i][(n * xs[i].dim(1) + c) * 9 + k]);
  // The gradient of a concatenation is the split of dy: each part gets its slices.
  const Tensor dy = random_tensor(y.shape(), 20, "dy");
  const std::vector<Tensor> dxs = cat.backward(ctx, dy);
  ASSERT_EQ(dxs.size(), 3u);
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(dxs[i].shape(), xs[i].shape());
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < xs[i].dim(1); ++c)
        for (int64_t k = 0; k < 9; ++k)
          ASSERT_EQ(dxs[i][(n * xs[i].dim(1) + c) * 9 + k], dy[(n * 6 + offs[i] + c) * 9 + k]);
  }
  EXPECT_THROW(cat.forward(ctx, std::vector<Tensor>{xs[0], random_tensor({2, 2, 3, 4}, 21, "d")}),
               std::invalid_argument);
}

// ---- batch norm ----
TEST(CnnGradCheck, BatchNorm2d) {
  for (const Shape& xs : {Shape{2, 3, 5, 5}, Shape{4, 2, 1, 1}, Shape{3, 2, 2, 3}, Shape{5, 3}}) {
    const int64_t N = xs[0], C = xs[1], HW = shape_numel(xs) / (N * C);
    nn::BatchNorm2d bn("bn", C);
    for (int64_t c = 0; c < C; ++c) bn.weight.value[c] = 1.0f + 0.3f * c, bn.bias.value[c] = 0.1f - 0.2f * c;
    // A mean of 3 and a spread of 2: the statistics are not those of the normal draw.
    Tensor x = random_tensor(xs, 22, "x", 2.0f);
    for (int64_t i = 0; i < x.numel(); ++i) x[i] += 3.0f;
    strict_check(bn, x,
                 [&](const ref::Vec& v, const std::vector<ref::Vec>& p) {
                   return ref::batchnorm_train(v, p[0], p[1], N, C, HW);
                 },
                 "BatchNorm2d " + shape_str(xs));
  }
}

// relu_after: the batch norm and the ReLU after it in the same passes give, bit for bit, what the
// two layers give one after the other (whose gradients are checked above): the output, the input
// gradient and the weight and bias gradients, at shapes with a few or many values per channel.
TEST(CnnLayers, BatchNormWithItsReluEqualsTheTwoLayers) {
  for (const Shape& xs : {Shape{2, 3, 5, 5}, Shape{8, 16, 14, 14}, Shape{5, 3}}) {
    const int64_t C = xs[1];
    nn::BatchNorm2d fused("bn", C), plain("bn", C);
    nn::ReLU relu;
    fused.relu_after = true;
    for (int64_t c = 0; c < C; ++c)
      for (nn::BatchNorm2d* b : {&fused, &plain}) b->weight.value[c] = 1.0f + 0.3f * c, b->bias.value[c] = 0.1f - 0.2f * c;
    const Tensor x = random_tensor(xs, 5, "x", 2.0f);
    fused.zero_grad();
    plain.zero_grad();
    nn::Context ctx(1, true);
    const Tensor y1 = fused.forward(ctx, x);
    const Tensor y2 = relu.forward(ctx, plain.forward(ctx, x));
    int64_t zeros = 0;
    for (int64_t i = 0; i < y1.numel(); ++i) zeros += y1[i] == 0.0f;
    EXPECT_GT(zeros, y1.numel() / 5) << "the ReLU cuts part of the output";
    const Tensor dy = random_tensor(xs, 6, "dy");
    const Tensor dx1 = fused.backward(ctx, dy);
    const Tensor dx2 = plain.backward(ctx, relu.backward(ctx, dy));
    EXPECT_EQ(ctx.saved_bytes(), 0);
    auto same = [](const Tensor& a, const Tensor& b) {
      return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(y1, y2)) << shape_str(xs) << " output";
    EXPECT_TRUE(same(dx1, dx2)) << shape_str(xs) << " input gradient";
    EXPECT_TRUE(same(fused.weight.grad, plain.weight.grad)) << shape_str(xs) << " weight gradient";
    EXPECT_TRUE(same(fused.bias.grad, plain.bias.grad)) << shape_str(xs) << " bias gradient";
    // Evaluation: the running statistics, the same way.
    nn::Context eval(1, false);
    EXPECT_TRUE(same(fused.forward(eval, x), relu.forward(eval, plain.forward(eval, x)))) << shape_str(xs) << " eval";
  }
}

// ReLU::forward_sum (a residual block's sum and ReLU in one pass) gives the bits of the sum
// followed by the ReLU, forward and backward.
TEST(CnnLayers, ReluOfASumEqualsTheSumThenTheRelu) {
  const Tensor a = random_tensor({4, 8, 9, 9}, 7, "a"), b = random_tensor({4, 8, 9, 9}, 8, "b");
  const Tensor dy = random_tensor({4, 8, 9, 9}, 9, "dy");
  nn::ReLU fused, plain;
  nn::Context ctx(2, true);
  const Tensor y1 = fused.forward_sum(ctx, a, b);
  Tensor s = Tensor::empty(a.shape());
  for (int64_t i = 0; i < s.numel(); ++i) s[i] = a[i] + b[i];
  const Tensor y2 = plain.forward(ctx, s);
  const Tensor d1 = fused.backward(ctx, dy), d2 = plain.backward(ctx, dy);
  EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.numel() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.numel() * sizeof(float)), 0);
  int64_t zeros = 0;
  for (int64_t i = 0; i < y1.numel(); ++i) zeros += y1[i] == 0.0f;
  EXPECT_GT(zeros, y1.numel() / 4);
  EXPECT_THROW(fused.forward_sum(ctx, a, random_tensor({4, 8, 9, 8}, 1, "c")), std::invalid_argument);
}
