// The dry run and the simulator: known bubbles and memory bounds of the schedules, deadlocks
// built by hand, and the text swimlane.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "meshtrain/pipeline/grid.h"
#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"
#include "meshtrain/pipeline/simulate.h"

namespace mp = meshtrain::pipeline;
using mp::Kind;

namespace {

mp::Schedule custom(mp::ScheduleShape shape, const std::vector<std::string>& lists, bool has_comm) {
  mp::Schedule s;
  s.name = "custom";
  s.shape = shape;
  s.has_comm = has_comm;
  for (const std::string& text : lists) s.ranks.push_back(mp::parse_actions(text));
  return s;
}

std::string at(const char* name, int pp, int m, int v = 1) {
  return std::string(name) + " pp=" + std::to_string(pp) + " m=" + std::to_string(m) + " v=" + std::to_string(v);
}

}  // namespace

// ---- bubbles ----

// GPipe and 1F1B with a forward of cost f and a backward of cost b on every stage.
// Every rank is busy m (f + b). The step cannot end sooner than its critical path: micro-batch
// 0's forward crosses the p - 1 stages before the last ((p - 1) f), the last stage then works
// through its m forwards and m backwards without a gap (m (f + b)), and the last micro-batch's
// gradient crosses the p - 1 stages back ((p - 1) b). Both schedules reach that bound, so the
// step takes T = (m + p - 1)(f + b) and every rank idles T - m (f + b) = (p - 1)(f + b):
//   bubble fraction = (p - 1) / (m + p - 1),
// whatever f and b are.
TEST(PipelineSimulate, GPipeAndOneFOneBBubbleIsTheTextbookFraction) {
  for (const char* name : {"gpipe", "1f1b"})
    for (mp::Costs costs : {mp::Costs{}, mp::Costs{.F = 1, .B = 3}, mp::Costs{.F = 2.5, .B = 2.5}})
      for (int pp = 1; pp <= 6; ++pp)
        for (int m = 1; m <= 12; ++m) {
          const mp::Timeline t = mp::simulate(mp::add_send_recv(mp::make_schedule(name, {pp, m, 1})), costs);
          ASSERT_FALSE(t.deadlock) << at(name, pp, m);
          const double expected = double(pp - 1) / (m + pp - 1);
          EXPECT_NEAR(t.makespan, (m + pp - 1) * (costs.F + costs.B), 1e-9) << at(name, pp, m);
          for (int r = 0; r < pp; ++r) EXPECT_NEAR(t.bubble[r], expected, 1e-12) << at(name, pp, m) << " rank " << r;
        }
}

// Interleaved 1F1B (Narayanan et al. 2021): with v chunks per rank, each chunk's forward and
// backward take f / v and b / v, so filling and draining costs (p - 1)(f + b) / v against the
// m (f + b) of work: bubble = (p - 1) / (v m + p - 1). Equal costs for every action give the
// same fraction (it does not change when all costs are scaled).
TEST(PipelineSimulate, InterleavedBubbleShrinksWithTheChunkCount) {
  for (int pp = 2; pp <= 5; ++pp)
    for (int m = pp; m <= 12; m += pp)
      for (int v = 2; v <= 4; ++v) {
        const mp::Timeline t = mp::simulate(mp::add_send_recv(mp::make_schedule("interleaved", {pp, m, v})));
        ASSERT_FALSE(t.deadlock) << at("interleaved", pp, m, v);
        const double one_f_one_b = mp::simulate(mp::make_schedule("1f1b", {pp, m, 1})).bubble[0];
        const double expected = double(pp - 1) / (v * m + pp - 1);
        for (int r = 0; r < pp; ++r) {
          EXPECT_NEAR(t.bubble[r], expected, 1e-12) << at("interleaved", pp, m, v) << " rank " << r;
          if (v == 2) {
            EXPECT_LT(t.bubble[r], one_f_one_b) << at("interleaved", pp, m, v);
          }
        }
      }
}

