// The gradient noise scale under data parallelism (train/noise_scale.h): the trainer's one-step
// estimates of |G|^2 and tr(Sigma) against a brute force from per-sample gradients (one forward
// and backward per row of the same batch at the same weights, computed here in float64 sums),
// the smoothing, efficiency and goodput against their definitions, the same estimates under
// ZeRO, tensor parallelism and (an image model's) pipeline stages, the fields only where dp > 1,
// and the losses untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cnn_runs.h"
#include "meshtrain/data/data.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/nn/context.h"
#include "meshtrain/train/trainer.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

fs::path corpus_path() {
  static const fs::path p = [] {
    fs::path dir = fs::temp_directory_path() / ("meshtrain_noise_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const char* words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "a ", "lazy ",
                           "dog. ", "and ", "runs ", "away ", "from ", "it\n"};
    std::string text;
    uint32_t s = 7;
    while (text.size() < 60000) {
      s = s * 1103515245u + 12345u;
      text += words[(s >> 16) % 14];
    }
    fs::path f = dir / "corpus.txt";
    std::ofstream(f) << text;
    return f;
  }();
  return p;
}

train::TrainOptions options(int dp, int64_t steps) {
  train::TrainOptions o;
  o.config_file.clear();
  o.model = "gpt-tiny";
  o.data = corpus_path().string();
  o.batch = 8;
  o.seq = 64;  // gpt-tiny's own, so the model below is built alike
  o.steps = steps;
  o.dp = dp;
  o.optim.warmup_steps = 2;
  o.eval_every = 0;
  o.eval_batches = 1;
  o.quiet = true;
  o.threads = 1;
  return o;
}

std::vector<nlohmann::json> run(train::TrainOptions o) {
  std::vector<nlohmann::json> lines;
  o.on_step = [&](const nlohmann::json& line) { lines.push_back(line); };
  train::train(o);
  return lines;
}

double rel(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-30); }

}  // namespace

// Step 1's estimates against per-sample gradients at the initial weights: g_i for each of the B
// rows, G_big their mean, G_small(r) the mean of dp rank r's rows, then the estimator's formulas
// written out here.
TEST(NoiseScale, OneStepEqualsPerSampleBruteForce) {
  const int dp = 2;
  train::TrainOptions o = options(dp, 1);
  const std::vector<nlohmann::json> lines = run(o);
  ASSERT_EQ(lines.size(), 1u);
  const nlohmann::json& line = lines[0];
  ASSERT_TRUE(line.contains("grad_sq_estimate")) << line.dump();

  const model::GPTConfig cfg = model::gpt_config("gpt-tiny");
  model::GPT gpt(cfg, o.seed);
  const auto ds = train::TokenDataset::open(o.data, o.val_fraction, o.seq);
  const int64_t B = o.batch, T = o.seq, b = B / dp;
  std::vector<nn::Param*> params = gpt.params();
  std::vector<std::vector<double>> g(static_cast<size_t>(B));
  double loss = 0;
  for (int64_t i = 0; i < B; ++i) {
    std::vector<int32_t> tok(static_cast<size_t>(T)), tgt(static_cast<size_t>(T));
    ds.batch(train::Split::train, o.data_order, o.seed, 0, B, T, i, i + 1, tok.data(), tgt.data());
    gpt.zero_grad();
    nn::Context ctx(1, true);
    loss += gpt.forward(ctx, tok.data(), tgt.data(), 1, T) / static_cast<double>(B);
    gpt.backward(ctx, 1.0f);
    for (nn::Param* p : params)
      for (int64_t j = 0; j < p->grad.numel(); ++j) g[i].push_back(p->grad.data()[j]);
  }
  // The same weights and rows as the trainer's step 1.
  EXPECT_NEAR(line["loss"].get<double>(), loss, 1e-5);

  const size_t n = g[0].size();
  auto sq_of_mean = [&](int64_t lo, int64_t hi) {
    double s = 0;
    for (size_t k = 0; k < n; ++k) {
      double m = 0;
      for (int64_t i = lo; i < hi; ++i) m += g[i][k];
      m /= static_cast<double>(hi - lo);
      s += m * m;
    }
    return s;
  };
  const double big = sq_of_mean(0, B);
  double small = 0;
  for (int r = 0; r < dp; ++r) small += sq_of_mean(r * b, (r + 1) * b) / dp;
  const double want_g2 = (B * big - b * small) / static_cast<double>(B - b);
  const double want_trace = (small - big) / (1.0 / b - 1.0 / B);
  // The exact per-sample variance, for the record (the estimator is unbiased, not equal to it).
  double var = 0;
  for (size_t k = 0; k < n; ++k) {
    double m = 0;
    for (int64_t i = 0; i < B; ++i) m += g[i][k];
    m /= static_cast<double>(B);
    for (int64_t i = 0; i < B; ++i) var += (g[i][k] - m) * (g[i][k] - m) / static_cast<double>(B - 1);
  }
  std::printf("|G_big|^2 %.6g, mean |G_small|^2 %.6g -> |G|^2 %.6g (trainer %.6g), tr(Sigma) %.6g (trainer %.6g); "
              "per-sample tr(Sigma) %.6g\n",
              big, small, want_g2, line["grad_sq_estimate"].get<double>(), want_trace,
              line["grad_trace_estimate"].get<double>(), var);
  EXPECT_LT(rel(line["grad_norm"].get<double>() * line["grad_norm"].get<double>(), big), 1e-4);
  EXPECT_LT(rel(line["grad_sq_estimate"].get<double>(), want_g2), 1e-4);
  EXPECT_LT(rel(line["grad_trace_estimate"].get<double>(), want_trace), 1e-4);
}

