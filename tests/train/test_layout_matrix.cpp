// Every combination of the mesh's axes with every ZeRO stage trains on the single-rank curve
// (DESIGN decision 1): (dp, tp, pp) in {1, 2}^3 (world 8 = 2 x 2 x 2 among them) x ZeRO
// {0, 1, 2, 3} x schedule {gpipe, 1f1b}, gpt-tiny for 20 steps, every step's loss within 1e-5
// relative of one rank's. The schedule only matters with pp 2 and ZeRO only with dp 2; the
// runs where it would not are still made (the engine is built and used in each), so the
// matrix is the whole product.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/train/trainer.h"
#include "parallel/layout_fixture.h"
#include "temp_dir.h"

namespace train = meshtrain::train;
using meshtrain::testing::layout_options;

namespace {

constexpr int kSteps = 20;

train::TrainOptions matrix_options(int dp, int tp, int pp, int zero, const std::string& schedule) {
  return meshtrain::testing::matrix_options(kSteps, dp, tp, pp, zero, schedule);
}

const std::vector<train::StepRecord>& reference() {
  static const std::vector<train::StepRecord> steps = train::train(matrix_options(1, 1, 1, 0, "1f1b")).steps;
  return steps;
}

using Layout = std::tuple<int, int, int, int, std::string>;  // dp, tp, pp, zero, schedule

std::string name_of(const Layout& l) {
  return std::apply(meshtrain::testing::matrix_name, l);
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

// ZeRO-3 under the schedules outside the matrix: interleaved (each rank runs its chunks' units
// in turn, so a prefetch can go unused until the next step: values gathered before an update
// must not survive it), ZB-H1 (deferred weight GEMMs run while the weights are released) and
// recomputation (a forward inside backward).
TEST(LayoutMatrixSchedules, ZeroThreeWithInterleavedZeroBubbleAndRecompute) {
  const auto& ref = reference();
  for (int variant = 0; variant < 3; ++variant) {
    auto o = matrix_options(2, 1, 2, 3, variant == 0 ? "interleaved" : variant == 1 ? "zb" : "1f1b");
    if (variant == 0) o.chunks = 2;
    if (variant == 2) o.recompute = true;
    const auto r = train::train(o);
    ASSERT_EQ(r.steps.size(), ref.size()) << o.schedule;
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_LT(std::fabs(r.steps[i].loss - ref[i].loss) / std::fabs(ref[i].loss), 1e-5)
          << o.schedule << (o.recompute ? " with recomputation" : "") << ": step " << i << " loss " << r.steps[i].loss
          << " vs single-rank " << ref[i].loss;
  }
}

// Resharding: a checkpoint saved at dp 2 x tp 2 x pp 2 under ZeRO-3 (every tensor sliced over
// dp, split over tp and cut into stages while training) resumes at one rank, at dp 4 x pp 2
// under ZeRO-1 and at tp 2, each on the curve of an uninterrupted run at that layout: within
// 1e-5 relative, and bit-exact at the layout that saved it.
TEST(Resharding, CheckpointAt2x2x2Zero3ResumesAtOtherLayouts) {
  namespace fs = std::filesystem;
  meshtrain::testing::TempDir dir("reshard");
  const std::string saved = dir.file("saved");
  {
    auto o = matrix_options(2, 2, 2, 3, "1f1b");
    o.batch = 16;  // so that dp 4 x 2 micro-batches divides it too
    o.checkpoint_dir = saved;
    o.checkpoint_every = 10;
    ASSERT_EQ(train::train(o).steps.size(), static_cast<size_t>(kSteps));
  }
  ASSERT_TRUE(fs::is_directory(fs::path(saved) / "step_00000010"));
  struct Target {
    int dp, tp, pp, zero;
  };
  for (const Target t : {Target{1, 1, 1, 0}, Target{4, 1, 2, 1}, Target{1, 2, 1, 0}, Target{2, 2, 2, 3}}) {
    const std::string what = "dp " + std::to_string(t.dp) + " tp " + std::to_string(t.tp) + " pp " +
                             std::to_string(t.pp) + " zero " + std::to_string(t.zero);
    auto o = matrix_options(t.dp, t.tp, t.pp, t.zero, "1f1b");
    o.batch = 16;
    const auto whole = train::train(o).steps;
    // Only step 10 of the saved run: the resume starts there.
    const std::string from = dir.file("from_" + std::to_string(t.dp) + std::to_string(t.tp) + std::to_string(t.pp));
    fs::create_directories(from);
    fs::copy(fs::path(saved) / "step_00000010", fs::path(from) / "step_00000010", fs::copy_options::recursive);
    o.checkpoint_dir = from;
    o.resume = true;
    const auto resumed = train::train(o).steps;
    ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - 10)) << what;
    for (size_t i = 0; i < resumed.size(); ++i) {
      const train::StepRecord& a = whole[10 + i];
      ASSERT_EQ(resumed[i].step, a.step) << what;
      if (t.dp == 2 && t.tp == 2 && t.pp == 2)
        EXPECT_EQ(resumed[i].loss, a.loss) << what << ": step " << a.step;
      else
        EXPECT_LT(std::fabs(resumed[i].loss - a.loss) / a.loss, 1e-5)
            << what << ": step " << a.step << " loss " << resumed[i].loss << " vs " << a.loss;
    }
  }
}
