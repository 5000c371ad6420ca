// Pipeline parallelism through the trainer: every schedule and layout reproduces the single-rank
// loss curve of gpt-tiny (DESIGN decision 1), checkpoints cross between pipeline and
// single-rank layouts, and the metrics carry the pipeline's figures.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "meshtrain/train/trainer.h"
#include "parallel/layout_fixture.h"
#include "temp_dir.h"

namespace train = meshtrain::train;
namespace fs = std::filesystem;
using meshtrain::testing::layout_options;

namespace {

const std::vector<float>& reference_curve() {
  static std::vector<float> curve = [] {
    std::vector<float> c;
    for (auto& s : train::train(layout_options(1)).steps) c.push_back(s.loss);
    return c;
  }();
  return curve;
}

train::TrainOptions pp_options(int pp, const std::string& schedule, int m, int chunks = 1) {
  auto o = layout_options(1);
  o.pp = pp;
  o.schedule = schedule;
  o.microbatches = m;
  o.chunks = chunks;
  return o;
}

std::string describe(const train::TrainOptions& o) {
  return "dp " + std::to_string(o.dp) + " tp " + std::to_string(o.tp) + " pp " + std::to_string(o.pp) + " " +
         o.schedule + " m " + std::to_string(o.microbatches) + " chunks " + std::to_string(o.chunks) +
         (o.sequence_parallel ? " sp" : "");
}

void expect_same_curve(const train::TrainOptions& o, size_t from = 0) {
  const auto& ref = reference_curve();
  auto r = train::train(o);
  ASSERT_EQ(r.steps.size(), ref.size() - from) << describe(o);
  double worst = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const double rel = std::fabs(r.steps[i].loss - ref[from + i]) / std::fabs(ref[from + i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << describe(o) << ": step " << from + i << " loss " << r.steps[i].loss
                         << " vs single-rank " << ref[from + i];
  }
  EXPECT_LT(ref.back(), ref.front() - 0.5f) << "the curve must move, or equality proves nothing";
}

}  // namespace

class PipelineParity : public ::testing::TestWithParam<std::tuple<int, std::string, int, int>> {};

TEST_P(PipelineParity, MatchesSingleRank) {
  auto [pp, schedule, m, chunks] = GetParam();
  expect_same_curve(pp_options(pp, schedule, m, chunks));
}

INSTANTIATE_TEST_SUITE_P(
    GptTiny, PipelineParity,
    ::testing::Values(std::tuple{2, "naive", 3, 1}, std::tuple{2, "gpipe", 4, 1}, std::tuple{2, "1f1b", 4, 1},
                      std::tuple{4, "gpipe", 4, 1}, std::tuple{4, "1f1b", 6, 1}, std::tuple{3, "1f1b", 3, 1},
                      std::tuple{2, "interleaved", 4, 2}, std::tuple{2, "1f1b", 1, 1}),
    [](const auto& info) {
      const std::string& s = std::get<1>(info.param);
      return "pp" + std::to_string(std::get<0>(info.param)) + "_" + (s == "1f1b" ? std::string("onef1b") : s) + "_m" +
             std::to_string(std::get<2>(info.param));
    });

// The pipeline composed with the other axes on the DESIGN mesh.
TEST(PipelineLayouts, WithDataAndTensorParallelism) {
  auto o = pp_options(2, "1f1b", 3);
  o.dp = 2;  // 6 rows per dp rank, 3 micro-batches of 2
  expect_same_curve(o);
  o = pp_options(2, "1f1b", 4);
  o.tp = 2;
  expect_same_curve(o);
  o.sequence_parallel = true;
  expect_same_curve(o);
  o = pp_options(2, "gpipe", 2);
  o.dp = 2, o.tp = 2;  // world 8 = 2 x 2 x 2
  expect_same_curve(o);
}

// Stage boundaries off the middle: --pp-balance.
TEST(PipelineLayouts, HandGivenBalance) {
  auto o = pp_options(2, "1f1b", 4);
  o.pp_balance = "3,1";
  expect_same_curve(o);
}

// Checkpoints hold full logical tensors: saved at pp 2 they resume at pp 1 and the reverse
// (also into an interleaved layout), on the uninterrupted curve.
TEST(PipelineLayouts, CheckpointsCrossLayouts) {
  meshtrain::testing::TempDir tmp("pp_ckpt");
  for (auto [save_pp, resume_pp, chunks] : {std::tuple{2, 1, 1}, std::tuple{1, 2, 2}}) {
    const fs::path dir = tmp.path() / ("ck" + std::to_string(save_pp));
    auto first = pp_options(save_pp, "1f1b", 2);
    first.steps = 10;
    first.adam.decay_steps = 30;
    first.checkpoint_dir = dir.string();
    first.checkpoint_every = 10;
    train::train(first);
    auto second = pp_options(resume_pp, chunks > 1 ? "interleaved" : "1f1b", 2, chunks);
    second.checkpoint_dir = dir.string();
    second.resume = true;
    SCOPED_TRACE("saved at pp " + std::to_string(save_pp) + ", resumed at pp " + std::to_string(resume_pp));
    expect_same_curve(second, 10);
  }
}

TEST(PipelineLayouts, MetricsCarryBubbleAndActivationMemory) {
  meshtrain::testing::TempDir tmp("pp_metrics");
  auto o = pp_options(2, "gpipe", 4);
  o.steps = 3;
  o.metrics = tmp.file("m.jsonl");
  train::train(o);
  std::ifstream in(o.metrics);
  int lines = 0;
  int64_t peak = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("bubble")) << line;
    EXPECT_GE(j["bubble"].get<double>(), 0.0);
    EXPECT_LT(j["bubble"].get<double>(), 1.0);
    EXPECT_EQ(j["microbatches_in_flight"].get<int>(), 4) << "GPipe holds every micro-batch";
    peak = j["peak_saved_activation_bytes"].get<int64_t>();
    EXPECT_GT(peak, 0);
  }
  EXPECT_EQ(lines, 3);
  // 1F1B on rank 0 holds at most 2 micro-batches of the same size: half of GPipe's 4.
  o.schedule = "1f1b";
  o.metrics = tmp.file("m2.jsonl");
  train::train(o);
  std::ifstream in2(o.metrics);
  std::string line;
  std::getline(in2, line);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["microbatches_in_flight"].get<int>(), 2);
  EXPECT_EQ(j["peak_saved_activation_bytes"].get<int64_t>() * 2, peak);
}