// ZB-H1 (Qi et al. 2023): 1F1B idles (p - 1)(F + B) per rank with B = I + W; ZB-H1 moves the
// W's into that idle time and idles (p - 1)(F + I - W). With F = I = W = 1 (so B = 2) that is
// p - 1 against 3 (p - 1): the step takes 3 m + p - 1 once there are at least p micro-batches.
TEST(PipelineSimulate, ZeroBubbleH1CutsTheBubble) {
  const mp::Costs equal{.F = 1, .B = 2, .I = 1, .W = 1};
  const mp::Costs f_equals_b{.F = 2, .B = 2, .I = 1, .W = 1};
  for (int pp = 2; pp <= 6; ++pp)
    for (int m = 1; m <= 12; ++m)
      for (const bool paper_costs : {true, false}) {
        const mp::Costs c = paper_costs ? equal : f_equals_b;
        const mp::Timeline zb = mp::simulate(mp::add_send_recv(mp::make_schedule("zb-h1", {pp, m, 1})), c);
        const mp::Timeline base = mp::simulate(mp::add_send_recv(mp::make_schedule("1f1b", {pp, m, 1})), c);
        ASSERT_FALSE(zb.deadlock) << at("zb-h1", pp, m);
        EXPECT_LT(zb.makespan, base.makespan) << at("zb-h1", pp, m);
        for (int r = 0; r < pp; ++r) EXPECT_LT(zb.bubble[r], base.bubble[r]) << at("zb-h1", pp, m) << " rank " << r;
        if (paper_costs && m >= pp) {
          EXPECT_NEAR(zb.makespan, 3 * m + pp - 1, 1e-9) << at("zb-h1", pp, m);
          for (int r = 0; r < pp; ++r) EXPECT_NEAR(zb.makespan - zb.busy[r], pp - 1, 1e-9) << at("zb-h1", pp, m);
        }
      }
}

// Transfers on the critical path: the forward of micro-batch 0 and the gradient of the last
// cross p - 1 links each, so GPipe's step grows by 2 (p - 1) times the transfer time (while a
// transfer is shorter than a forward, the last stage still never waits).
TEST(PipelineSimulate, TransferTimeLengthensTheCriticalPath) {
  const mp::Costs c{.F = 1, .B = 2, .transfer = 0.5};
  for (int pp = 1; pp <= 5; ++pp)
    for (int m = 1; m <= 6; ++m) {
      const mp::Timeline t = mp::simulate(mp::add_send_recv(mp::make_schedule("gpipe", {pp, m, 1})), c);
      EXPECT_NEAR(t.makespan, (m + pp - 1) * 3.0 + 2 * (pp - 1) * 0.5, 1e-9) << at("gpipe", pp, m);
    }
}

// Measured per-action times replace the per-kind figure for exactly the actions they name.
// GPipe, p = 2, m = 2, F = 1 and B = 2 everywhere except stage 1's backward of micro-batch 0,
// which takes 5: rank 1 runs F0 [1,2], F1 [2,3], B0 [3,8], B1 [8,10]; rank 0 runs F0 [0,1],
// F1 [1,2], then waits for each gradient: B0 [8,10], B1 [10,12]. Step 12; rank 0 busy 6 (bubble
// 1/2), rank 1 busy 9 (bubble 1/4). Without the override the step is the textbook 3 x 3 = 9.
TEST(PipelineSimulate, MeasuredActionTimesOverrideTheirKind) {
  const mp::Schedule s = mp::add_send_recv(mp::make_schedule("gpipe", {2, 2, 1}));
  mp::Costs c{.F = 1, .B = 2};
  EXPECT_NEAR(mp::simulate(s, c).makespan, 9, 1e-12);
  c.measured[{Kind::B, 1, 0}] = 5;
  const mp::Timeline t = mp::simulate(s, c);
  ASSERT_FALSE(t.deadlock);
  EXPECT_NEAR(t.makespan, 12, 1e-12);
  EXPECT_NEAR(t.busy[0], 6, 1e-12);
  EXPECT_NEAR(t.busy[1], 9, 1e-12);
  EXPECT_NEAR(t.bubble[0], 0.5, 1e-12);
  EXPECT_NEAR(t.bubble[1], 0.25, 1e-12);
  const auto slow = std::find_if(t.ranks[1].begin(), t.ranks[1].end(),
                                 [](const mp::TimedAction& a) { return a.action == mp::parse_action("1B0"); });
  ASSERT_NE(slow, t.ranks[1].end());
  EXPECT_NEAR(slow->end - slow->start, 5, 1e-12);
  // An uneven last stage (every action of stage 1 twice as long) sets the pace of 1F1B:
  // step = F0 + m (F1 + B1) + B0 = 1 + 4 x 6 + 2 = 27 for m = 4.
  mp::Costs uneven{.F = 1, .B = 2};
  for (int mb = 0; mb < 4; ++mb) uneven.measured[{Kind::F, 1, mb}] = 2, uneven.measured[{Kind::B, 1, mb}] = 4;
  EXPECT_NEAR(mp::simulate(mp::add_send_recv(mp::make_schedule("1f1b", {2, 4, 1})), uneven).makespan, 27, 1e-12);
}

