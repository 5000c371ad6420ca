// The cost model and `auto`: formulas behave as the algorithm headers say, and the choice is
// the cheapest available algorithm.
#include <gtest/gtest.h>

#include "meshtrain/comm/select.h"

namespace mc = meshtrain::comm;
using mc::Algorithm;
using mc::OpKind;

TEST(CostModel, RingIsBandwidthOptimalTreeIsNot) {
  const mc::CostParams c{1e-6, 1e-10, 1e-10};
  const std::size_t big = 256u << 20;
  EXPECT_LT(mc::predicted_seconds(OpKind::all_reduce, Algorithm::ring, big, 8, c),
            mc::predicted_seconds(OpKind::all_reduce, Algorithm::tree, big, 8, c));
  // Non-power of two: rhd pays the fix-up, ring does not.
  EXPECT_LT(mc::predicted_seconds(OpKind::all_reduce, Algorithm::ring, big, 6, c),
            mc::predicted_seconds(OpKind::all_reduce, Algorithm::rhd, big, 6, c));
  // Small messages on many ranks: logarithmic latency wins.
  EXPECT_LT(mc::predicted_seconds(OpKind::all_reduce, Algorithm::rhd, 64, 8, c),
            mc::predicted_seconds(OpKind::all_reduce, Algorithm::ring, 64, 8, c));
}

TEST(CostModel, AutoPicksAnImplementedNonNativeAlgorithm) {
  for (OpKind op : {OpKind::all_reduce, OpKind::reduce_scatter, OpKind::all_gather, OpKind::broadcast,
                    OpKind::reduce, OpKind::all_to_all})
    for (int p : {2, 3, 8})
      for (std::size_t n : {std::size_t{4}, std::size_t{4096}, std::size_t{64} << 20}) {
        const Algorithm a = mc::choose_algorithm(op, n, p, "threads");
        EXPECT_TRUE(mc::supports(op, a));
        EXPECT_NE(a, Algorithm::native);
      }
  EXPECT_EQ(mc::choose_algorithm(OpKind::all_reduce, std::size_t{64} << 20, 6, "threads"), Algorithm::ring);
}

TEST(CostModel, ParseAlgorithmNames) {
  EXPECT_EQ(mc::parse_algorithm("auto"), Algorithm::automatic);
  EXPECT_EQ(mc::parse_algorithm("rhd"), Algorithm::rhd);
  EXPECT_FALSE(mc::parse_algorithm("bogus").has_value());
}
