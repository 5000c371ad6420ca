// Chimera (--schedule chimera): two pipelines over the same ranks in opposite directions, each
// rank holding a stage of each, the two copies of a model stage summing their gradients. The
// central check: the single-rank loss curve, for a transformer and for a CNN with exact sums;
// then the schedule's bubble against the paper's formula, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"
#include "meshtrain/pipeline/simulate.h"
#include "meshtrain/train/trainer.h"
#include "parallel/layout_fixture.h"
#include "train/cnn_runs.h"

namespace train = meshtrain::train;
namespace pipeline = meshtrain::pipeline;
using meshtrain::testing::layout_options;
using meshtrain::testing::max_abs;
using meshtrain::testing::refused;

namespace {

train::TrainOptions gpt(int pp, int m, const std::string& schedule = "chimera") {
  train::TrainOptions o = layout_options(1);
  o.pp = pp, o.microbatches = m, o.schedule = pp > 1 ? schedule : "1f1b";
  return o;
}

}  // namespace

// gpt-tiny (its token table tied between the first and the last stage, which Chimera puts on
// ranks 0 and pp-1 twice) on the single-rank curve within 1e-5 over 30 steps: pp 2 and pp 4 at
// 4 micro-batches (2 a pipeline), pp 2 at 6, and tensor parallelism inside both pipelines.
TEST(Chimera, FollowsTheSingleRankCurve) {
  const std::vector<float> one = meshtrain::testing::losses(train::train(gpt(1, 4)));
  ASSERT_EQ(one.size(), 30u);
  ASSERT_LT(one.back(), one.front() - 0.5f) << "the curve must move";
  for (auto [pp, m] : {std::pair{2, 4}, std::pair{4, 4}, std::pair{2, 6}}) {
    const std::vector<float> got = meshtrain::testing::losses(train::train(gpt(pp, m)));
    EXPECT_LT(max_abs(one, got), 1e-5) << "pp " << pp << " m " << m;
  }
  train::TrainOptions tp = gpt(2, 4);
  tp.tp = 2;
  EXPECT_LT(max_abs(one, meshtrain::testing::losses(train::train(tp))), 1e-5) << "tp 2 x pp 2";
}

// A residual CNN with batch norm (resnet-small, cut where no skip crosses; each pipeline's micro-batches normalised by their own statistics, as
// on one rank), with exact gradient sums: the single-rank curve within 1e-6 over 30 steps.
TEST(Chimera, CNNWithExactSumsFollowsTheSingleRankCurve) {
  auto cnn = [](int pp) {
    train::TrainOptions o = meshtrain::testing::cnn_options("resnet-small", 1, pp, 0, pp > 1 ? "chimera" : "1f1b");
    o.microbatches = 4;
    o.exact_sums = 4;
    return o;
  };
  const std::vector<float> one = meshtrain::testing::losses(train::train(cnn(1)));
  for (int pp : {2, 4}) {
    const std::vector<float> got = meshtrain::testing::losses(train::train(cnn(pp)));
    EXPECT_LT(meshtrain::testing::max_rel(one, got), 1e-6) << "pp " << pp;
  }
}

// The lists: every rank r holds the down pipeline's stage r (chunk 0) and the up pipeline's
// stage pp-1-r (chunk 1), each pipeline runs its half of the micro-batches, the lists pass the
// dry run; and, with forward and backward of equal cost as the paper counts them, the bubble is
// its (D-2)/(2N+D-2) at N = D micro-batches, below 1F1B's (D-1)/(N+D-1); with backward twice
// forward, still below 1F1B's.
TEST(Chimera, BubbleIsThePapersFormula) {
  for (int D : {2, 4, 6, 8}) {
    const pipeline::Schedule s = pipeline::add_send_recv(pipeline::make_schedule("chimera", {D, D, 1}));
    ASSERT_TRUE(s.shape.bidirectional);
    ASSERT_EQ(s.shape.chunks, 2);
    EXPECT_FALSE(pipeline::validate(s)) << pipeline::validate(s)->to_string();
    for (int r = 0; r < D; ++r)
      for (const pipeline::Action& a : s.ranks[r]) {
        EXPECT_EQ(a.stage, a.chunk == 0 ? r : 2 * D - 1 - r) << "rank " << r;
        EXPECT_EQ(a.microbatch < D / 2, a.chunk == 0) << "rank " << r << " micro-batch " << a.microbatch;
      }
    auto mean_bubble = [](const pipeline::Timeline& t) {
      double b = 0;
      for (double x : t.bubble) b += x;
      return b / static_cast<double>(t.bubble.size());
    };
    const pipeline::Schedule f1b = pipeline::add_send_recv(pipeline::make_schedule("1f1b", {D, D, 1}));
    const pipeline::Costs equal{.F = 1, .B = 1}, paper_b{.F = 1, .B = 2};
    const double n = D;
    EXPECT_NEAR(mean_bubble(pipeline::simulate(s, equal)), (D - 2) / (2 * n + D - 2), 1e-12) << "D " << D;
    EXPECT_NEAR(mean_bubble(pipeline::simulate(f1b, equal)), (D - 1) / (n + D - 1), 1e-12) << "D " << D;
    if (D > 2) {
      EXPECT_LT(mean_bubble(pipeline::simulate(s, paper_b)), mean_bubble(pipeline::simulate(f1b, paper_b))) << "D " << D;
    }
  }
}

TEST(Chimera, RefusesWhatItCannotRun) {
  refused(gpt(3, 4), "use an even --pp");
  refused(gpt(2, 3), "use an even --microbatches");
  train::TrainOptions o = gpt(2, 4);
  o.dp = 2;
  refused(o, "drop --dp");
  o = gpt(2, 4);
  o.checkpoint_dir = "/nonexistent/ck";
  refused(o, "drop --checkpoint-dir");
}