// Over several steps: the noise scale is the ratio of the bias-corrected moving averages
// (weight 0.95) of the per-step estimates, the efficiency Pollux's against one rank's batch,
// goodput samples per second times it; the losses are those of one rank.
TEST(NoiseScale, SmoothingEfficiencyGoodputAndLosses) {
  const int64_t steps = 6;
  const auto one = run(options(1, steps));
  const auto two = run(options(2, steps));
  ASSERT_EQ(one.size(), static_cast<size_t>(steps));
  ASSERT_EQ(two.size(), static_cast<size_t>(steps));
  const double B = 8, b0 = 4, theta = 0.95;
  double g2 = 0, tr = 0, w = 0;
  for (int64_t s = 0; s < steps; ++s) {
    for (const char* f : {"grad_sq_estimate", "grad_trace_estimate", "grad_noise_scale", "stat_efficiency", "goodput"})
      EXPECT_FALSE(one[s].contains(f)) << f << " at dp 1";
    EXPECT_NEAR(two[s]["loss"].get<double>(), one[s]["loss"].get<double>(), 1e-5) << "step " << s + 1;
    ASSERT_TRUE(two[s].contains("grad_sq_estimate"));
    g2 = theta * g2 + (1 - theta) * two[s]["grad_sq_estimate"].get<double>();
    tr = theta * tr + (1 - theta) * two[s]["grad_trace_estimate"].get<double>();
    w = theta * w + (1 - theta);
    if (g2 <= 0 || tr < 0) {
      EXPECT_FALSE(two[s].contains("grad_noise_scale"));
      continue;
    }
    ASSERT_TRUE(two[s].contains("grad_noise_scale")) << "step " << s + 1;
    const double noise = (tr / w) / (g2 / w);
    EXPECT_LT(rel(two[s]["grad_noise_scale"].get<double>(), noise), 1e-9);
    const double e = (noise + b0) / (noise + B);
    EXPECT_LT(rel(two[s]["stat_efficiency"].get<double>(), e), 1e-9);
    EXPECT_LT(rel(two[s]["goodput"].get<double>(), B / (two[s]["step_ms"].get<double>() / 1e3) * e), 1e-6);
  }
}

// The whole model's norms under ZeRO-2 (reduce-scatter) and tensor parallelism: the same
// estimates as plain dp 2. A token table tied across pipeline stages leaves the fields out.
TEST(NoiseScale, SameUnderZeroAndTensorParallel) {
  const auto plain = run(options(2, 1));
  auto zero = options(2, 1);
  zero.zero = 2;
  auto tp = options(2, 1);
  tp.tp = 2, tp.zero = 1;
  for (const auto& o : {zero, tp}) {
    const auto got = run(o);
    ASSERT_EQ(got.size(), 1u);
    for (const char* f : {"grad_sq_estimate", "grad_trace_estimate"})
      EXPECT_LT(rel(got[0][f].get<double>(), plain[0][f].get<double>()), 1e-4) << f << " zero " << o.zero << " tp " << o.tp;
  }
  auto pp = options(2, 1);
  pp.pp = 2;
  const auto piped = run(pp);
  ASSERT_EQ(piped.size(), 1u);
  EXPECT_FALSE(piped[0].contains("grad_noise_scale"));
  EXPECT_FALSE(piped[0].contains("grad_sq_estimate"));
}

// An image model (batch norm synchronised over dp) split into pipeline stages: each stage's
// squares summed over pp give the estimates of the unsplit model at the same dp.
TEST(NoiseScale, ImageModelSameOverPipelineStages) {
  std::vector<nlohmann::json> got[2];
  for (int pp : {1, 2}) {
    train::TrainOptions o = meshtrain::testing::cnn_options("resnet-small", 2, pp, 0);
    o.steps = 2;
    got[pp - 1] = run(o);
    ASSERT_EQ(got[pp - 1].size(), 2u);
  }
  for (size_t s = 0; s < 2; ++s) {
    for (const char* f : {"grad_sq_estimate", "grad_trace_estimate"})
      EXPECT_LT(rel(got[1][s][f].get<double>(), got[0][s][f].get<double>()), 1e-4) << f << " step " << s + 1;
    EXPECT_TRUE(got[1][s].contains("images_per_s"));
  }
}
