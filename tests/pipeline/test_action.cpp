// The text form of pipeline actions: printing, parsing, and the round trip between them.
#include <gtest/gtest.h>

#include <stdexcept>

#include "meshtrain/pipeline/action.h"

namespace mp = meshtrain::pipeline;
using mp::Action;
using mp::Kind;

TEST(PipelineAction, PrintsThePaperNotation) {
  EXPECT_EQ(mp::to_string(Action{2, Kind::F, 0, 0}), "2F0");
  EXPECT_EQ(mp::to_string(Action{1, Kind::B, 3, 0}), "1B3");
  EXPECT_EQ(mp::to_string(Action{0, Kind::I, 2, 0}), "0I2");
  EXPECT_EQ(mp::to_string(Action{0, Kind::W, 2, 0}), "0W2");
  EXPECT_EQ(mp::to_string(Action{1, Kind::SEND_F, 0, 0}), "1SEND_F0");
  EXPECT_EQ(mp::to_string(Action{2, Kind::RECV_F, 0, 0}), "2RECV_F0");
  EXPECT_EQ(mp::to_string(Action{2, Kind::SEND_B, 7, 0}), "2SEND_B7");
  EXPECT_EQ(mp::to_string(Action{1, Kind::RECV_B, 7, 0}), "1RECV_B7");
  EXPECT_EQ(mp::to_string(Action{5, Kind::F, 1, 1}), "5F1c1");
}

TEST(PipelineAction, ParsesEachField) {
  const Action a = mp::parse_action("12SEND_B34c2");
  EXPECT_EQ(a.stage, 12);
  EXPECT_EQ(a.kind, Kind::SEND_B);
  EXPECT_EQ(a.microbatch, 34);
  EXPECT_EQ(a.chunk, 2);
  EXPECT_EQ(mp::parse_action("0W2"), (Action{0, Kind::W, 2, 0}));
}

TEST(PipelineAction, RoundTripsEveryKindStageMicrobatchAndChunk) {
  for (Kind k : {Kind::F, Kind::B, Kind::I, Kind::W, Kind::SEND_F, Kind::RECV_F, Kind::SEND_B, Kind::RECV_B})
    for (int stage : {0, 1, 7, 15})
      for (int mb : {0, 3, 10, 127})
        for (int chunk : {0, 1, 3}) {
          const Action a{stage, k, mb, chunk};
          EXPECT_EQ(mp::parse_action(mp::to_string(a)), a) << mp::to_string(a);
        }
}

TEST(PipelineAction, ParsesAndPrintsLists) {
  const auto list = mp::parse_actions("  0F0 0F1\n0B0\t0B1 ");
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[2], (Action{0, Kind::B, 0, 0}));
  EXPECT_EQ(mp::to_string(list), "0F0 0F1 0B0 0B1");
  EXPECT_TRUE(mp::parse_actions("").empty());
}

TEST(PipelineAction, RejectsTextThatIsNotAnAction) {
  for (const char* bad : {"", "F0", "2X0", "2F", "2f0", "2F0c", "2F0x1", "2F0c1z", "2SEND0", "-1F0",
                          "99999999999F0"}) {
    EXPECT_THROW(mp::parse_action(bad), std::invalid_argument) << "'" << bad << "'";
  }
  try {
    mp::parse_action("2X0");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'2X0'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("SEND_F"), std::string::npos) << e.what();
  }
}
