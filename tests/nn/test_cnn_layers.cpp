// The CNN layers beyond their gradients (tests/nn/test_cnn_gradcheck.cpp): batch norm's running
// statistics, evaluation mode and synchronised statistics over two ranks; buffers; split
// backward; Conv2d's layout-invariant initialisation and a conv split by filters.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <thread>

#include "cnn_reference.h"
#include "gradcheck.h"
#include "meshtrain/nn/batchnorm.h"
#include "meshtrain/nn/conv.h"
#include "meshtrain/nn/shape.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

// Rows [begin, end) of the batch dimension of x, copied.
Tensor rows(const Tensor& x, int64_t begin, int64_t end) {
  Shape s = x.shape();
  const int64_t per = x.numel() / s[0];
  s[0] = end - begin;
  Tensor out = Tensor::empty(s);
  std::copy(x.data() + begin * per, x.data() + end * per, out.data());
  return out;
}

// |a[i] - b[off + i]| <= tol * max(1, |b|) for every element of a.
::testing::AssertionResult matches_at(const Tensor& a, const Tensor& b, int64_t off, double tol) {
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double want = b[off + i];
    if (std::fabs(a[i] - want) > tol * std::max(1.0, std::fabs(want)))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << want;
  }
  return ::testing::AssertionSuccess();
}

void set_affine(nn::BatchNorm2d& bn) {
  for (int64_t c = 0; c < bn.channels; ++c) bn.weight.value[c] = 0.5f + 0.25f * c, bn.bias.value[c] = -0.1f * c;
}

}  // namespace

