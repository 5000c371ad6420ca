// Stage partitioning: the balancer's exact answers on small cases, hand-given counts, refusals.
#include <gtest/gtest.h>

#include <vector>

#include "meshtrain/pipeline/partition.h"

namespace mp = meshtrain::pipeline;
using Spans = std::vector<mp::LayerSpan>;

TEST(Partition, EqualBlocksSplitEvenly) {
  EXPECT_EQ(mp::balance_layers(std::vector<double>(4, 1.0), 2, 0, 0), (Spans{{0, 2}, {2, 4}}));
  EXPECT_EQ(mp::balance_layers(std::vector<double>(6, 1.0), 3, 0, 0), (Spans{{0, 2}, {2, 4}, {4, 6}}));
  EXPECT_EQ(mp::balance_layers(std::vector<double>(4, 1.0), 4, 0, 0), (Spans{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
}

TEST(Partition, TheHeadTakesBlocksFromTheLastStage) {
  // 12 blocks of cost 1, a head of 5.4 (gpt2-124m's tied projection against its blocks): the
  // best largest stage is 9 (9 blocks | 3 blocks + 5.4 = 8.4).
  auto s = mp::balance_layers(std::vector<double>(12, 1.0), 2, 0, 5.4);
  EXPECT_EQ(s, (Spans{{0, 9}, {9, 12}}));
  // 6 blocks over 3 stages with a head worth 1.5 blocks: 2 | 3 | 1 + 1.5 has max 3; 2 | 2 | 2+1.5
  // has 3.5; the balancer finds a max of 3 (3 | 2 | 1 + 1.5 = 2.5 is as good, with earlier stages fuller).
  s = mp::balance_layers(std::vector<double>(6, 1.0), 3, 0, 1.5);
  double worst = 0;
  for (size_t i = 0; i < s.size(); ++i) worst = std::max(worst, s[i].size() + (i == 2 ? 1.5 : 0.0));
  EXPECT_DOUBLE_EQ(worst, 3.0);
  EXPECT_EQ(s.front().first, 0);
  EXPECT_EQ(s.back().end, 6);
}

TEST(Partition, HandGivenCounts) {
  EXPECT_EQ(mp::layers_from_counts("3,3,2,2", 4, 10), (Spans{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_THROW(mp::layers_from_counts("3,3,2", 4, 8), std::invalid_argument);    // too few stages
  EXPECT_THROW(mp::layers_from_counts("3,3,2,1", 4, 10), std::invalid_argument);  // sums to 9
  EXPECT_THROW(mp::layers_from_counts("3,0,5", 3, 8), std::invalid_argument);     // an empty stage
  EXPECT_THROW(mp::layers_from_counts("3,x,5", 3, 8), std::invalid_argument);
  EXPECT_THROW(mp::layers_from_counts("3,,5", 3, 8), std::invalid_argument);
}

TEST(Partition, RefusesMoreStagesThanBlocks) {
  try {
    mp::balance_layers(std::vector<double>(4, 1.0), 5, 0, 0);
    ADD_FAILURE() << "5 stages of 4 blocks accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("4 blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mp::equal_layers(6, 4), std::invalid_argument);
  EXPECT_EQ(mp::equal_layers(8, 4), (Spans{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
}