TEST(PipelineSimulate, TimelineKeepsEachRanksOrderAndTheDependencies) {
  const mp::Costs c{.F = 1, .B = 2, .I = 1, .W = 1, .send = 0.25, .transfer = 0.5};
  for (const auto& g : mp::generators()) {
    if (g.name == "chimera") continue;  // an even pp only; tests/train/test_chimera.cpp simulates it
    const mp::Schedule s = mp::add_send_recv(mp::make_schedule(g.name, {3, 6, g.multi_chunk ? 2 : 1}));
    const mp::Timeline t = mp::simulate(s, c);
    ASSERT_FALSE(t.deadlock) << g.name;
    std::map<std::tuple<Kind, int, int>, std::pair<double, double>> when;
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(t.ranks[r].size(), s.ranks[r].size()) << g.name;
      double clock = 0;
      for (std::size_t i = 0; i < s.ranks[r].size(); ++i) {
        const mp::TimedAction& ta = t.ranks[r][i];
        EXPECT_EQ(ta.action, s.ranks[r][i]) << g.name;
        EXPECT_GE(ta.start, clock - 1e-12) << g.name << " " << mp::to_string(ta.action);
        EXPECT_NEAR(ta.end - ta.start, c.of(ta.action.kind), 1e-12) << g.name << " " << mp::to_string(ta.action);
        clock = ta.end;
        when[{ta.action.kind, ta.action.stage, ta.action.microbatch}] = {ta.start, ta.end};
      }
    }
    for (const auto& [key, span] : when) {
      const auto [kind, stage, mb] = key;
      if (kind == Kind::F && stage > 0) {  // input from the previous stage, plus one transfer
        const double input_ready = when[std::tuple{Kind::F, stage - 1, mb}].second + c.send + c.transfer;
        EXPECT_GE(span.first, input_ready - 1e-12) << g.name;
      }
      if (kind == Kind::W) {
        const double i_done = when[std::tuple{Kind::I, stage, mb}].second;
        EXPECT_GE(span.first, i_done - 1e-12) << g.name;
      }
    }
  }
}

// ---- micro-batches in flight ----

TEST(PipelineSimulate, PeakMicrobatchesInFlight) {
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 12; ++m) {
      const auto gpipe = mp::peak_in_flight(mp::make_schedule("gpipe", {pp, m, 1}));
      const auto ofob = mp::peak_in_flight(mp::make_schedule("1f1b", {pp, m, 1}));
      const auto naive = mp::peak_in_flight(mp::make_schedule("naive", {pp, m, 1}));
      const auto zb = mp::peak_in_flight(mp::make_schedule("zb-h1", {pp, m, 1}));
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(gpipe[r], m) << at("gpipe", pp, m) << " rank " << r;
        EXPECT_EQ(ofob[r], std::min(m, pp - r)) << at("1f1b", pp, m) << " rank " << r;
        EXPECT_EQ(naive[r], 1) << at("naive", pp, m) << " rank " << r;
      }
      // ZB-H1 holds back W's on the later ranks but never more than 1F1B's worst rank.
      EXPECT_EQ(*std::max_element(zb.begin(), zb.end()), *std::max_element(ofob.begin(), ofob.end()))
          << at("zb-h1", pp, m);
      EXPECT_EQ(mp::simulate(mp::make_schedule("gpipe", {pp, m, 1})).peak_in_flight, gpipe);
    }
}

// ---- deadlocks ----

TEST(PipelineDryRun, FindsCrossedReceivesBuiltByHand) {
  // Rank 0 waits for the gradient before sending the activation that produces it; rank 1
  // waits for that activation. Each cell is in a valid order on its own rank.
  const mp::Schedule s = custom({2, 1, 1}, {"0F0 0RECV_B0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"}, true);
  ASSERT_FALSE(mp::validate(s)) << mp::validate(s)->to_string();
  const auto stuck = mp::dry_run(s);
  ASSERT_TRUE(stuck);
  ASSERT_EQ(stuck->blocked.size(), 2u) << stuck->to_string();
  EXPECT_EQ(stuck->blocked[0].rank, 0);
  EXPECT_EQ(stuck->blocked[0].position, 1);
  EXPECT_EQ(mp::to_string(stuck->blocked[0].action), "0RECV_B0");
  EXPECT_NE(stuck->blocked[0].waits.find("1SEND_B0 on rank 1"), std::string::npos) << stuck->to_string();
  EXPECT_EQ(stuck->blocked[1].rank, 1);
  EXPECT_EQ(stuck->blocked[1].position, 0);
  EXPECT_EQ(mp::to_string(stuck->blocked[1].action), "1RECV_F0");
  EXPECT_NE(stuck->blocked[1].waits.find("0SEND_F0 on rank 0"), std::string::npos) << stuck->to_string();
  // The same lists with rank 0's send first run through.
  EXPECT_FALSE(mp::dry_run(custom({2, 1, 1}, {"0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"}, true)));
}

