// bf16 training (--precision bf16): every parallel layout follows the single-rank bf16 curve, and
// bf16 follows the float32 curve within a stated band over 300 steps.
//
// Why the layouts are held to 1e-4 here and not float32's 1e-5: a layout sums the same float32
// terms in another order (a dp rank's half of the batch, a tp rank's half of a product, two
// micro-batches instead of one), which moves a value by an ulp or so. Rounding to bf16 is a
// step function: an ulp can carry an operand across the midpoint between two bf16 values and
// change it by 2^-8 relative, 2^16 times more than the float32 difference that caused it. Such
// flips are rare but they are the step's operands from then on, so the layouts drift from each
// other faster than in float32. Measured over 20 steps of gpt-tiny (AMD EPYC, avx512_core_bf16):
// 3.5e-5 to 4.2e-5 relative for every layout below (float32 layouts: under 1e-5), against
// 9.2e-5 between the single-rank bf16 and float32 curves over the same 20 steps. So a bf16
// layout is not the single-rank bf16 run to float32 round-off; it is a run whose distance from
// it is about half of bf16's own distance from float32, and both stay far inside the band the
// 300-step test below holds bf16 to.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/kernels/bf16.h"
#include "meshtrain/train/trainer.h"
#include "parallel/layout_fixture.h"
#include "temp_dir.h"

namespace train = meshtrain::train;
using meshtrain::kernels::Precision;
using meshtrain::testing::layout_options;

namespace {

constexpr int kSteps = 20;
constexpr double kLayoutBound = 1e-4;  // see the top of this file

train::TrainOptions bf16_options(int dp, int tp, int pp, int zero, const std::string& schedule) {
  auto o = meshtrain::testing::matrix_options(kSteps, dp, tp, pp, zero, schedule);
  o.precision = Precision::bf16;
  return o;
}

const std::vector<train::StepRecord>& bf16_reference() {
  static const std::vector<train::StepRecord> steps = train::train(bf16_options(1, 1, 1, 0, "1f1b")).steps;
  return steps;
}

using Layout = std::tuple<int, int, int, int, std::string>;  // dp, tp, pp, zero, schedule

std::string name_of(const Layout& l) { return std::apply(meshtrain::testing::matrix_name, l); }

}  // namespace

class Bf16Layouts : public ::testing::TestWithParam<Layout> {};

TEST_P(Bf16Layouts, MatchSingleRankBf16) {
  auto [dp, tp, pp, zero, schedule] = GetParam();
  const auto& ref = bf16_reference();
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  ASSERT_LT(ref.back().loss, ref.front().loss - 0.5f) << "the curve must move, or equality proves nothing";
  const auto r = train::train(bf16_options(dp, tp, pp, zero, schedule));
  ASSERT_EQ(r.steps.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double rel = std::fabs(r.steps[i].loss - ref[i].loss) / std::fabs(ref[i].loss);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, kLayoutBound) << name_of(GetParam()) << ": step " << i << " loss " << r.steps[i].loss
                                 << " vs single-rank bf16 " << ref[i].loss;
  }
  std::printf("%s: worst relative loss difference to single-rank bf16 over %d steps: %.2e\n",
              name_of(GetParam()).c_str(), kSteps, worst);
}

INSTANTIATE_TEST_SUITE_P(GptTiny, Bf16Layouts,
                         ::testing::Values(Layout{2, 1, 1, 0, "1f1b"}, Layout{2, 1, 1, 2, "1f1b"},
                                           Layout{1, 2, 1, 0, "1f1b"}, Layout{1, 1, 2, 0, "1f1b"},
                                           Layout{1, 1, 2, 0, "zb"}, Layout{2, 2, 2, 3, "gpipe"}),
                         [](const auto& info) { return name_of(info.param); });

