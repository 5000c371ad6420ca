// Data parallelism and ZeRO reproduce the single-rank loss curve (DESIGN decision 1): the same
// seed gives the same global batches, the ranks take slices, and gradients are averaged, so
// any dp and ZeRO stage must match the one-rank run to float32 round-off (1e-5 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "meshtrain/train/trainer.h"
#include "layout_fixture.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

train::TrainOptions options(int dp, int zero, int microbatches, int64_t bucket_bytes = 64 * 1024) {
  train::TrainOptions o = meshtrain::testing::layout_options(dp);
  o.zero = zero;
  o.microbatches = microbatches;
  o.bucket_bytes = bucket_bytes;
  return o;
}

const std::vector<float>& reference_curve() {
  static std::vector<float> curve = [] {
    auto r = train::train(options(1, 0, 1));
    std::vector<float> c;
    for (auto& s : r.steps) c.push_back(s.loss);
    return c;
  }();
  return curve;
}

void expect_same_curve(const train::TrainOptions& o) {
  const auto& ref = reference_curve();
  auto r = train::train(o);
  ASSERT_EQ(r.steps.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double rel = std::fabs(r.steps[i].loss - ref[i]) / std::fabs(ref[i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << "dp " << o.dp << " zero " << o.zero << " microbatches "
                         << o.microbatches << ": step " << i << " loss " << r.steps[i].loss
                         << " vs single-rank " << ref[i];
  }
  // The curve must actually move, or equality would prove nothing.
  EXPECT_LT(ref.back(), ref.front() - 0.5f);
}

}  // namespace

class DataParallelParity : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DataParallelParity, MatchesSingleRank) {
  auto [dp, zero] = GetParam();
  expect_same_curve(options(dp, zero, 1));
}

INSTANTIATE_TEST_SUITE_P(DpByZero, DataParallelParity,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_zero" +
                                  std::to_string(std::get<1>(info.param));
                         });

class GradientAccumulationParity : public ::testing::TestWithParam<int> {};

TEST_P(GradientAccumulationParity, MatchesSingleRank) {
  expect_same_curve(options(2, GetParam(), 3));
}

INSTANTIATE_TEST_SUITE_P(Dp2Micro3, GradientAccumulationParity, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

TEST(DataParallel, SingleRankAccumulationAndDefaultBucket) {
  expect_same_curve(options(1, 0, 4));
  expect_same_curve(options(4, 0, 1, 0));  // one default-size bucket
}

TEST(DataParallel, ZeroStateBytesFollowTheFormulas) {
  // Per-rank persistent bytes at dp 4: params, grads, optimizer state (float32 Adam, 4 + 4 + 8
  // bytes per parameter), each divided by dp from its stage on. Uneven slices differ from the
  // exact quotient by less than one element per bucket.
  for (int zero = 0; zero <= 3; ++zero) {
    auto o = options(4, zero, 1);
    o.steps = 1;
    auto r = train::train(o);
    const double n = static_cast<double>(r.config.num_params());
    const double p = 4 * n / (zero >= 3 ? 4 : 1), g = 4 * n / (zero >= 2 ? 4 : 1),
                 s = 8 * n / (zero >= 1 ? 4 : 1);
    EXPECT_NEAR(r.state_bytes.params, p, 0.01 * p) << "zero " << zero;
    EXPECT_NEAR(r.state_bytes.grads, g, 0.01 * g) << "zero " << zero;
    EXPECT_NEAR(r.state_bytes.optimizer, s, 0.01 * s) << "zero " << zero;
  }
}

TEST(DataParallel, BadLayoutsAreRefused) {
  auto o = options(5, 0, 1);  // 12 rows do not split over 5 ranks
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, 0, 4);  // 6 rows per rank do not split into 4 micro-batches
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, 4, 1);
  EXPECT_THROW(train::train(o), std::invalid_argument);
}

