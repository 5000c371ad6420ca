// The optimizers of optim/optimizer.h against hand computations in double: three steps of AdamW,
// SGD (momentum, Nesterov, none) and LAMB over a weight that decays and a bias that does not,
// with the gradient clipped on some steps and the learning rate following its schedule; LAMB's
// trust ratio taken over the whole tensor when its parts are reduced through the hook; the
// step schedule; a non-finite norm applies nothing; the state each optimizer names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/nn/param.h"
#include "meshtrain/optim/optimizer.h"

using namespace meshtrain;
using train::OptimizerConfig;
using train::OptimizerKind;

namespace {

// A weight (decays) and a bias (does not), and the gradient of each step.
struct Problem {
  std::vector<double> w0 = {0.5, -1.25, 2.0, 0.75}, b0 = {0.1, -0.2, 0.3};
  // Step t's gradients: the bases times (1 + t), sign flipping on odd steps, so the norm grows
  // past the clip from step 1 on.
  std::vector<double> gw = {0.3, -0.6, 0.9, 0.15}, gb = {-0.4, 0.2, 0.05};
  double grad(const std::vector<double>& base, size_t i, int t) const {
    return base[i] * (1 + t) * (t % 2 ? -1.0 : 1.0);
  }
};

OptimizerConfig config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = 0.1f;
  c.warmup_steps = 0;
  c.schedule = train::LrSchedule::step;  // lr: 0.1, 0.1, 0.05
  c.step_every = 2;
  c.step_gamma = 0.5f;
  c.grad_clip = 1.5f;
  c.weight_decay = 0.2f;
  c.beta1 = 0.8f, c.beta2 = 0.9f, c.eps = 1e-6f;
  c.momentum = 0.7f;
  return c;
}

double lr_of(int t) { return t < 2 ? 0.1 : 0.05; }

// The reference's per-step common part: the clipping scale of step t's gradients.
double clip_scale(const Problem& pr, int t, double clip) {
  double sq = 0;
  for (size_t i = 0; i < pr.gw.size(); ++i) sq += std::pow(pr.grad(pr.gw, i, t), 2);
  for (size_t i = 0; i < pr.gb.size(); ++i) sq += std::pow(pr.grad(pr.gb, i, t), 2);
  const double norm = std::sqrt(sq);
  return norm > clip ? clip / norm : 1.0;
}

// The problem's two parameters after `steps` steps of an optimizer of `c`, and the optimizer.
struct Run {
  nn::Param w{"w", {4}}, b{"b", {3}, {}, /*decay=*/false};
  std::unique_ptr<train::Optimizer> opt;
  std::vector<float> wv() const { return {w.value.data(), w.value.data() + 4}; }
  std::vector<float> bv() const { return {b.value.data(), b.value.data() + 3}; }
};

std::unique_ptr<Run> run(const OptimizerConfig& c, int steps) {
  const Problem pr;
  auto r = std::make_unique<Run>();
  for (size_t i = 0; i < 4; ++i) r->w.value.data()[i] = static_cast<float>(pr.w0[i]);
  for (size_t i = 0; i < 3; ++i) r->b.value.data()[i] = static_cast<float>(pr.b0[i]);
  r->opt = train::make_optimizer({&r->w, &r->b}, c, 1);
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < 4; ++i) r->w.grad.data()[i] = static_cast<float>(pr.grad(pr.gw, i, t));
    for (size_t i = 0; i < 3; ++i) r->b.grad.data()[i] = static_cast<float>(pr.grad(pr.gb, i, t));
    r->opt->step(t);
  }
  return r;
}

void expect_near(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 2e-6 * std::max(1.0, std::fabs(want[i]))) << what << " element " << i;
}

// SGD in double, PyTorch's rule (L2 decay in the gradient, b = mu b + g, Nesterov g + mu b).
void sgd_reference(const Problem& pr, const OptimizerConfig& c, int steps, std::vector<double>& w,
                   std::vector<double>& b) {
  w = pr.w0, b = pr.b0;
  std::vector<double> mw(w.size(), 0.0), mb(b.size(), 0.0);
  for (int t = 0; t < steps; ++t) {
    const double s = clip_scale(pr, t, c.grad_clip), lr = lr_of(t), mu = c.momentum;
    auto update = [&](std::vector<double>& p, std::vector<double>& m, const std::vector<double>& base, double wd) {
      for (size_t i = 0; i < p.size(); ++i) {
        const double g = s * pr.grad(base, i, t) + wd * p[i];
        m[i] = mu * m[i] + g;
        const double d = mu == 0 ? g : c.nesterov ? g + mu * m[i] : m[i];
        p[i] -= lr * d;
      }
    };
    update(w, mw, pr.gw, *c.weight_decay);
    update(b, mb, pr.gb, 0.0);
  }
}

