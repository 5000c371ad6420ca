// Goodput ranking (plan/goodput.h): the candidate batches are the powers of two times the base
// up to the limit; each row's efficiency and goodput follow Pollux's formula, computed here
// independently of the code under test, and the best row is the largest goodput of those
// figures: a huge noise scale makes the efficiency about 1 everywhere (the batch with the most
// samples per second wins), a tiny one favours the smallest batch, one between them a batch
// in the middle. Bad input throws.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "meshtrain/plan/goodput.h"
#include "meshtrain/train/noise_scale.h"

namespace {
using meshtrain::plan::GoodputRanking;
using meshtrain::plan::Prediction;
using meshtrain::plan::goodput_batches;
using meshtrain::plan::rank_goodput;

// A step of 4 ms plus 0.1875 ms a sample: samples/s grows with the batch, toward 5333/s.
std::vector<Prediction> predictions(const std::vector<int64_t>& batches) {
  std::vector<Prediction> out;
  for (int64_t b : batches) {
    Prediction p;
    p.layout.batch = b;
    p.step_s = 0.004 + 0.0001875 * static_cast<double>(b);
    p.samples_per_s = static_cast<double>(b) / p.step_s;
    out.push_back(p);
  }
  return out;
}

GoodputRanking rank(double noise, int64_t base = 32) {
  return rank_goodput(predictions({32, 64, 128, 256}), noise, base, meshtrain::train::stat_efficiency);
}

TEST(Goodput, CandidateBatchesArePowersOfTwoTimesTheBase) {
  EXPECT_EQ(goodput_batches(32, 256), (std::vector<int64_t>{32, 64, 128, 256}));
  EXPECT_EQ(goodput_batches(32, 255), (std::vector<int64_t>{32, 64, 128}));
  EXPECT_EQ(goodput_batches(12, 12), (std::vector<int64_t>{12}));
  EXPECT_EQ(goodput_batches(3, 50), (std::vector<int64_t>{3, 6, 12, 24, 48}));
  EXPECT_THROW(goodput_batches(0, 8), std::invalid_argument);
  EXPECT_THROW(goodput_batches(16, 8), std::invalid_argument);
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(goodput_batches(big / 2 + 1, big).size(), 1u);  // no overflow past the last
}

TEST(Goodput, RowsFollowThePolluxFormula) {
  const double noise = 100;
  const GoodputRanking r = rank(noise);
  ASSERT_EQ(r.rows.size(), 4u);
  // By hand: E(B) = (100 + 32) / (100 + B); samples/s = B / (0.004 + 0.0001875 B).
  const double want_e[] = {1.0, 132.0 / 164.0, 132.0 / 228.0, 132.0 / 356.0};
  const double want_sps[] = {32 / 0.010, 64 / 0.016, 128 / 0.028, 256 / 0.052};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(r.rows[i].efficiency, want_e[i], 1e-12) << i;
    EXPECT_NEAR(r.rows[i].goodput, want_sps[i] * want_e[i], 1e-9) << i;
  }
  // 3200, 3219.5, 2646.6, 1825.5 samples/s: batch 64 is best.
  EXPECT_EQ(r.rows[r.best].batch(), 64);
}

TEST(Goodput, HugeNoiseScaleRanksByThroughputTinyOneFavoursTheSmallBatch) {
  GoodputRanking r = rank(1e12);
  for (const auto& row : r.rows) EXPECT_NEAR(row.efficiency, 1.0, 1e-9) << row.batch();
  EXPECT_EQ(r.rows[r.best].batch(), 256);  // the most samples per second

  r = rank(1e-9);
  for (const auto& row : r.rows) EXPECT_NEAR(row.efficiency, 32.0 / static_cast<double>(row.batch()), 1e-9);
  EXPECT_EQ(r.rows[r.best].batch(), 32);  // goodput ~ 32 / step time: the shortest step

  // Zero: E = B0 / B exactly, so the goodput is B0 / step time.
  r = rank(0);
  for (const auto& row : r.rows) EXPECT_DOUBLE_EQ(row.goodput, 32.0 / row.prediction.step_s) << row.batch();
  EXPECT_EQ(r.rows[r.best].batch(), 32);
}

TEST(Goodput, EfficiencyIsAgainstTheGivenBase) {
  // Base 64 for the same rows: every efficiency scales by (N + 64) / (N + 32), so the ranking
  // holds and batch 64's efficiency is 1.
  const GoodputRanking a = rank(100, 32), b = rank(100, 64);
  EXPECT_EQ(a.best, b.best);
  EXPECT_DOUBLE_EQ(b.rows[1].efficiency, 1.0);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(b.rows[i].efficiency, a.rows[i].efficiency * 164.0 / 132.0, 1e-12);
}

TEST(Goodput, TieGoesToTheSmallerBatch) {
  std::vector<Prediction> p = predictions({32, 64});
  p[1].samples_per_s = p[0].samples_per_s * 2;  // E(64) = 1/2 at noise 0: the same goodput
  const GoodputRanking r = rank_goodput(p, 0, 32, [](double n, double b0, double b) { return (n + b0) / (n + b); });
  EXPECT_DOUBLE_EQ(r.rows[0].goodput, r.rows[1].goodput);
  EXPECT_EQ(r.best, 0u);
}

TEST(Goodput, BadInputThrows) {
  const auto e = meshtrain::train::stat_efficiency;
  EXPECT_THROW(rank_goodput({}, 10, 32, e), std::invalid_argument);
  EXPECT_THROW(rank_goodput(predictions({32}), -1, 32, e), std::invalid_argument);
  EXPECT_THROW(rank_goodput(predictions({32}), std::nan(""), 32, e), std::invalid_argument);
  EXPECT_THROW(rank_goodput(predictions({32}), std::numeric_limits<double>::infinity(), 32, e), std::invalid_argument);
  EXPECT_THROW(rank_goodput(predictions({32}), 10, 0, e), std::invalid_argument);
  std::vector<Prediction> p = predictions({32});
  p[0].step_s = 0;
  EXPECT_THROW(rank_goodput(p, 10, 32, e), std::invalid_argument);
}

}  // namespace