TEST(PipelineDryRun, ReportsOnlyTheStuckRanks) {
  // Rank 1 never sends micro-batch 0's gradient back: ranks 1 and 2 finish, rank 0 waits.
  const mp::Schedule s = custom({3, 1, 1},
                                {"0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1SEND_F0 1RECV_B0 1B0",
                                 "2RECV_F0 2F0 2B0 2SEND_B0"},
                                true);
  const auto stuck = mp::dry_run(s);
  ASSERT_TRUE(stuck);
  ASSERT_EQ(stuck->blocked.size(), 1u) << stuck->to_string();
  EXPECT_EQ(stuck->blocked[0].rank, 0);
  EXPECT_EQ(stuck->blocked[0].position, 2);
  EXPECT_EQ(mp::to_string(stuck->blocked[0].action), "0RECV_B0");
  EXPECT_NE(stuck->blocked[0].waits.find("1SEND_B0 on rank 1"), std::string::npos) << stuck->to_string();
  // validate names the same hole from the receiving side.
  const auto fault = mp::validate(s);
  ASSERT_TRUE(fault);
  EXPECT_EQ(mp::to_string(fault->action), "0RECV_B0") << fault->to_string();
}

TEST(PipelineDryRun, RendezvousSendsNeedTheAsynchronousOrder) {
  // With synchronous sends, 1F1B at pp = 2, m = 2 deadlocks: rank 0 sends 0SEND_F1 while
  // rank 1, done with micro-batch 0's backward, sends 1SEND_B0; each waits for the other to
  // reach its receive. GPipe and naive never have two neighbours sending at once.
  const auto stuck = mp::dry_run(mp::add_send_recv(mp::make_schedule("1f1b", {2, 2, 1})), mp::SendMode::rendezvous);
  ASSERT_TRUE(stuck);
  ASSERT_EQ(stuck->blocked.size(), 2u) << stuck->to_string();
  EXPECT_EQ(mp::to_string(stuck->blocked[0].action), "0SEND_F1");
  EXPECT_EQ(mp::to_string(stuck->blocked[1].action), "1SEND_B0");
  EXPECT_NE(stuck->to_string().find("rank 1 to reach 1RECV_F1"), std::string::npos) << stuck->to_string();
  for (const char* name : {"gpipe", "naive"})
    for (int pp = 1; pp <= 4; ++pp)
      for (int m = 1; m <= 5; ++m)
        EXPECT_FALSE(mp::dry_run(mp::add_send_recv(mp::make_schedule(name, {pp, m, 1})), mp::SendMode::rendezvous))
            << at(name, pp, m);
  // Buffered (the default) runs 1F1B.
  EXPECT_FALSE(mp::dry_run(mp::add_send_recv(mp::make_schedule("1f1b", {2, 2, 1}))));
}

// ---- text swimlane ----

TEST(PipelineGrid, DrawsTheSimulatedSwimlane) {
  // GPipe, pp = 2, m = 2, every action one unit: rank 1 starts a unit late, runs its two
  // backwards straight after its forwards, and rank 0 follows it back.
  const mp::Timeline t = mp::simulate(mp::make_schedule("gpipe", {2, 2, 1}), mp::Costs{.F = 1, .B = 1});
  EXPECT_EQ(mp::format_timeline(t),
            "time    0   1   2   3   4   5\n"
            "rank 0  0F0 0F1 .   .   0B0 0B1\n"
            "rank 1  .   1F0 1F1 1B0 1B1 .\n");
  // Longer actions continue with '-'.
  const mp::Timeline t2 = mp::simulate(mp::make_schedule("gpipe", {1, 1, 1}), mp::Costs{.F = 1, .B = 2});
  EXPECT_EQ(mp::format_timeline(t2), "time    0   1   2\nrank 0  0F0 0B0 -\n");
}

TEST(PipelineGrid, ListsOneColumnPerRank) {
  const std::string grid = mp::format_lists(mp::make_schedule("gpipe", {2, 1, 1}));
  EXPECT_EQ(grid,
            "step  rank 0  rank 1\n"
            "0     0F0     1F0\n"
            "1     0B0     1B0\n");
}