// Adam's moments and u = m_hat / (sqrt(v_hat) + eps) + wd p in double; AdamW steps by lr u,
// LAMB by lr ||p|| / ||u|| u on the weight (the bias keeps ratio 1).
void adam_reference(const Problem& pr, const OptimizerConfig& c, bool lamb, int steps, std::vector<double>& w,
                    std::vector<double>& b) {
  w = pr.w0, b = pr.b0;
  std::vector<double> mw(4, 0.0), vw(4, 0.0), mb(3, 0.0), vb(3, 0.0);
  const double b1 = c.beta1, b2 = c.beta2, eps = c.eps;
  for (int t = 0; t < steps; ++t) {
    const double s = clip_scale(pr, t, c.grad_clip), lr = lr_of(t);
    const double bc1 = 1 - std::pow(b1, t + 1), bc2 = 1 - std::pow(b2, t + 1);
    auto update = [&](std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                      const std::vector<double>& base, double wd, bool adapt) {
      std::vector<double> u(p.size());
      double pn = 0, un = 0;
      for (size_t i = 0; i < p.size(); ++i) {
        const double g = s * pr.grad(base, i, t);
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        u[i] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wd * p[i];
        pn += p[i] * p[i], un += u[i] * u[i];
      }
      const double ratio = adapt ? std::sqrt(pn) / std::sqrt(un) : 1.0;
      for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * ratio * u[i];
    };
    update(w, mw, vw, pr.gw, *c.weight_decay, lamb);
    update(b, mb, vb, pr.gb, 0.0, false);
  }
}

}  // namespace

TEST(Optimizers, AdamWMatchesAHandComputation) {
  const OptimizerConfig c = config(OptimizerKind::adamw);
  std::vector<double> w, b;
  for (int steps : {1, 2, 3}) {
    const auto r = run(c, steps);
    adam_reference(Problem{}, c, /*lamb=*/false, steps, w, b);
    expect_near(r->wv(), w, "AdamW weight after " + std::to_string(steps));
    expect_near(r->bv(), b, "AdamW bias after " + std::to_string(steps));
  }
}

TEST(Optimizers, SGDMatchesAHandComputationWithMomentumNesterovOrNeither) {
  for (int variant = 0; variant < 3; ++variant) {
    OptimizerConfig c = config(OptimizerKind::sgd);
    if (variant == 1) c.nesterov = true;
    if (variant == 2) c.momentum = 0;
    const std::string what = variant == 0 ? "momentum" : variant == 1 ? "Nesterov" : "no momentum";
    std::vector<double> w, b;
    for (int steps : {1, 2, 3}) {
      const auto r = run(c, steps);
      sgd_reference(Problem{}, c, steps, w, b);
      expect_near(r->wv(), w, "SGD (" + what + ") weight after " + std::to_string(steps));
      expect_near(r->bv(), b, "SGD (" + what + ") bias after " + std::to_string(steps));
      EXPECT_EQ(r->opt->updates(), steps);
      EXPECT_EQ(r->opt->state().size(), variant == 2 ? 0u : 1u) << what;
    }
  }
}

TEST(Optimizers, LAMBMatchesAHandComputation) {
  const OptimizerConfig c = config(OptimizerKind::lamb);
  std::vector<double> w, b;
  for (int steps : {1, 2, 3}) {
    const auto r = run(c, steps);
    adam_reference(Problem{}, c, /*lamb=*/true, steps, w, b);
    expect_near(r->wv(), w, "LAMB weight after " + std::to_string(steps));
    expect_near(r->bv(), b, "LAMB bias after " + std::to_string(steps));
    const auto& ratios = static_cast<const train::LAMB&>(*r->opt).trust_ratios();
    EXPECT_NE(ratios[0], 1.0) << "the weight is adapted";
    EXPECT_EQ(ratios[1], 1.0) << "the bias is not";
  }
  // The ratio is what moves LAMB off AdamW: the same moments, another step.
  EXPECT_NE(run(config(OptimizerKind::adamw), 3)->wv(), run(c, 3)->wv());
}

// A tensor cut into parts (ZeRO segments, tensor-parallel shards) gets the trust ratio of the
// whole tensor once the hook sums its parts' squares: the same update as one optimizer over the
// whole tensor. Here one optimizer holds both parts of a weight and the hook adds them.
TEST(Optimizers, LAMBTrustRatioIsTheWholeTensorsThroughTheHook) {
  OptimizerConfig c = config(OptimizerKind::lamb);
  c.grad_clip = 0;
  const std::vector<float> w0 = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f, 1.1f, 0.2f};
  const std::vector<float> g = {0.3f, -0.6f, 0.9f, 0.15f, 0.05f, -0.25f, 0.7f};
  nn::Param whole("w", {7});
  nn::Param lo("w", {3}), hi("w", {4});
  std::copy(w0.begin(), w0.end(), whole.value.data());
  std::copy(w0.begin(), w0.begin() + 3, lo.value.data());
  std::copy(w0.begin() + 3, w0.end(), hi.value.data());
  auto one = train::make_optimizer({&whole}, c, 1);
  auto parts = train::make_optimizer({&lo, &hi}, c, 1);
  int calls = 0;
  parts->set_param_sq_reduce([&](std::span<double> sq, size_t k) {
    ASSERT_EQ(k, 2u);
    ASSERT_EQ(sq.size(), 4u);
    for (size_t j = 0; j < k; ++j) sq[j] = sq[k + j] = sq[j] + sq[k + j];
    ++calls;
  });
  for (int t = 0; t < 3; ++t) {
    std::copy(g.begin(), g.end(), whole.grad.data());
    std::copy(g.begin(), g.begin() + 3, lo.grad.data());
    std::copy(g.begin() + 3, g.end(), hi.grad.data());
    one->step(t);
    parts->step(t);
  }
  EXPECT_EQ(calls, 3);
  for (int i = 0; i < 7; ++i)
    EXPECT_NEAR(whole.value.data()[i], i < 3 ? lo.value.data()[i] : hi.value.data()[i - 3], 1e-7) << i;
}

