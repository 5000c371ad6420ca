// The CNNs through the trainer (model/cnn.h, data/images.h): every layout reproduces the
// single-rank loss curve (synchronised batch norm, micro-batches cut alike at every layout),
// checkpoints carry the batch-norm running statistics and resume at another layout on the
// uninterrupted curve, --data-order sequential reads the file order at every layout, and an
// image model refuses what it cannot take with a sentence.
// The images are a small synthetic IDX data set (bar_images in tests/data/idx_files.h, so the
// test does not need the Fashion-MNIST package): each class a bar at its own row over noise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cnn_runs.h"
#include "data/idx_files.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/data/idx.h"
#include "meshtrain/data/images.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/trace/trace.h"
#include "meshtrain/train/swimlane.h"
#include "meshtrain/train/trainer.h"
#include "temp_dir.h"

using namespace meshtrain;
namespace fs = std::filesystem;

using meshtrain::testing::expect_same_curve;
using meshtrain::testing::losses;
using meshtrain::testing::max_rel;

namespace {

train::TrainOptions options(const std::string& model, int dp, int pp, int zero, const std::string& schedule = "1f1b") {
  return meshtrain::testing::cnn_options(model, dp, pp, zero, schedule);
}

}  // namespace

using Layout = std::tuple<int, int, int, std::string>;  // dp, pp, zero, schedule

class CnnLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(CnnLayouts, EveryLayoutReproducesTheSingleRankCurve) {
  const std::string model = GetParam();
  const train::TrainResult one = train::train(options(model, 1, 1, 0));
  const std::vector<float> want = losses(one);
  ASSERT_EQ(want.size(), 30u);
  // The round-off band: the same single-rank run with two kernel threads.
  train::TrainOptions two = options(model, 1, 1, 0);
  two.threads = 2;
  const double band = max_rel(want, losses(train::train(two)));
  std::printf("%s: one rank, 1 against 2 threads, drifts %.1e over 30 steps\n", model.c_str(), band);
  ASSERT_TRUE(one.steps.back().accuracy.has_value());
  ASSERT_TRUE(one.final_val_accuracy.has_value());
  const std::vector<Layout> layouts = {{2, 1, 0, "1f1b"}, {4, 1, 3, "1f1b"}, {1, 2, 0, "gpipe"},
                                       {1, 2, 0, "1f1b"}, {2, 2, 1, "1f1b"}};
  for (const auto& [dp, pp, zero, schedule] : layouts) {
    const std::string what = model + " dp " + std::to_string(dp) + " pp " + std::to_string(pp) + " zero " +
                             std::to_string(zero) + " " + schedule;
    const train::TrainResult r = train::train(options(model, dp, pp, zero, schedule));
    // Pipelines alone split no sum: bit for bit. Data parallelism splits the batch's sums:
    // 1e-5 for 5 steps, 1e-4 after (measured at most 2.1e-5, inception-small dp 2).
    expect_same_curve(want, losses(r), what, /*strict=*/dp == 1 ? 30 : 5, dp == 1 ? 0.0 : 1e-4);
    if (dp == 1) {
      EXPECT_EQ(losses(r), want) << what;
    }
    std::printf("%s: %.1e\n", what.c_str(), max_rel(want, losses(r)));
    ASSERT_TRUE(r.final_val_loss && one.final_val_loss);
    EXPECT_LT(std::fabs(*r.final_val_loss - *one.final_val_loss) / *one.final_val_loss, 1e-4) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Named, CnnLayouts, meshtrain::testing::named_cnns(), meshtrain::testing::cnn_test_name);

// Exact gradient sums (--exact-sums 4: every micro-batch of 8 rows as 4 slices of 2): data
// parallelism no longer splits a float32 sum differently from one rank, so every layout holds
// 1e-5 for all 30 steps with every optimizer, AdamW included, whose sign-like step turns the
// plain sums' round-off into different steps (measured without exact sums: resnet-small AdamW
// at dp 4 ZeRO-3 1.4e-4; with them every layout within 1.2e-7, the last bit of a loss).
class CnnExactSums : public ::testing::TestWithParam<std::string> {};

TEST_P(CnnExactSums, EveryOptimizerAtEveryLayoutStaysOnTheSingleRankCurve) {
  const std::string model = GetParam();
  for (const std::string kind : {"adamw", "sgd", "lamb"}) {
    auto with = [&](int dp, int pp, int zero, const std::string& schedule) {
      train::TrainOptions o = options(model, dp, pp, zero, schedule);
      o.exact_sums = 4;
      o.optim.kind = train::parse_optimizer(kind);
      if (kind != "sgd") o.optim.lr = 1e-3f;
      return o;
    };
    const std::vector<float> want = losses(train::train(with(1, 1, 0, "1f1b")));
    ASSERT_EQ(want.size(), 30u);
    EXPECT_LT(*std::min_element(want.begin() + 20, want.end()), want.front()) << model << " " << kind << " learns";
    // Every layout of CnnLayouts.
    const std::vector<Layout> layouts = {{2, 1, 0, "1f1b"}, {4, 1, 3, "1f1b"}, {1, 2, 0, "gpipe"}, {1, 2, 0, "1f1b"},
                                         {2, 2, 1, "1f1b"}};
    for (const auto& [dp, pp, zero, schedule] : layouts) {
      const std::string what = model + " " + kind + " dp " + std::to_string(dp) + " pp " + std::to_string(pp) +
                               " zero " + std::to_string(zero) + " " + schedule;
      const std::vector<float> got = losses(train::train(with(dp, pp, zero, schedule)));
      expect_same_curve(want, got, what);
      std::printf("%s: %.1e\n", what.c_str(), max_rel(want, got));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Named, CnnExactSums, meshtrain::testing::named_cnns(), meshtrain::testing::cnn_test_name);

// The trace's kernels track: every convolution call of every training step, forward and
// backward (under a zero-bubble schedule its input and weight gradients apart), each inside a
// forward or backward span of its rank's compute track; the swimlane draws no lane for it.
TEST(CnnTrace, EveryConvolutionCallIsAKernelSpanInsideItsComputeSpan) {
  meshtrain::testing::TempDir tmp("cnn_trace");
  for (const std::string schedule : {"1f1b", "zb"}) {
    train::TrainOptions o = options("cnn-small", 1, 2, 0, schedule);  // conv1 on stage 0, conv2 on stage 1 or 0
    o.steps = 3;
    o.trace = tmp.file("t_" + schedule + ".json");
    train::train(o);
    const std::vector<trace::Event> events = train::read_chrome_trace(o.trace);
    std::map<std::string, int> calls;
    for (const trace::Event& k : events) {
      if (k.track != trace::Track::kernels) continue;
      ++calls[k.name];
      const bool inside = std::any_of(events.begin(), events.end(), [&](const trace::Event& c) {
        return c.track == trace::Track::compute && c.rank == k.rank && c.t0_us <= k.t0_us && k.t1_us <= c.t1_us &&
               c.category != "optimizer";
      });
      EXPECT_TRUE(inside) << schedule << ": " << k.name << " on rank " << k.rank << " at " << k.t0_us;
    }
    const int per_kind = 2 * 3 * 2;  // 2 convolutions, 3 steps, 2 micro-batches
    EXPECT_EQ(calls["conv2d forward"], per_kind) << schedule;
    if (schedule == "zb") {
      // conv1 takes no input gradient (the images'): its I has no kernel call, its W one.
      EXPECT_EQ(calls["conv2d input gradient"], per_kind / 2) << schedule;
      EXPECT_EQ(calls["conv2d weight gradient"], per_kind) << schedule;
    } else {
      EXPECT_EQ(calls["conv2d backward"], per_kind) << schedule;
    }
    for (const std::string& lane : train::measured_swimlane(events, "t").lanes)
      EXPECT_TRUE(lane.find("rank ") == 0 && (lane.size() == 6 || lane.ends_with(" comm"))) << lane;
  }
}

// --data-order sequential: the file order (images 0..15 at step 0, 16..31 at step 1, ...), at
// every layout the same curve, and a curve of its own (not the default order's).
TEST(CnnDataOrder, SequentialReadsTheFileOrderAtEveryLayout) {
  auto o = options("cnn-small", 1, 1, 0);
  o.data_order = train::DataOrder::sequential;
  o.steps = 40;  // 512 images at B=16: past the end of the file at step 32, so it wraps
  const std::vector<float> want = losses(train::train(o));
  auto r = options("cnn-small", 1, 1, 0);
  r.steps = 40;
  EXPECT_NE(losses(train::train(r)), want) << "the default order is not the file order";
  for (auto [dp, pp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    auto l = options("cnn-small", dp, pp, 0);
    l.data_order = train::DataOrder::sequential;
    l.steps = 40;
    expect_same_curve(want, losses(train::train(l)), "sequential dp " + std::to_string(dp) + " pp " + std::to_string(pp));
  }
}

// Saved at pp 2 x dp 2, resumed at dp 1 and at pp 2: on the uninterrupted curve, with the
// batch-norm running statistics in the checkpoint (the evaluation after the resume uses them).
TEST(CnnCheckpoints, SavedAtPipelineAndDataParallelResumesAtOtherLayouts) {
  meshtrain::testing::TempDir tmp("cnn_ckpt");
  const train::TrainResult whole = train::train(options("resnet-small", 1, 1, 0));
  const std::string dir = tmp.file("ck");
  train::TrainOptions first = options("resnet-small", 2, 2, 0);
  first.steps = 3;
  first.optim.decay_steps = 30;
  first.checkpoint_dir = dir;
  first.checkpoint_every = 3;
  train::train(first);
  const train::CheckpointIndex ck = train::open_checkpoint(dir);
  ASSERT_NE(ck.find("bn1.running_mean"), nullptr);
  ASSERT_NE(ck.find("layer2.0.downsample.1.running_var"), nullptr);
  for (auto [dp, pp] : {std::pair{1, 1}, std::pair{1, 2}}) {
    const std::string copy = tmp.file("ck_" + std::to_string(dp) + "_" + std::to_string(pp));
    fs::copy(dir, copy, fs::copy_options::recursive);
    train::TrainOptions second = options("resnet-small", dp, pp, 0);
    second.checkpoint_dir = copy;
    second.resume = true;
    const train::TrainResult r = train::train(second);
    ASSERT_EQ(r.start_step, 3);
    const std::vector<float> all = losses(whole);
    const std::vector<float> tail(all.begin() + 3, all.end());
    expect_same_curve(tail, losses(r), "resumed at dp " + std::to_string(dp) + " pp " + std::to_string(pp),
                      /*strict=*/5, 2.5e-4);
    ASSERT_TRUE(r.final_val_loss);
    EXPECT_LT(std::fabs(*r.final_val_loss - *whole.final_val_loss) / *whole.final_val_loss, 1e-3);
  }
}

// Resumed at the layout that saved: bit for bit.
TEST(CnnCheckpoints, ResumeAtTheSameLayoutIsBitExact) {
  meshtrain::testing::TempDir tmp("cnn_resume");
  const train::TrainResult whole = train::train(options("cnn-small", 2, 1, 0));
  train::TrainOptions first = options("cnn-small", 2, 1, 0);
  first.steps = 4;
  first.optim.decay_steps = 30;
  first.checkpoint_dir = tmp.file("ck");
  first.checkpoint_every = 2;
  train::train(first);
  train::TrainOptions second = options("cnn-small", 2, 1, 0);
  second.checkpoint_dir = tmp.file("ck");
  second.resume = true;
  const train::TrainResult r = train::train(second);
  ASSERT_EQ(r.start_step, 4);
  for (size_t i = 0; i < r.steps.size(); ++i) EXPECT_EQ(r.steps[i].loss, whole.steps[4 + i].loss) << i;
  EXPECT_EQ(*r.final_val_loss, *whole.final_val_loss);
}

TEST(CnnOptions, WhatAnImageModelCannotTakeIsRefusedWithASentence) {
  auto refusal = [](train::TrainOptions o) -> std::string {
    try {
      train::train(o);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  // The run is refused with a message that holds `sentence`.
  auto refused_with = [&](const train::TrainOptions& o, const std::string& sentence) {
    const std::string r = refusal(o);
    EXPECT_NE(r.find(sentence), std::string::npos) << r;
  };
  auto o = options("cnn-small", 1, 1, 0);
  o.tp = 3;  // cnn-small splits 32 filters of conv1 and 32 input channels of conv2
  refused_with(o, "--tp 3 cannot split cnn-small's convolutions: conv1 (32 output channels) do not divide "
                  "by 3; --tp 2, 4, 8, 16, 32 divide every split channel count");
  o = options("cnn-small", 1, 1, 0);
  o.seq = 8;
  refused_with(o, "--seq is the sequence length of token models");
  o = options("cnn-small", 1, 4, 0);  // cnn-small has 3 units
  o.microbatches = 4;
  refused_with(o, "has 3 units to cut between pipeline stages, fewer than the 4");
  meshtrain::testing::TempDir tmp("cnn_text");
  const std::string text = tmp.file("corpus.txt");
  meshtrain::testing::write_plain(text, std::string(5000, 'a'));
  o = options("cnn-small", 1, 1, 0);
  o.data = text;
  refused_with(o, "cnn-small is an image model: --data " + text + " is a file");
  o = options("cnn-small", 1, 1, 0);
  o.data_order = train::DataOrder::sequential;
  o.augment = true;
  refused_with(o, "cnn-small is an image model: --augment crops and flips by meshtrain's own draws");
  auto g = options("gpt-tiny", 1, 1, 0);
  g.seq = 16;
  refused_with(g, "gpt-tiny is a token model: --data " + g.data + " is a directory");
  // --exact-sums: slices the ranks divide, micro-batches the slices divide, no intra-layer split.
  o = options("cnn-small", 2, 1, 0);  // 8 rows a micro-batch
  o.exact_sums = 3;
  refused_with(o, "--exact-sums 3 slices do not split over --dp 2 ranks; use a multiple of 2");
  o.exact_sums = 16;
  refused_with(o, "a micro-batch of 8 rows (--batch / --microbatches) does not make --exact-sums 16 equal "
                  "slices; use a divisor of 8");
  o = options("cnn-small", 1, 1, 0);
  o.tp = 2;
  o.exact_sums = 2;
  refused_with(o, "--exact-sums makes the sums of data parallelism and of branch joins exact; --tp adds "
                  "sums of its own");
  g = options("gpt-tiny", 1, 1, 0);
  g.data = text;
  g.seq = 16;
  g.exact_sums = 2;
  refused_with(g, "--exact-sums slices the parameter gradients of convolutional networks' layers; "
                  "gpt-tiny is a transformer");
}

// SGD (momentum, Nesterov) and LAMB over the layouts that slice their state: the single-rank
// curve at dp 2 ZeRO-2 and pp 2 x dp 2 ZeRO-1.
TEST(CnnOptimizers, EachOptimizerReproducesTheSingleRankCurve) {
  for (const std::string& kind : {std::string("sgd"), std::string("lamb")}) {
    auto with = [&](train::TrainOptions o) {
      o.optim.kind = train::parse_optimizer(kind);
      if (kind == "sgd") o.optim.momentum = 0.9f, o.optim.nesterov = true, o.optim.lr = 0.02f;
      o.steps = 12;
      return o;
    };
    const std::vector<float> want = losses(train::train(with(options("cnn-small", 1, 1, 0))));
    EXPECT_LT(want.back(), want.front()) << kind;
    for (auto [dp, pp, zero] : {std::tuple{2, 1, 2}, std::tuple{2, 2, 1}})
      expect_same_curve(want, losses(train::train(with(options("cnn-small", dp, pp, zero)))),
                        kind + " dp " + std::to_string(dp) + " pp " + std::to_string(pp) + " zero " + std::to_string(zero));
  }
}