// The single-rank bf16 curve moves off the float32 one: the operand roundings (relative 2^-8
// each) change every step's update a little. Measured at the commit that added this test over
// 300 steps: worst single-step difference 0.027, mean of the last 50 steps 0.1568 against
// 0.1561. The band is three times the measured worst; the tail means must agree to 0.02 (the
// convergence target on tinyshakespeare is also 0.02, docs/benchmarks.md).
TEST(Bf16Training, StaysWithinABandOfTheFloat32CurveFor300Steps) {
  auto o = layout_options(1);
  o.steps = 300;
  o.optim.warmup_steps = 20;
  const auto f32 = train::train(o).steps;
  o.precision = Precision::bf16;
  const auto bf16 = train::train(o).steps;
  ASSERT_EQ(f32.size(), bf16.size());
  double worst = 0, sum_diff = 0;
  bool differs = false;
  for (size_t i = 0; i < f32.size(); ++i) {
    worst = std::max(worst, std::fabs(double(bf16[i].loss) - f32[i].loss));
    sum_diff += double(bf16[i].loss) - f32[i].loss;
    differs |= bf16[i].loss != f32[i].loss;
  }
  // Mean over the last 50 steps (single steps are noisy: one batch each).
  double tail_f32 = 0, tail_bf16 = 0;
  for (size_t i = f32.size() - 50; i < f32.size(); ++i) tail_f32 += f32[i].loss, tail_bf16 += bf16[i].loss;
  tail_f32 /= 50, tail_bf16 /= 50;
  std::printf("bf16 vs fp32 over %zu steps: worst |diff| %.4f, mean diff %.4f, last-50 mean %.4f vs %.4f\n",
              f32.size(), worst, sum_diff / f32.size(), tail_bf16, tail_f32);
  EXPECT_TRUE(differs) << "bf16 gave the float32 curve bit for bit: the bf16 path did not run";
  EXPECT_LT(f32.back().loss, f32.front().loss - 2.0f) << "the float32 run must learn";
  EXPECT_LT(worst, 0.08) << "a step's bf16 loss left the band around the float32 one";
  EXPECT_LT(std::fabs(tail_bf16 - tail_f32), 0.02) << "bf16 ends elsewhere than float32";
}


// Checkpoints hold the float32 master weights and Adam state whatever the precision: a bf16
// run resumes in bf16 bit for bit, and in fp32 (and back) from the same state.
TEST(Bf16Training, CheckpointsResumeInEitherPrecision) {
  meshtrain::testing::TempDir tmp("bf16ckpt");
  auto o = layout_options(1);
  o.steps = 10;
  o.precision = Precision::bf16;
  o.checkpoint_dir = tmp.file("a");
  o.checkpoint_every = 5;
  const auto whole = train::train(o).steps;  // steps 1-10, saved at 5 and 10
  ASSERT_EQ(whole.size(), 10u);
  auto resume_from_5 = [&](Precision p, const std::string& name) {
    std::filesystem::create_directories(tmp.file(name));
    std::filesystem::copy(tmp.file("a") + "/" + train::step_folder_name(5), tmp.file(name) + "/" + train::step_folder_name(5),
                          std::filesystem::copy_options::recursive);
    auto r = o;
    r.checkpoint_dir = tmp.file(name);
    r.resume = true;
    r.precision = p;
    return train::train(r).steps;
  };
  const auto same = resume_from_5(Precision::bf16, "b");
  ASSERT_EQ(same.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(same[i].loss, whole[5 + i].loss) << "step " << 6 + i;
  const auto f32 = resume_from_5(Precision::f32, "c");
  ASSERT_EQ(f32.size(), 5u);
  // Step 6 starts from the same weights: only the products' precision differs.
  EXPECT_NE(f32[0].loss, whole[5].loss) << "the resumed run must really be float32";
  EXPECT_LT(std::fabs(f32[0].loss - whole[5].loss) / whole[5].loss, 1e-3);
}

// --comm-dtype bf16 at dp 2 x tp 2: gradients and activations travel as bf16; the curve moves
// by the roundings only (measured at 300 steps of dp 2 on tinyshakespeare: at most 1.0e-4 per
// step; docs/benchmarks.md), and the step's bytes on both groups halve.
TEST(Bf16Training, CommDtypeBf16FollowsTheFloat32WireCurve) {
  auto o = meshtrain::testing::matrix_options(kSteps, 2, 2, 1, 0, "1f1b");
  const auto f32 = train::train(o).steps;
  o.comm_dtype = Precision::bf16;
  const auto b16 = train::train(o).steps;
  ASSERT_EQ(f32.size(), b16.size());
  bool differs = false;
  for (size_t i = 0; i < f32.size(); ++i) {
    differs |= f32[i].loss != b16[i].loss;
    EXPECT_LT(std::fabs(b16[i].loss - f32[i].loss) / f32[i].loss, 1e-3) << "step " << i;
    EXPECT_NEAR(double(b16[i].comm_bytes_sent) / double(f32[i].comm_bytes_sent), 0.5, 0.01) << "dp bytes, step " << i;
    EXPECT_NEAR(double(b16[i].tp_bytes_sent) / double(f32[i].tp_bytes_sent), 0.5, 0.01) << "tp bytes, step " << i;
  }
  EXPECT_TRUE(differs) << "the bf16 wire left the curve bit for bit unchanged: it did not run";
}