// ---- batch norm: running statistics ----
// Worked by hand: channel 0 holds {1, 2, 3, 4} (mean 2.5, biased variance 1.25, unbiased 5/3),
// channel 1 {10, 14, 6, 2} (mean 8, biased variance 20, unbiased 80/3). With momentum 0.1 and
// the initial (0, 1): running_mean = 0.1 mean, running_var = 0.9 + 0.1 unbiased; a second step
// moves them again by the same rule.
TEST(BatchNorm2d, RunningStatisticsAsPyTorch) {
  nn::BatchNorm2d bn("bn", 2);
  const Tensor x = Tensor::from({2, 2, 1, 2}, {1, 2, 10, 14, 3, 4, 6, 2});  // (N, C, H, W)
  nn::Context ctx(1, true);
  const Tensor y = bn.forward(ctx, x);
  EXPECT_NEAR(bn.running_mean.value[0], 0.25f, 1e-7);
  EXPECT_NEAR(bn.running_mean.value[1], 0.8f, 1e-7);
  EXPECT_NEAR(bn.running_var.value[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
  EXPECT_NEAR(bn.running_var.value[1], 0.9 + 0.1 * 80.0 / 3.0, 1e-6);
  // Normalised with the biased variance: (1 - 2.5) / sqrt(1.25 + 1e-5), (2 - 8) / sqrt(20 + 1e-5).
  EXPECT_NEAR(y[0], -1.5 / std::sqrt(1.25 + 1e-5), 1e-6);
  EXPECT_NEAR(y[3], 6.0 / std::sqrt(20 + 1e-5), 1e-6);
  bn.backward(ctx, Tensor::zeros(x.shape()));

  bn.forward(ctx, x);
  EXPECT_NEAR(bn.running_mean.value[0], 0.9 * 0.25 + 0.25, 1e-6);
  EXPECT_NEAR(bn.running_mean.value[1], 0.9 * 0.8 + 0.8, 1e-6);
  EXPECT_NEAR(bn.running_var.value[0], 0.9 * (0.9 + 0.1 * 5.0 / 3.0) + 0.1 * 5.0 / 3.0, 1e-6);
  EXPECT_NEAR(bn.running_var.value[1], 0.9 * (0.9 + 0.1 * 80.0 / 3.0) + 0.1 * 80.0 / 3.0, 1e-6);
}

TEST(BatchNorm2d, OneValuePerChannelIsRefusedInTraining) {
  nn::BatchNorm2d bn("bn", 2);
  nn::Context ctx(1, true);
  EXPECT_THROW(bn.forward(ctx, Tensor({1, 2, 1, 1})), std::invalid_argument);
  nn::Context eval(1, false);
  EXPECT_NO_THROW(bn.forward(eval, Tensor({1, 2, 1, 1})));
  EXPECT_THROW(bn.forward(eval, Tensor({2, 3, 1, 1})), std::invalid_argument);  // wrong channels
}

// ---- batch norm: evaluation ----
TEST(BatchNorm2d, EvaluationUsesRunningStatisticsAndSavesNothing) {
  nn::BatchNorm2d bn("bn", 3);
  set_affine(bn);
  for (int64_t c = 0; c < 3; ++c) bn.running_mean.value[c] = 0.3f * c - 0.2f, bn.running_var.value[c] = 0.5f + c;
  const Tensor rm = bn.running_mean.value.clone(), rv = bn.running_var.value.clone();
  const Tensor x = random_tensor({2, 3, 4, 5}, 31, "x");
  nn::Context ctx(1, false);
  const Tensor y = bn.forward(ctx, x);
  const ref::Vec want = ref::batchnorm_eval(ref::to_double(x), ref::to_double(bn.weight.value),
                                            ref::to_double(bn.bias.value), ref::to_double(rm), ref::to_double(rv), 2,
                                            3, 20);
  EXPECT_LE(ref::max_abs_error(y, want), 1e-6);
  EXPECT_EQ(max_abs_diff(bn.running_mean.value, rm), 0.0f);
  EXPECT_EQ(max_abs_diff(bn.running_var.value, rv), 0.0f);
  EXPECT_EQ(ctx.saved_bytes(), 0);
  EXPECT_THROW(bn.backward(ctx, y), std::logic_error);
}

// ---- batch norm: synchronised statistics ----
// Two ranks (threads) hold 2 and 3 of a batch of 5; reduce_stats sums their per-channel sums
// through a barrier. Outputs, input gradients and running statistics must be those of one
// module on the whole batch, and the ranks' parameter gradients must add up to its gradients.
// Tolerance 1e-6 (relative above 1): the statistics agree to double round-off, so the float32
// results differ by an ulp or two at most.
TEST(BatchNorm2d, SynchronisedStatisticsMatchTheWholeBatch) {
  const int64_t N = 5, C = 3, cut = 2;
  Tensor x = random_tensor({N, C, 4, 4}, 32, "x", 2.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x[i] += 1.0f;
  const Tensor R = random_tensor(x.shape(), 33, "R");

  nn::BatchNorm2d whole("bn", C);
  set_affine(whole);
  nn::Context wctx(1, true);
  const Tensor y = whole.forward(wctx, x);
  const Tensor dx = whole.backward(wctx, R);

  // The group "all-reduce": each rank publishes its span, both sum in the same order, and
  // nobody overwrites its span before both have read.
  std::barrier sync(2);
  std::span<double> slot[2];
  std::vector<size_t> sizes[2];
  auto reduce = [&](int rank, std::span<double> v) {
    sizes[rank].push_back(v.size());
    slot[rank] = v;
    sync.arrive_and_wait();
    std::vector<double> sum(v.size());
    for (size_t i = 0; i < v.size(); ++i) sum[i] = slot[0][i] + slot[1][i];
    sync.arrive_and_wait();
    std::copy(sum.begin(), sum.end(), v.begin());
  };
  nn::BatchNorm2d r0("bn", C), r1("bn", C);
  nn::BatchNorm2d* rank_bn[2] = {&r0, &r1};
  Tensor ys[2], dxs[2];
  const int64_t begin[2] = {0, cut}, end[2] = {cut, N};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      nn::BatchNorm2d& bn = *rank_bn[r];
      set_affine(bn);
      bn.reduce_stats = [&, r](std::span<double> v) { reduce(r, v); };
      nn::Context ctx(1, true);
      ys[r] = bn.forward(ctx, rows(x, begin[r], end[r]));
      dxs[r] = bn.backward(ctx, rows(R, begin[r], end[r]));
    });
  for (auto& t : ranks) t.join();

  const int64_t per = x.numel() / N;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(sizes[r], (std::vector<size_t>{1 + 2 * C, 2 * C}));  // forward's stats, backward's sums
    EXPECT_TRUE(matches_at(ys[r], y, begin[r] * per, 1e-6)) << "output";
    EXPECT_TRUE(matches_at(dxs[r], dx, begin[r] * per, 1e-6)) << "input gradient";
    EXPECT_TRUE(matches_at(rank_bn[r]->running_mean.value, whole.running_mean.value, 0, 1e-6));
    EXPECT_TRUE(matches_at(rank_bn[r]->running_var.value, whole.running_var.value, 0, 1e-6));
  }
  for (int64_t c = 0; c < C; ++c) {
    const double gw = r0.weight.grad[c] + r1.weight.grad[c], gb = r0.bias.grad[c] + r1.bias.grad[c];
    EXPECT_NEAR(gw, whole.weight.grad[c], 1e-6 * std::max(1.0f, std::fabs(whole.weight.grad[c]))) << c;
    EXPECT_NEAR(gb, whole.bias.grad[c], 1e-6 * std::max(1.0f, std::fabs(whole.bias.grad[c]))) << c;
  }

  // Without the callback a rank normalises with its own slice's statistics: visibly different.
  nn::BatchNorm2d local("bn", C);
  set_affine(local);
  nn::Context lctx(1, true);
  const Tensor yl = local.forward(lctx, rows(x, 0, cut));
  EXPECT_FALSE(matches_at(yl, y, 0, 1e-3));
}

