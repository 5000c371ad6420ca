// Every combination of the mesh's axes with every ZeRO stage trains on the single-rank curve
// (DESIGN decision 1): (dp, tp, pp) in {1, 2}^3 (world 8 = 2 x 2 x 2 among them) x ZeRO
// {0, 1, 2, 3} x schedule {gpipe, 1f1b}, gpt-tiny for 20 steps, every step's loss within 1e-5
// relative of one rank's. The schedule only matters with pp 2 and ZeRO only with dp 2; the
// runs where it would not are still made (the engine is built and used in each), so the
// matrix is the whole product.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/train/trainer.h"
#include "parallel/layout_fixture.h"

namespace train = meshtrain::train;
using meshtrain::testing::layout_options;

namespace {

constexpr int kSteps = 20;

train::TrainOptions matrix_options(int dp, int tp, int pp, int zero, const std::string& schedule) {
  auto o = layout_options(dp);
  o.steps = kSteps;
  o.tp = tp;
  o.pp = pp;
  o.zero = zero;
  o.schedule = schedule;
  o.microbatches = pp > 1 ? 2 : 1;  // B = 12: 6 or 12 rows per dp rank, 3 or 6 per micro-batch
  return o;
}

const std::vector<train::StepRecord>& reference() {
  static const std::vector<train::StepRecord> steps = train::train(matrix_options(1, 1, 1, 0, "1f1b")).steps;
  return steps;
}

using Layout = std::tuple<int, int, int, int, std::string>;  // dp, tp, pp, zero, schedule

std::string name_of(const Layout& l) {
  auto [dp, tp, pp, zero, schedule] = l;
  return "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_zero" +
         std::to_string(zero) + "_" + (schedule == "1f1b" ? std::string("onef1b") : schedule);
}

}  // namespace

class LayoutMatrix : public ::testing::TestWithParam<Layout> {};

TEST_P(LayoutMatrix, MatchesSingleRank) {
  auto [dp, tp, pp, zero, schedule] = GetParam();
  const auto& ref = reference();
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  ASSERT_LT(ref.back().loss, ref.front().loss - 0.5f) << "the curve must move, or equality proves nothing";
  const auto r = train::train(matrix_options(dp, tp, pp, zero, schedule));
  ASSERT_EQ(r.steps.size(), ref.size()) << name_of(GetParam());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LT(std::fabs(r.steps[i].loss - ref[i].loss) / std::fabs(ref[i].loss), 1e-5)
        << name_of(GetParam()) << ": step " << i << " loss " << r.steps[i].loss << " vs single-rank " << ref[i].loss;
    // The global gradient norm counts every parameter once whatever holds it.
    EXPECT_LT(std::fabs(r.steps[i].grad_norm - ref[i].grad_norm) / ref[i].grad_norm, 1e-4)
        << name_of(GetParam()) << ": step " << i << " gradient norm " << r.steps[i].grad_norm << " vs "
        << ref[i].grad_norm;
  }
}

INSTANTIATE_TEST_SUITE_P(GptTiny, LayoutMatrix,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(1, 2), ::testing::Values(1, 2),
                                            ::testing::Values(0, 1, 2, 3), ::testing::Values("gpipe", "1f1b")),
                         [](const auto& info) { return name_of(info.param); });
