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

#include "meshtrain/model/config.h"
#include "meshtrain/model/graph.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/plan/cost.h"
#include "meshtrain/train/layout.h"
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
                      std::tuple{2, "interleaved", 4, 2}, std::tuple{2, "1f1b", 1, 1},
                      std::tuple{2, "zb", 4, 1}, std::tuple{4, "zb", 6, 1}, std::tuple{4, "naive", 4, 1}),
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
  o = pp_options(2, "zb", 3);  // split backward with data-parallel buckets and tp layers
  o.dp = 2;
  expect_same_curve(o);
  o = pp_options(2, "zb", 4);
  o.tp = 2, o.sequence_parallel = true;
  expect_same_curve(o);
}

// Stage boundaries off the middle (--pp-balance by hand), and balanced by measured time.
TEST(PipelineLayouts, HandGivenAndProfiledBalance) {
  auto o = pp_options(2, "1f1b", 4);
  o.pp_balance = "3,1";
  expect_same_curve(o);
  o.pp_balance = "profile";
  expect_same_curve(o);
  // The measured costs: every part took time (which split they give depends on the machine's
  // noise; the curve above does not).
  const auto cfg = meshtrain::model::gpt_config("gpt-tiny");
  const train::StageCosts c = train::profile_costs(cfg, 2, 32, 1, 1337);
  ASSERT_EQ(c.blocks.size(), 4u);
  for (double b : c.blocks) EXPECT_GT(b, 0.0);
  EXPECT_GT(c.head, 0.0);
  EXPECT_GT(c.embedding, 0.0);
}

