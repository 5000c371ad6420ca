// Convolutions split by filters and channels (--tp with an image model, parallel/tensor/cnn_tp.h)
// through the trainer: tp 2 and 4, dp 2 x tp 2 (with ZeRO-3 too) and pp 2 x tp 2 reproduce the
// single-rank loss curve; the tp bytes of a step are the layout's analytic count; a checkpoint
// saved at tp 2 resumes at one rank and at dp 2 x tp 4 on the uninterrupted curve, and one
// saved at one rank resumes at tp 2.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "cnn_runs.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/parallel/tensor/cnn_tp.h"
#include "meshtrain/train/trainer.h"
#include "temp_dir.h"

using namespace meshtrain;
using meshtrain::testing::cnn_options;
using meshtrain::testing::expect_same_curve;
using meshtrain::testing::losses;
using meshtrain::testing::max_rel;
namespace fs = std::filesystem;

namespace {

train::TrainOptions tp_options(const std::string& model, int dp, int tp, int pp, int zero = 0) {
  train::TrainOptions o = cnn_options(model, dp, pp, zero);
  o.tp = tp;
  return o;
}

}  // namespace

class CnnTpLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(CnnTpLayouts, EveryTensorParallelLayoutReproducesTheSingleRankCurve) {
  const std::string model = GetParam();
  const std::vector<float> want = losses(train::train(cnn_options(model, 1, 1, 0)));
  ASSERT_EQ(want.size(), 30u);
  // dp, tp, pp, zero
  const std::vector<std::tuple<int, int, int, int>> layouts = {{1, 2, 1, 0}, {1, 4, 1, 0}, {2, 2, 1, 0},
                                                               {2, 2, 1, 3}, {1, 2, 2, 0}};
  for (const auto& [dp, tp, pp, zero] : layouts) {
    const std::string what = model + " dp " + std::to_string(dp) + " tp " + std::to_string(tp) + " pp " +
                             std::to_string(pp) + " zero " + std::to_string(zero);
    const train::TrainResult r = train::train(tp_options(model, dp, tp, pp, zero));
    std::printf("%s: %.1e\n", what.c_str(), max_rel(want, losses(r)));
    // A channel split sums partial outputs in another order than one rank does. cnn-small and
    // resnet-small stay within 1e-5 for all 30 steps (measured at most 8.8e-6, resnet-small tp 2).
    // inception-small's curve sits on an edge from step 9 on that any reordered sum tips the
    // same way — dp 2 departs there exactly as tp 2 does (2.1e-5 at step 28, both) — so it is
    // held to 1e-5 for 20 steps and to 5e-5 after.
    if (model == "inception-small") expect_same_curve(want, losses(r), what, 20, 5e-5);
    else expect_same_curve(want, losses(r), what);
    // Every step's tp traffic (rank 0's: under pp, only its stage's units, so whole models only):
    // the layout's all-reduces and all-gathers per micro-batch, plus the gradient norm's one
    // double summed over tp.
    if (pp > 1) continue;
    const int64_t rows = 16 / dp / 2;
    const uint64_t per_step = 2 * parallel::cnn_tp_bytes_per_microbatch(model::cnn_config(model), tp, rows);
    for (const train::StepRecord& s : r.steps) {
      ASSERT_GE(s.tp_bytes_sent, per_step) << what;
      EXPECT_LE(s.tp_bytes_sent - per_step, 16u) << what << ": beyond the layout's bytes, only the norm's double";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Named, CnnTpLayouts, meshtrain::testing::named_cnns(), meshtrain::testing::cnn_test_name);

// Saved at tp 2, resumed at one rank and at dp 2 x tp 4; saved at one rank, resumed at tp 2:
// the batch norms' split running statistics and the split momentum come back whole.
TEST(CnnTpCheckpoints, ResumeAcrossTensorParallelLayoutsOnTheUninterruptedCurve) {
  meshtrain::testing::TempDir tmp("cnn_tp_ckpt");
  const std::vector<float> all = losses(train::train(cnn_options("resnet-small", 1, 1, 0)));
  const std::vector<float> tail(all.begin() + 4, all.end());
  auto save_at = [&](int dp, int tp, const std::string& dir) {
    train::TrainOptions first = tp_options("resnet-small", dp, tp, 1);
    first.steps = 4;
    first.optim.decay_steps = 30;
    first.checkpoint_dir = dir;
    first.checkpoint_every = 4;
    train::train(first);
  };
  auto resume_at = [&](int dp, int tp, const std::string& from, const std::string& what) {
    const std::string copy = tmp.file("copy_" + std::to_string(dp) + "_" + std::to_string(tp) + "_" + what);
    fs::copy(from, copy, fs::copy_options::recursive);
    train::TrainOptions second = tp_options("resnet-small", dp, tp, 1);
    second.checkpoint_dir = copy;
    second.resume = true;
    const train::TrainResult r = train::train(second);
    ASSERT_EQ(r.start_step, 4) << what;
    expect_same_curve(tail, losses(r), what);
  };
  const std::string at_tp2 = tmp.file("tp2");
  save_at(1, 2, at_tp2);
  resume_at(1, 1, at_tp2, "saved at tp 2, resumed at one rank");
  resume_at(2, 4, at_tp2, "saved at tp 2, resumed at dp 2 x tp 4");
  const std::string at_one = tmp.file("one");
  save_at(1, 1, at_one);
  resume_at(1, 2, at_one, "saved at one rank, resumed at tp 2");
}
