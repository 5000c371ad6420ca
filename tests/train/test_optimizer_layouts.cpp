// Every optimizer trains on the single-rank curve at every layout (DESIGN decision 1): AdamW,
// SGD (Nesterov momentum, L2 decay, the step schedule) and LAMB on gpt-tiny for 10 steps at
// dp 2 ZeRO-1, dp 2 ZeRO-3 and tp 2 (and LAMB, whose trust ratios need whole-tensor norms, at
// dp 2 x tp 2 ZeRO-2 and pp 2 too), every step's loss within 1e-5 relative of one rank's. SGD
// and LAMB resume bit-exactly at the layout that saved and on the curve at another; a resume
// with another optimizer, or with SGD state it did not save, is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/train/trainer.h"
#include "parallel/layout_fixture.h"
#include "temp_dir.h"

namespace train = meshtrain::train;
namespace fs = std::filesystem;
using train::OptimizerKind;

namespace meshtrain::train {
void PrintTo(OptimizerKind k, std::ostream* os) { *os << to_string(k); }
}  // namespace meshtrain::train

namespace {

constexpr int kSteps = 10;

struct Layout {
  int dp, tp, pp, zero;
};
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "dp " << l.dp << " tp " << l.tp << " pp " << l.pp << " zero " << l.zero;
}

std::string name_of(const Layout& l) {
  return meshtrain::testing::matrix_name(l.dp, l.tp, l.pp, l.zero, "1f1b");
}

// gpt-tiny at B=12, T=32 (the layout tests' run) with the optimizer's own settings.
train::TrainOptions options(OptimizerKind kind, const Layout& l) {
  auto o = meshtrain::testing::matrix_options(kSteps, l.dp, l.tp, l.pp, l.zero, "1f1b");
  // Small gradient buckets: under ZeRO each is sliced over dp, so many tensors are cut between
  // the ranks and a rank holds pieces of many (what LAMB's norm reduction must get right).
  if (l.dp > 1) o.bucket_bytes = 100'000;
  o.optim.kind = kind;
  o.optim.warmup_steps = 2;
  if (kind == OptimizerKind::sgd) {
    o.optim.lr = 0.05f;
    o.optim.nesterov = true;
    o.optim.weight_decay = 1e-4f;
    o.optim.schedule = train::LrSchedule::step;
    o.optim.step_every = 4;
    o.optim.step_gamma = 0.5f;
  } else if (kind == OptimizerKind::lamb) {
    o.optim.lr = 0.02f;
  }
  return o;
}

const std::vector<train::StepRecord>& reference(OptimizerKind kind) {
  static std::map<OptimizerKind, std::vector<train::StepRecord>> cache;
  auto it = cache.find(kind);
  if (it == cache.end()) it = cache.emplace(kind, train::train(options(kind, {1, 1, 1, 0})).steps).first;
  return it->second;
}

void expect_on_curve(const std::vector<train::StepRecord>& got, const std::vector<train::StepRecord>& ref,
                     const std::string& what, size_t from = 0) {
  ASSERT_EQ(got.size() + from, ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const train::StepRecord& r = ref[from + i];
    ASSERT_EQ(got[i].step, r.step) << what;
    EXPECT_LT(std::fabs(got[i].loss - r.loss) / std::fabs(r.loss), 1e-5)
        << what << ": step " << r.step << " loss " << got[i].loss << " vs " << r.loss;
  }
}

}  // namespace

class OptimizerLayouts : public ::testing::TestWithParam<std::tuple<OptimizerKind, Layout>> {};

TEST_P(OptimizerLayouts, MatchSingleRank) {
  const auto [kind, layout] = GetParam();
  const auto& ref = reference(kind);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  ASSERT_LT(ref.back().loss, ref.front().loss - 0.3f) << "the curve must move, or equality proves nothing";
  const auto r = train::train(options(kind, layout));
  expect_on_curve(r.steps, ref, to_string(kind) + " at " + name_of(layout));
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_EQ(r.steps[i].lr, ref[i].lr) << "the schedule is the same at every layout";
}