// A checkpoint saved at dp 2 with ZeRO-2 resumes at dp 1 (full logical tensors), and the
// resumed curve continues the uninterrupted one.
TEST(DataParallel, CheckpointResumesOnAnotherLayout) {
  fs::path dir = fs::temp_directory_path() / ("meshtrain_dp_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto& ref = reference_curve();
  auto first = options(2, 2, 1);
  first.steps = 10;
  first.adam.decay_steps = 30;
  first.checkpoint_dir = dir.string();
  first.checkpoint_every = 10;
  train::train(first);
  for (auto [dp, zero] : {std::pair{1, 0}, std::pair{4, 3}}) {
    auto second = options(dp, zero, 1);
    second.checkpoint_dir = dir.string();
    second.resume = true;
    auto r = train::train(second);
    ASSERT_EQ(r.start_step, 10);
    ASSERT_EQ(r.steps.size(), 20u);
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_LT(std::fabs(r.steps[i].loss - ref[10 + i]) / ref[10 + i], 1e-5)
          << "dp " << dp << " zero " << zero << " step " << 10 + i;
  }
  fs::remove_all(dir);
}

// ---- tensor parallelism through the trainer (the layers' own parity tests: test_tp_*.cpp) ----

TEST(TrainerLayouts, TensorParallelMatchesSingleRank) {
  for (auto [dp, tp, sp] : {std::tuple{1, 2, false}, std::tuple{1, 4, true}, std::tuple{2, 2, false}}) {
    auto o = options(dp, 0, 1);
    o.tp = tp;
    o.sequence_parallel = sp;
    SCOPED_TRACE("dp " + std::to_string(dp) + " tp " + std::to_string(tp) + (sp ? " sp" : ""));
    expect_same_curve(o);
  }
}

// Saved at tp 2, resumed at dp 2 (and the reverse is the same code path): full logical tensors.
TEST(TrainerLayouts, CheckpointFromTensorParallelResumesOnDataParallel) {
  fs::path dir = fs::temp_directory_path() / ("meshtrain_tp_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto& ref = reference_curve();
  auto first = options(1, 0, 1);
  first.tp = 2;
  first.steps = 10;
  first.adam.decay_steps = 30;
  first.checkpoint_dir = dir.string();
  first.checkpoint_every = 10;
  train::train(first);
  auto second = options(2, 1, 1);
  second.checkpoint_dir = dir.string();
  second.resume = true;
  auto r = train::train(second);
  ASSERT_EQ(r.steps.size(), 20u);
  for (size_t i = 0; i < r.steps.size(); ++i)
    EXPECT_LT(std::fabs(r.steps[i].loss - ref[10 + i]) / ref[10 + i], 1e-5) << "step " << 10 + i;
  fs::remove_all(dir);
}

// A vocabulary tp does not divide (257): refused without --pad-vocab; with it, trained at tp 2
// and saved, the checkpoint holds the (257, C) table and resumes at tp 1 on the single-rank curve.
TEST(TrainerLayouts, PaddedVocabularyTrainsAndResumesAtTp1) {
  fs::path dir = fs::temp_directory_path() / ("meshtrain_pad_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path cfg = dir / "tiny-v257.json";
  std::ofstream(cfg) << R"({"name": "tiny-v257", "n_layer": 4, "n_embd": 128, "n_head": 4,)"
                     << R"( "vocab_size": 257, "block_size": 64})";
  auto base = options(1, 0, 1);
  base.config_file = cfg.string();
  base.steps = 12;
  auto o = base;
  o.tp = 2;
  EXPECT_THROW(train::train(o), std::invalid_argument);  // no --pad-vocab
  const auto ref = train::train(base);  // tp 1: no padding
  auto first = base;
  first.tp = 2;
  first.pad_vocab = true;
  first.steps = 6;
  first.adam.decay_steps = 12;
  first.checkpoint_dir = (dir / "ck").string();
  first.checkpoint_every = 6;
  const auto a = train::train(first);
  auto second = base;
  second.checkpoint_dir = first.checkpoint_dir;
  second.resume = true;
  const auto b = train::train(second);
  ASSERT_EQ(a.steps.size(), 6u);
  ASSERT_EQ(b.start_step, 6);
  ASSERT_EQ(b.steps.size(), 6u);
  for (size_t i = 0; i < 12; ++i) {
    const float got = i < 6 ? a.steps[i].loss : b.steps[i - 6].loss, want = ref.steps[i].loss;
    EXPECT_LT(std::fabs(got - want) / want, 1e-5) << "step " << i;
  }
  fs::remove_all(dir);
}

TEST(TrainerLayouts, ImpossibleTensorParallelLayoutsAreRefused) {
  auto o = options(1, 0, 1);
  o.tp = 3;  // gpt-tiny has 4 heads
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o.tp = 8;  // more ranks than heads
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(1, 0, 1);
  o.sequence_parallel = true;  // needs tp > 1
  EXPECT_THROW(train::train(o), std::invalid_argument);
}