// ---- buffers ----
TEST(BatchNorm2d, RunningStatisticsAreBuffersNotParameters) {
  nn::BatchNorm2d bn("layer1.0.bn1", 4);
  std::vector<std::string> params, buffers;
  for (nn::Param* p : bn.params()) params.push_back(p->name);
  for (nn::Param* p : bn.buffers()) {
    buffers.push_back(p->name);
    EXPECT_TRUE(p->is_buffer());
    EXPECT_EQ(p->grad.numel(), 0);
    EXPECT_EQ(p->value.shape(), (Shape{4}));
    EXPECT_FALSE(p->decay);
  }
  EXPECT_EQ(params, (std::vector<std::string>{"layer1.0.bn1.weight", "layer1.0.bn1.bias"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"layer1.0.bn1.running_mean", "layer1.0.bn1.running_var"}));
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(bn.weight.value[c], 1.0f);
    EXPECT_EQ(bn.bias.value[c], 0.0f);
    EXPECT_EQ(bn.running_mean.value[c], 0.0f);
    EXPECT_EQ(bn.running_var.value[c], 1.0f);
  }
  EXPECT_FALSE(bn.weight.is_buffer());
  nn::Conv2d conv("conv", 2, 3, 3);
  EXPECT_TRUE(conv.buffers().empty());  // the default: no buffers
  bn.zero_grad();                        // touches parameters only
}

// ---- split backward ----
// With defer_weight_grads, backward gives the same input gradient and leaves the parameter
// gradients alone; run_deferred then adds exactly what a plain backward adds, and reports
// each parameter ready.
template <class Make>
void check_deferred(Make make, const Tensor& x) {
  auto plain = make();
  auto split = make();
  nn::Context pctx(1, true);
  const Tensor y = plain->forward(pctx, x);
  const Tensor dy = random_tensor(y.shape(), 34, "dy");
  const Tensor dx = plain->backward(pctx, dy);

  nn::Hooks hooks;
  int ready = 0;
  hooks.grad_ready = [&](nn::Param*) { ++ready; };
  nn::Context sctx(1, true);
  sctx.hooks = &hooks;
  sctx.defer_weight_grads = true;
  split->forward(sctx, x);
  const Tensor sdx = split->backward(sctx, dy);
  EXPECT_EQ(max_abs_diff(sdx, dx), 0.0f);
  for (nn::Param* p : split->params()) EXPECT_EQ(max_abs_diff(p->grad, Tensor(p->grad.shape())), 0.0f) << p->name;
  EXPECT_EQ(ready, 0);
  EXPECT_TRUE(sctx.has_deferred());
  sctx.run_deferred();
  EXPECT_EQ(ready, static_cast<int>(split->params().size()));
  const auto pp = plain->params(), sp = split->params();
  for (size_t i = 0; i < pp.size(); ++i) EXPECT_EQ(max_abs_diff(pp[i]->grad, sp[i]->grad), 0.0f) << pp[i]->name;
  EXPECT_EQ(sctx.saved_bytes(), 0);
}

TEST(CnnLayers, SplitBackwardDefersWeightGradients) {
  check_deferred([] { return std::make_unique<nn::Conv2d>("conv", 3, 5, 3, nn::Conv2dOptions{.padding = 1, .seed = 2}); },
                 random_tensor({2, 3, 6, 6}, 35, "x"));
  check_deferred(
      [] {
        auto bn = std::make_unique<nn::BatchNorm2d>("bn", 3);
        set_affine(*bn);
        return bn;
      },
      random_tensor({2, 3, 6, 6}, 36, "x"));
}