namespace {
const Layout kDp2Zero1{2, 1, 1, 1}, kDp2Zero3{2, 1, 1, 3}, kTp2{1, 2, 1, 0};
std::string param_name(const ::testing::TestParamInfo<std::tuple<OptimizerKind, Layout>>& info) {
  return to_string(std::get<0>(info.param)) + "_" + name_of(std::get<1>(info.param));
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, OptimizerLayouts,
                         ::testing::Combine(::testing::Values(OptimizerKind::adamw, OptimizerKind::sgd,
                                                              OptimizerKind::lamb),
                                            ::testing::Values(kDp2Zero1, kDp2Zero3, kTp2)),
                         param_name);
// LAMB's norms reduced over dp and tp at once, and a pipeline (each stage its own tensors;
// the tied token table's two copies alike).
INSTANTIATE_TEST_SUITE_P(Lamb, OptimizerLayouts,
                         ::testing::Combine(::testing::Values(OptimizerKind::lamb),
                                            ::testing::Values(Layout{2, 2, 1, 2}, Layout{1, 1, 2, 0})),
                         param_name);

// A checkpoint saved at dp 2 ZeRO-1 (each rank its slices of the state) resumes bit-exactly at
// dp 2 ZeRO-1, and at tp 2 on the curve of an uninterrupted tp 2 run.
TEST(OptimizerResume, SgdAndLambResumeBitExactlyAndAtAnotherLayout) {
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::lamb}) {
    meshtrain::testing::TempDir dir("optim_resume");
    const std::string saved = dir.file("saved");
    auto o = options(kind, kDp2Zero1);
    o.checkpoint_dir = saved;
    o.checkpoint_every = 5;
    const auto whole = train::train(o).steps;
    ASSERT_EQ(whole.size(), static_cast<size_t>(kSteps));
    for (const Layout& l : {kDp2Zero1, kTp2}) {
      const std::string what = to_string(kind) + " resumed at " + name_of(l);
      const std::string from = dir.file("from_" + name_of(l));
      fs::create_directories(from);
      fs::copy(fs::path(saved) / "step_00000005", fs::path(from) / "step_00000005", fs::copy_options::recursive);
      auto r = options(kind, l);
      r.checkpoint_dir = from;
      r.resume = true;
      const auto resumed = train::train(r);
      ASSERT_EQ(resumed.start_step, 5) << what;
      if (l.dp == kDp2Zero1.dp && l.zero == kDp2Zero1.zero) {
        ASSERT_EQ(resumed.steps.size(), 5u) << what;
        for (size_t i = 0; i < resumed.steps.size(); ++i) {
          EXPECT_EQ(resumed.steps[i].loss, whole[5 + i].loss) << what << ": step " << whole[5 + i].step;
          EXPECT_EQ(resumed.steps[i].grad_norm, whole[5 + i].grad_norm) << what << ": step " << whole[5 + i].step;
        }
      } else {
        expect_on_curve(resumed.steps, train::train(options(kind, l)).steps, what, 5);
      }
    }
  }
}

TEST(OptimizerResume, AnotherOptimizerOrAnotherSgdStateIsRefused) {
  meshtrain::testing::TempDir dir("optim_refuse");
  auto o = options(OptimizerKind::sgd, {1, 1, 1, 0});
  o.steps = 2;
  o.checkpoint_dir = dir.file("ck");
  train::train(o);
  auto expect_refused = [&](train::TrainOptions r, const std::vector<std::string>& phrases) {
    r.steps = 4;
    r.checkpoint_dir = o.checkpoint_dir;
    r.resume = true;
    try {
      train::train(r);
      ADD_FAILURE() << "resumed with " << to_string(r.optim.kind);
    } catch (const std::invalid_argument& e) {
      for (const std::string& p : phrases) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  expect_refused(options(OptimizerKind::lamb, {1, 1, 1, 0}),
                 {"--optimizer sgd", "--optimizer lamb", "does not carry over"});
  expect_refused(options(OptimizerKind::adamw, {1, 1, 1, 0}), {"--optimizer sgd", "--optimizer adamw"});
  auto no_momentum = options(OptimizerKind::sgd, {1, 1, 1, 0});
  no_momentum.optim.momentum = 0;
  no_momentum.optim.nesterov = false;
  expect_refused(no_momentum, {"momentum_buffer", "--momentum 0"});
  // The same settings resume.
  auto same = options(OptimizerKind::sgd, {1, 1, 1, 0});
  same.steps = 4, same.checkpoint_dir = o.checkpoint_dir, same.resume = true;
  EXPECT_EQ(train::train(same).start_step, 2);
}
