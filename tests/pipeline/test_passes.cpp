// add_send_recv and validate: the communication a schedule needs, and hand-broken schedules
// that validation must reject at the right cell.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "meshtrain/pipeline/grid.h"
#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"

namespace mp = meshtrain::pipeline;
using mp::Kind;

namespace {

// Position of the action written `text` in rank r's list, or -1.
int find(const mp::Schedule& s, int r, const std::string& text) {
  const mp::Action a = mp::parse_action(text);
  const auto& list = s.ranks[r];
  auto it = std::find(list.begin(), list.end(), a);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

int count(const mp::Schedule& s, Kind k) {
  int n = 0;
  for (const auto& list : s.ranks)
    for (const mp::Action& a : list) n += a.kind == k;
  return n;
}

void expect_fault(const mp::Schedule& s, int rank, int position, const std::string& action,
                  const std::string& words) {
  const auto fault = mp::validate(s);
  ASSERT_TRUE(fault) << "validation passed:\n" << mp::format_lists(s);
  EXPECT_EQ(fault->rank, rank) << fault->to_string();
  EXPECT_EQ(fault->position, position) << fault->to_string();
  EXPECT_EQ(mp::to_string(fault->action), action) << fault->to_string();
  EXPECT_NE(fault->problem.find(words), std::string::npos) << fault->to_string();
}

}  // namespace

// ---- add_send_recv ----

TEST(PipelinePasses, AddsOneSendAndOneReceivePerCrossRankEdge) {
  // Every stage boundary s | s+1 carries m activations forward and m gradients back.
  for (int pp : {2, 3, 4})
    for (int m : {1, 3, 4}) {
      const mp::Schedule s = mp::add_send_recv(mp::make_schedule("1f1b", {pp, m, 1}));
      EXPECT_TRUE(s.has_comm);
      const int edges = (pp - 1) * m;
      EXPECT_EQ(count(s, Kind::SEND_F), edges);
      EXPECT_EQ(count(s, Kind::RECV_F), edges);
      EXPECT_EQ(count(s, Kind::SEND_B), edges);
      EXPECT_EQ(count(s, Kind::RECV_B), edges);
    }
}

TEST(PipelinePasses, PlacesReceivesJustBeforeAndSendsJustAfterTheirCompute) {
  const mp::Schedule s = mp::add_send_recv(mp::make_schedule("gpipe", {2, 1, 1}));
  EXPECT_EQ(mp::to_string(s.ranks[0]), "0F0 0SEND_F0 0RECV_B0 0B0");
  EXPECT_EQ(mp::to_string(s.ranks[1]), "1RECV_F0 1F0 1B0 1SEND_B0");
}

TEST(PipelinePasses, InterleavedStagesWrapFromTheLastRankToTheFirst) {
  // pp = 2, v = 2: stage 1 (rank 1) feeds stage 2, which is rank 0's second chunk.
  const mp::Schedule s = mp::add_send_recv(mp::make_schedule("interleaved", {2, 2, 2}));
  EXPECT_GE(find(s, 1, "1SEND_F0"), 0);
  EXPECT_GE(find(s, 0, "2RECV_F0c1"), 0);
  EXPECT_GE(find(s, 0, "2SEND_B0c1"), 0);
  EXPECT_GE(find(s, 1, "1RECV_B0"), 0);
  EXPECT_EQ(find(s, 0, "0RECV_F0"), -1);  // stage 0 has no previous stage
  EXPECT_EQ(find(s, 1, "3SEND_F0c1"), -1);  // and the last stage no next one
}

TEST(PipelinePasses, StagesOnOneRankNeedNoCommunication) {
  const mp::Schedule s = mp::add_send_recv(mp::make_schedule("interleaved", {1, 3, 3}));
  for (Kind k : {Kind::SEND_F, Kind::RECV_F, Kind::SEND_B, Kind::RECV_B}) EXPECT_EQ(count(s, k), 0);
  EXPECT_FALSE(mp::validate(s));
}

TEST(PipelinePasses, AddingCommunicationTwiceChangesNothing) {
  const mp::Schedule once = mp::add_send_recv(mp::make_schedule("zb-h1", {3, 4, 1}));
  const mp::Schedule twice = mp::add_send_recv(once);
  EXPECT_EQ(once.ranks, twice.ranks);
}

// ---- validate: hand-broken schedules ----

TEST(PipelineValidate, BackwardSwappedBeforeItsForward) {
  mp::Schedule s = mp::add_send_recv(mp::make_schedule("1f1b", {2, 2, 1}));
  const int f = find(s, 1, "1F0"), b = find(s, 1, "1B0");
  ASSERT_LT(f, b);
  std::swap(s.ranks[1][f], s.ranks[1][b]);
  expect_fault(s, 1, f, "1B0", "1F0 does not come before it");
  EXPECT_NE(mp::format_lists(s, mp::validate(s)).find("[1B0]"), std::string::npos);
}

TEST(PipelineValidate, DroppedReceiveLeavesItsSendUnmatched) {
  mp::Schedule s = mp::add_send_recv(mp::make_schedule("gpipe", {2, 2, 1}));
  const int recv = find(s, 1, "1RECV_F1");
  ASSERT_GE(recv, 0);
  s.ranks[1].erase(s.ranks[1].begin() + recv);
  // Cells are scanned rank by rank, so rank 0's send is the first to notice.
  expect_fault(s, 0, find(s, 0, "0SEND_F1"), "0SEND_F1", "no matching receive 1RECV_F1 on rank 1");
}

TEST(PipelineValidate, DroppedReceiveOnTheLastRankStarvesItsForward) {
  // With the sending rank's cells fine, the receiving rank's F is the faulty cell: here the
  // send of 0SEND_F1 is dropped as well, so rank 0 is consistent.
  mp::Schedule s = mp::add_send_recv(mp::make_schedule("gpipe", {2, 2, 1}));
  s.ranks[0].erase(s.ranks[0].begin() + find(s, 0, "0SEND_F1"));
  s.ranks[1].erase(s.ranks[1].begin() + find(s, 1, "1RECV_F1"));
  expect_fault(s, 1, find(s, 1, "1F1"), "1F1", "1RECV_F1 does not come before it");
}

TEST(PipelineValidate, DroppedSendLeavesItsReceiveUnmatched) {
  mp::Schedule s = mp::add_send_recv(mp::make_schedule("gpipe", {2, 2, 1}));
  s.ranks[1].erase(s.ranks[1].begin() + find(s, 1, "1SEND_B1"));
  expect_fault(s, 0, find(s, 0, "0RECV_B1"), "0RECV_B1", "no matching send 1SEND_B1 on rank 1");
}

TEST(PipelineValidate, MicrobatchOutOfRange) {
  mp::Schedule s = mp::add_send_recv(mp::make_schedule("1f1b", {2, 2, 1}));
  s.ranks[0].push_back(mp::parse_action("0RECV_B5"));
  expect_fault(s, 0, static_cast<int>(s.ranks[0].size()) - 1, "0RECV_B5", "micro-batch 5 does not exist");
}

TEST(PipelineValidate, MissingBackward) {
  mp::Schedule s = mp::make_schedule("gpipe", {2, 2, 1});
  s.ranks[1].erase(s.ranks[1].begin() + find(s, 1, "1B1"));
  // Reported at the end of rank 1's list, where the action should have been.
  expect_fault(s, 1, static_cast<int>(s.ranks[1].size()), "1B1", "never runs backward");
  EXPECT_NE(mp::format_lists(s, mp::validate(s)).find("[1B1?]"), std::string::npos);
}

TEST(PipelineValidate, WeightGradientBeforeItsInputGradient) {
  mp::Schedule s = mp::make_schedule("zb-h1", {2, 3, 1});
  const int i = find(s, 0, "0I0"), w = find(s, 0, "0W0");
  ASSERT_LT(i, w);
  std::swap(s.ranks[0][i], s.ranks[0][w]);
  expect_fault(s, 0, i, "0W0", "0I0 does not come before it");
}

TEST(PipelineValidate, InputGradientWithoutWeightGradient) {
  mp::Schedule s = mp::make_schedule("zb-h1", {2, 3, 1});
  s.ranks[1].erase(s.ranks[1].begin() + find(s, 1, "1W2"));
  expect_fault(s, 1, static_cast<int>(s.ranks[1].size()), "1W2", "never its weight gradient");
}

TEST(PipelineValidate, DuplicatedForward) {
  mp::Schedule s = mp::make_schedule("1f1b", {2, 2, 1});
  s.ranks[0].push_back(mp::parse_action("0F1"));
  expect_fault(s, 0, static_cast<int>(s.ranks[0].size()) - 1, "0F1", "duplicate");
}

TEST(PipelineValidate, ActionOnTheWrongRankOrChunk) {
  mp::Schedule s = mp::make_schedule("1f1b", {2, 2, 1});
  s.ranks[0][0] = mp::parse_action("1F0");
  expect_fault(s, 0, 0, "1F0", "lives on rank 1");
  mp::Schedule t = mp::make_schedule("interleaved", {2, 2, 2});
  t.ranks[0][2].chunk = 0;  // 2F0c1 written as 2F0
  expect_fault(t, 0, 2, "2F0", "chunk 1");
}

TEST(PipelineValidate, SameRankStagesNeedTheirOrder) {
  // One rank, two chunks: stage 1 may run only after stage 0 (no communication between them).
  mp::Schedule s;
  s.shape = {1, 1, 2};
  s.ranks = {mp::parse_actions("1F0c1 0F0 1B0c1 0B0")};
  expect_fault(s, 0, 0, "1F0c1", "0F0 does not come before it");
  s.ranks = {mp::parse_actions("0F0 1F0c1 0B0 1B0c1")};
  expect_fault(s, 0, 2, "0B0", "1B0c1 (or I) does not come before it");
  s.ranks = {mp::parse_actions("0F0 1F0c1 1B0c1 0B0")};
  EXPECT_FALSE(mp::validate(s));
}