// Checkpoints hold pieces of named logical tensors: saved at pp 2 they resume at pp 1 and the reverse
// (also into an interleaved layout), on the uninterrupted curve.
TEST(PipelineLayouts, CheckpointsCrossLayouts) {
  meshtrain::testing::TempDir tmp("pp_ckpt");
  for (auto [save_pp, resume_pp, chunks] : {std::tuple{2, 1, 1}, std::tuple{1, 2, 2}}) {
    const fs::path dir = tmp.path() / ("ck" + std::to_string(save_pp));
    auto first = pp_options(save_pp, "1f1b", 2);
    first.steps = 10;
    first.optim.decay_steps = 30;
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

namespace {
struct StageFigures {
  std::vector<double> bubble;
  std::vector<int64_t> peak, in_flight;
};
// The first metrics line's per-pipeline-rank figures of a 2-step run.
StageFigures figures(train::TrainOptions o, const std::string& path) {
  o.steps = 2;
  o.metrics = path;
  train::train(o);
  std::ifstream in(o.metrics);
  std::string line;
  std::getline(in, line);
  auto j = nlohmann::json::parse(line);
  return {j.at("bubble").get<std::vector<double>>(), j.at("peak_saved_activation_bytes").get<std::vector<int64_t>>(),
          j.at("microbatches_in_flight").get<std::vector<int64_t>>()};
}
}  // namespace

// Per pipeline rank: the bubble, the micro-batches in flight and the saved activation bytes,
// measured by the executor. GPipe holds all m micro-batches; 1F1B at most pp - rank; with
// --recompute a stage keeps only its input activation (B/m x T x C floats), the first stage
// nothing (its tokens stay in the step's batch).
TEST(PipelineLayouts, MetricsCarryBubbleAndActivationMemoryPerStage) {
  meshtrain::testing::TempDir tmp("pp_metrics");
  const int m = 4;
  auto o = pp_options(2, "gpipe", m);
  const auto gpipe = figures(o, tmp.file("gpipe.jsonl"));
  o.schedule = "1f1b";
  const auto ofob = figures(o, tmp.file("1f1b.jsonl"));
  o.schedule = "gpipe";
  o.recompute = true;
  const auto recompute = figures(o, tmp.file("recompute.jsonl"));
  ASSERT_EQ(gpipe.bubble.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("pp rank " + std::to_string(r));
    EXPECT_GE(gpipe.bubble[r], 0.0);
    EXPECT_LT(gpipe.bubble[r], 1.0);
    EXPECT_EQ(gpipe.in_flight[r], m);
    EXPECT_EQ(ofob.in_flight[r], 2 - r);
    EXPECT_GT(gpipe.peak[r], 0);
    // Both ranks hold two blocks of the same size; 1F1B keeps (2 - r) of GPipe's m micro-batches.
    EXPECT_EQ(ofob.peak[r] * m, gpipe.peak[r] * (2 - r));
  }
  const int64_t input_bytes = int64_t{12 / m} * 32 * 128 * 4;  // (B/m, T, C) floats
  EXPECT_EQ(recompute.peak[0], 0);
  EXPECT_EQ(recompute.peak[1], m * input_bytes);
  EXPECT_LT(recompute.peak[1] * 10, gpipe.peak[1]) << "recomputation keeps a small part of the activations";
}

// Recomputation changes memory, not the curve: every schedule at pp 2 and pp 4 (interleaved at
// pp 2: gpt-tiny's 4 blocks make 4 stages of 2 chunks), and the single rank.
TEST(PipelineLayouts, RecomputeKeepsTheCurve) {
  for (int pp : {2, 4})
    for (const char* schedule : {"naive", "gpipe", "1f1b", "zb"}) {
      auto o = pp_options(pp, schedule, 4);
      o.recompute = true;
      SCOPED_TRACE(std::string("recompute, pp ") + std::to_string(pp) + " " + schedule);
      expect_same_curve(o);
    }
  for (auto [pp, schedule, m, chunks] : {std::tuple{2, "interleaved", 4, 2}, std::tuple{1, "1f1b", 2, 1}}) {
    auto o = pp_options(pp, schedule, m, chunks);
    o.recompute = true;
    expect_same_curve(o);
  }
}

// gpt-small's shapes (6 blocks of d=384, 6 heads), at T=64 to keep the suite short: pp 2 and
// pp 3 (the balancer gives 2 | 2 | 2, the head costing 0.05 of a block) on its own single-rank
// curve.
TEST(PipelineLayouts, GptSmallAtPp2AndPp3) {
  auto base = layout_options(1);
  base.model = "gpt-small";
  base.batch = 6, base.seq = 64, base.steps = 30;
  auto ref = train::train(base);
  ASSERT_EQ(ref.steps.size(), 30u);
  ASSERT_LT(ref.steps.back().loss, ref.steps.front().loss - 0.5f);
  for (auto [pp, schedule] : {std::pair{2, "1f1b"}, std::pair{3, "gpipe"}}) {
    auto o = base;
    o.pp = pp, o.schedule = schedule, o.microbatches = 3;
    auto r = train::train(o);
    ASSERT_EQ(r.steps.size(), ref.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_LT(std::fabs(r.steps[i].loss - ref.steps[i].loss) / ref.steps[i].loss, 1e-5)
          << "gpt-small pp " << pp << " " << schedule << " step " << i;
  }
  auto three = base;
  three.pp = 3;
  EXPECT_EQ(train::stage_layers(three, meshtrain::model::gpt_config("gpt-small")),
            (std::vector<meshtrain::pipeline::LayerSpan>{{0, 2}, {2, 4}, {4, 6}}));
}

// One balancer: the stages train cuts (by FLOPs, its default) are the stages the planner
// predicts with (plan::balance_stages), for every named model and every example graph, at pp 2 to
// 4 and, where the units divide, interleaved with 2 chunks.
TEST(PipelineLayouts, TrainCutsTheStagesThePlannerPredicts) {
  std::vector<std::string> models = meshtrain::model::named_graph_names();
  for (const auto& e : fs::directory_iterator(std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models"))
    models.push_back(e.path().string());
  int compared = 0;
  for (const std::string& name : models) {
    const auto spec = meshtrain::model::model_spec(name);
    for (int pp = 2; pp <= 4; ++pp)
      for (int chunks : {1, 2}) {
        if (spec->num_units() < pp * chunks || (chunks > 1 && spec->num_units() % (pp * chunks) != 0)) continue;
        train::TrainOptions o;
        o.pp = pp, o.chunks = chunks, o.seq = spec->default_seq();
        meshtrain::plan::Layout l;
        l.pp = pp, l.chunks = chunks, l.seq = spec->default_seq();
        const auto trained = spec->gpt() ? train::stage_layers(o, *spec->gpt()) : train::stage_units(o, *spec->cnn());
        EXPECT_EQ(trained, meshtrain::plan::balance_stages(*spec, l)) << name << " pp " << pp << " chunks " << chunks;
        ++compared;
      }
  }
  EXPECT_GE(compared, 20);
}

// --pp-cuts by block name: counts of blocks per stage; a wrong count of names, a layer inside a
// block and names out of order are refused with the flag's name.
TEST(PipelineLayouts, PpCutsNameTheBlocksStagesBeginAt) {
  const auto tiny = meshtrain::model::model_spec("gpt-tiny");
  train::TrainOptions o;
  o.pp = 2, o.pp_cuts = "h.3";
  EXPECT_EQ(train::stage_counts_at(*tiny, o), "3,1");
  o.pp = 3, o.pp_cuts = "h.1.ln_1,h.2";
  EXPECT_EQ(train::stage_counts_at(*tiny, o), "1,1,2");
  auto refusal = [&](int pp, const std::string& cuts) {
    o.pp = pp, o.pp_cuts = cuts;
    try {
      train::stage_counts_at(*tiny, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal(3, "h.2").find("names 1 layer(s), but 3 stages begin at 2 layers"), std::string::npos);
  EXPECT_NE(refusal(2, "h.1.attn").find("no stage of gpt-tiny can begin at 'h.1.attn'; a stage begins at a block"),
            std::string::npos);
  EXPECT_NE(refusal(3, "h.2,h.1").find("'h.1' does not come after the stage before it"), std::string::npos);
  EXPECT_NE(refusal(2, "h.0").find("can begin at 'h.0'"), std::string::npos);
}

// A long skip connection (block 0's output added to block 3's input, gpt-tiny's shapes): across
// stages it travels straight from the first stage to the last (a portal), and every layout
// reproduces the single-rank curve of the same model, which differs from the model without it.
TEST(PipelineLayouts, SkipConnectionAcrossStages) {
  meshtrain::testing::TempDir tmp("pp_skip");
  const std::string config = tmp.file("skip.json");
  std::ofstream(config) << R"({"name": "gpt-tiny-skip", "n_layer": 4, "n_embd": 128, "n_head": 4,
                              "vocab_size": 256, "block_size": 64, "skip_from": 0, "skip_to": 3})";
  auto base = layout_options(1);
  base.config_file = config;
  auto ref = train::train(base);
  const auto& plain = reference_curve();
  ASSERT_EQ(ref.steps.size(), plain.size());
  EXPECT_NE(ref.steps[0].loss, plain[0]) << "the skip connection changes the model";
  EXPECT_LT(ref.steps.back().loss, ref.steps.front().loss - 0.5f);
  struct Layout {
    int pp, tp;
    const char* schedule;
    int m;
    bool recompute;
  };
  for (const Layout& l : {Layout{2, 1, "1f1b", 4, false}, Layout{4, 1, "1f1b", 4, false}, Layout{4, 1, "gpipe", 4, true},
                          Layout{4, 1, "zb", 4, false}, Layout{2, 2, "1f1b", 2, false}}) {
    auto o = base;
    o.pp = l.pp, o.tp = l.tp, o.schedule = l.schedule, o.microbatches = l.m, o.recompute = l.recompute;
    auto r = train::train(o);
    ASSERT_EQ(r.steps.size(), ref.steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_LT(std::fabs(r.steps[i].loss - ref.steps[i].loss) / ref.steps[i].loss, 1e-5)
          << "skip model, pp " << l.pp << " tp " << l.tp << " " << l.schedule << (l.recompute ? " recompute" : "")
          << " step " << i;
  }
}