// ---- Conv2d initialisation ----
// Uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's default bound), keyed by
// (seed, name): a rank holding filters [2r, 2r + 2) of a split-by-filters conv holds exactly
// those rows of the whole layer, and computes exactly those output channels.
TEST(CnnLayers, Conv2dInitialisationIsLayoutInvariant) {
  const int64_t IC = 3, OC = 4, K = 3;
  nn::Conv2d full("features.0", IC, OC, K, {.padding = 1, .seed = 9});
  const float bound = 1.0f / std::sqrt(static_cast<float>(IC * K * K));
  double mean = 0;
  for (int64_t i = 0; i < full.weight.numel(); ++i) {
    ASSERT_GE(full.weight.value[i], -bound);
    ASSERT_LT(full.weight.value[i], bound);
    mean += full.weight.value[i];
  }
  EXPECT_LT(std::fabs(mean / full.weight.numel()), 0.1 * bound);
  for (int64_t i = 0; i < OC; ++i) ASSERT_LE(std::fabs(full.bias.value[i]), bound);

  nn::Conv2d other_name("features.3", IC, OC, K, {.padding = 1, .seed = 9});
  EXPECT_GT(max_abs_diff(full.weight.value, other_name.weight.value), 0.0f);

  const Tensor x = random_tensor({2, IC, 5, 5}, 37, "x");
  nn::Context ctx(1, false);
  const Tensor y = full.forward(ctx, x);  // (2, OC, 5, 5)
  for (int r = 0; r < 2; ++r) {
    nn::Conv2d part("features.0", IC, OC, K,
                    {.padding = 1, .seed = 9, .weight_shard = nn::ShardSpec::split(0, r, 2),
                     .bias_shard = nn::ShardSpec::split(0, r, 2)});
    ASSERT_EQ(part.weight.value.shape(), (Shape{2, IC, K, K}));
    const int64_t per = IC * K * K;
    for (int64_t i = 0; i < part.weight.numel(); ++i) ASSERT_EQ(part.weight.value[i], full.weight.value[r * 2 * per + i]);
    for (int64_t i = 0; i < 2; ++i) ASSERT_EQ(part.bias.value[i], full.bias.value[r * 2 + i]);
    const Tensor yp = part.forward(ctx, x);  // (2, 2, 5, 5): output channels 2r, 2r + 1
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 2 * 25; ++i) ASSERT_NEAR(yp[n * 50 + i], y[n * 100 + r * 50 + i], 1e-6f);
  }
}

// A model's first convolution (input_grad false: nobody reads the images' gradient) returns no
// input gradient and the same weight and bias gradients, in both backward modes.
TEST(CnnLayers, Conv2dWithoutAnInputGradientStillGivesItsWeightGradients) {
  const Tensor x = random_tensor({2, 3, 6, 6}, 39, "x"), dy = random_tensor({2, 4, 6, 6}, 40, "dy");
  for (bool defer : {false, true}) {
    nn::Conv2d with("conv", 3, 4, 3, {.padding = 1, .seed = 3});
    nn::Conv2d without("conv", 3, 4, 3, {.padding = 1, .seed = 3, .input_grad = false});
    nn::Context a(1), b(1);
    a.defer_weight_grads = b.defer_weight_grads = defer;
    with.forward(a, x);
    without.forward(b, x);
    const Tensor dx = with.backward(a, dy);
    const Tensor none = without.backward(b, dy);
    EXPECT_EQ(dx.numel(), x.numel());
    EXPECT_EQ(none.numel(), 0) << "defer " << defer;
    if (defer) {
      a.run_deferred();
      b.run_deferred();
    }
    EXPECT_EQ(max_abs_diff(with.weight.grad, without.weight.grad), 0.0f) << "defer " << defer;
    EXPECT_EQ(max_abs_diff(with.bias.grad, without.bias.grad), 0.0f) << "defer " << defer;
    EXPECT_GT(max_abs_diff(without.weight.grad, Tensor::zeros(without.weight.grad.shape())), 0.0f);
  }
}

TEST(CnnLayers, Conv2dRefusesInputsThatDoNotFit) {
  nn::Conv2d conv("conv", 3, 4, 3);
  nn::Context ctx(1, false);
  EXPECT_THROW(conv.forward(ctx, Tensor({2, 2, 5, 5})), std::invalid_argument);  // channels
  EXPECT_THROW(conv.forward(ctx, Tensor({2, 3, 2, 2})), std::invalid_argument);  // smaller than the kernel
  EXPECT_THROW(conv.forward(ctx, Tensor({3, 5, 5})), std::invalid_argument);     // not NCHW
}

// Flatten copies: writing into its output (as a residual add would) leaves its input alone.
TEST(CnnLayers, FlattenOutputIsItsOwn) {
  nn::Flatten flat;
  Tensor x = random_tensor({2, 3, 2, 2}, 38, "x");
  const Tensor x0 = x.clone();
  nn::Context ctx(1, true);
  Tensor y = flat.forward(ctx, x);
  y.fill(7.0f);
  EXPECT_EQ(max_abs_diff(x, x0), 0.0f);
  flat.backward(ctx, y);
}