TEST(Optimizers, ANonFiniteNormAppliesNothing) {
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd, OptimizerKind::lamb}) {
    nn::Param p("w", {4});
    p.value.fill(1.f);
    p.grad.fill(0.5f);
    auto opt = train::make_optimizer({&p}, config(kind), 1);
    bool reduced = false;
    opt->set_param_sq_reduce([&](std::span<double>, size_t) { reduced = true; });
    opt->step(0);
    const std::vector<float> w(p.value.data(), p.value.data() + 4);
    const std::vector<float> s(opt->state()[0].tensors[0].data(), opt->state()[0].tensors[0].data() + 4);
    reduced = false;
    for (float bad : {std::nanf(""), INFINITY}) {
      p.grad.fill(0.5f);
      p.grad.data()[2] = bad;
      EXPECT_FALSE(std::isfinite(opt->step(1))) << to_string(kind);
      EXPECT_EQ(std::vector<float>(p.value.data(), p.value.data() + 4), w) << to_string(kind);
      EXPECT_EQ(std::vector<float>(opt->state()[0].tensors[0].data(), opt->state()[0].tensors[0].data() + 4), s)
          << to_string(kind);
      EXPECT_EQ(opt->updates(), 1) << to_string(kind);
      EXPECT_FALSE(reduced) << to_string(kind) << ": no collective is started on a step that applies nothing";
    }
  }
}

TEST(Optimizers, StateIsNamedByTheOptimizer) {
  nn::Param p("h.0.mlp.c_fc.weight", {2});
  OptimizerConfig c;
  using V = std::vector<std::string>;
  for (auto [kind, momentum, want] : {std::tuple{OptimizerKind::adamw, 0.9f, V{"exp_avg", "exp_avg_sq"}},
                                      std::tuple{OptimizerKind::lamb, 0.9f, V{"exp_avg", "exp_avg_sq"}},
                                      std::tuple{OptimizerKind::sgd, 0.9f, V{"momentum_buffer"}},
                                      std::tuple{OptimizerKind::sgd, 0.0f, V{}}}) {
    c.kind = kind, c.momentum = momentum;
    EXPECT_EQ(train::state_prefixes(c), want) << to_string(kind);
    auto opt = train::make_optimizer({&p}, c, 1);
    EXPECT_EQ(opt->config().kind, kind);
    V names;
    for (const auto& [name, t] : opt->state_tensors()) names.push_back(name);
    V expect;
    for (const std::string& prefix : want) expect.push_back(prefix + ".h.0.mlp.c_fc.weight");
    EXPECT_EQ(names, expect) << to_string(kind);
    EXPECT_EQ(opt->state_bytes(), static_cast<int64_t>(want.size() * 2 * sizeof(float)));
  }
  EXPECT_EQ(train::parse_optimizer("lamb"), OptimizerKind::lamb);
  EXPECT_THROW(train::parse_optimizer("adam"), std::invalid_argument);
  EXPECT_THROW(train::parse_lr_schedule("linear"), std::invalid_argument);
}

TEST(LearningRate, WarmupThenStepDecay) {
  OptimizerConfig c;
  c.lr = 0.1f, c.warmup_steps = 4, c.schedule = train::LrSchedule::step, c.step_every = 10, c.step_gamma = 0.1f;
  EXPECT_FLOAT_EQ(train::lr_at(c, 0), 0.025f);
  EXPECT_FLOAT_EQ(train::lr_at(c, 3), 0.1f);
  EXPECT_FLOAT_EQ(train::lr_at(c, 4), 0.1f);  // counted from the run's start, as StepLR counts
  EXPECT_FLOAT_EQ(train::lr_at(c, 9), 0.1f);
  EXPECT_FLOAT_EQ(train::lr_at(c, 10), 0.01f);
  EXPECT_FLOAT_EQ(train::lr_at(c, 29), 0.001f);
  EXPECT_FLOAT_EQ(train::lr_at(c, 30), 0.0001f);
}
