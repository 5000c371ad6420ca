// The schedule generators: exact lists for small shapes (written out by hand from each
// schedule's rule), the properties every generated schedule must have over a range of
// shapes, and the constraints of the table.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"
#include "meshtrain/pipeline/simulate.h"

namespace mp = meshtrain::pipeline;
using mp::Kind;

namespace {

// Each rank's list as text, to compare with lists written by hand.
std::vector<std::string> texts(const mp::Schedule& s) {
  std::vector<std::string> out;
  for (const auto& list : s.ranks) out.push_back(mp::to_string(list));
  return out;
}

struct Case {
  std::string name;
  mp::ScheduleShape shape;
};

// Every generator over a range of shapes it accepts.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& g : mp::generators())
    for (int pp = 1; pp <= 6; ++pp)
      for (int m = 1; m <= 12; ++m) {
        if (g.name == "chimera" && (pp % 2 != 0 || m % 2 != 0)) continue;  // two pipelines over rank pairs
        if (g.multi_chunk) {
          if (m % pp != 0) continue;
          for (int v = 2; v <= 4; ++v) cases.push_back({std::string(g.name), {pp, m, v}});
        } else if (!g.asynchronous || m >= pp) {  // asynchronous ones need m >= pp
          cases.push_back({std::string(g.name), {pp, m, 1}});
        }
      }
  return cases;
}

std::string label(const Case& c) {
  return c.name + " pp=" + std::to_string(c.shape.pp) + " m=" + std::to_string(c.shape.microbatches) +
         " v=" + std::to_string(c.shape.chunks);
}

}  // namespace

// ---- exact lists ----

TEST(PipelineGenerators, NaiveRunsOneMicrobatchAtATime) {
  EXPECT_EQ(texts(mp::make_schedule("naive", {2, 2, 1})),
            (std::vector<std::string>{"0F0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"}));
}

TEST(PipelineGenerators, GPipeRunsAllForwardsThenAllBackwards) {
  EXPECT_EQ(texts(mp::make_schedule("gpipe", {2, 3, 1})),
            (std::vector<std::string>{"0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"}));
}

TEST(PipelineGenerators, OneFOneBWarmsUpAlternatesAndDrains) {
  // Rank r warms up with pp - r - 1 forwards: 2, 1, 0 at pp = 3.
  EXPECT_EQ(texts(mp::make_schedule("1f1b", {3, 4, 1})),
            (std::vector<std::string>{"0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
                                      "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
                                      "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"}));
}

TEST(PipelineGenerators, InterleavedFollowsMegatronsVirtualMicrobatchOrder) {
  // pp = 2, v = 2, m = 4: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3. Forward virtual
  // micro-batches go (chunk 0: mb 0, 1), (chunk 1: mb 0, 1), (chunk 0: mb 2, 3), (chunk 1: 2, 3);
  // backward the same with the chunks reversed. Warm-up: (pp - r - 1) * 2 + (v - 1) * pp
  // = 4 on rank 0, 2 on rank 1.
  EXPECT_EQ(texts(mp::make_schedule("interleaved", {2, 4, 2})),
            (std::vector<std::string>{
                "0F0 0F1 2F0c1 2F1c1 0F2 2B0c1 0F3 2B1c1 2F2c1 0B0 2F3c1 0B1 2B2c1 2B3c1 0B2 0B3",
                "1F0 1F1 3F0c1 3B0c1 3F1c1 3B1c1 1F2 1B0 1F3 1B1 3F2c1 3B2c1 3F3c1 3B3c1 1B2 1B3"}));
}

TEST(PipelineGenerators, ZeroBubbleH1DefersWeightGradients) {
  // Rank r keeps 1F1B's warm-up and F-I alternation and runs each W r micro-batches late.
  EXPECT_EQ(texts(mp::make_schedule("zb-h1", {2, 3, 1})),
            (std::vector<std::string>{"0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2",
                                      "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2"}));
}

// ---- properties of every generated schedule ----

TEST(PipelineGenerators, EveryStageRunsEveryMicrobatchForwardAndBackwardExactlyOnce) {
  for (const Case& c : all_cases()) {
    const mp::Schedule s = mp::make_schedule(c.name, c.shape);
    ASSERT_EQ(static_cast<int>(s.ranks.size()), c.shape.pp) << label(c);
    std::map<std::tuple<Kind, int, int>, int> count;
    for (int r = 0; r < c.shape.pp; ++r)
      for (const mp::Action& a : s.ranks[r]) {
        ASSERT_TRUE(mp::is_compute(a.kind)) << label(c) << " emits " << mp::to_string(a);
        ASSERT_EQ(s.shape.rank_of(a.stage), r) << label(c) << " puts " << mp::to_string(a) << " on rank " << r;
        ASSERT_EQ(a.chunk, s.shape.chunk_of(a.stage)) << label(c) << " " << mp::to_string(a);
        ++count[{a.kind, a.stage, a.microbatch}];
      }
    for (int st = 0; st < s.shape.stages(); ++st)
      for (int mb = 0; mb < s.shape.microbatches; ++mb) {  // an asynchronous one's: every unrolled step's
        const std::string at = label(c) + " stage " + std::to_string(st) + " mb " + std::to_string(mb);
        if (!s.shape.runs(st, mb)) {  // Chimera: the other pipeline's micro-batch
          EXPECT_EQ((count[{Kind::F, st, mb}] + count[{Kind::B, st, mb}]), 0) << at;
          continue;
        }
        EXPECT_EQ((count[{Kind::F, st, mb}]), 1) << at;
        const int b = count[{Kind::B, st, mb}], i = count[{Kind::I, st, mb}], w = count[{Kind::W, st, mb}];
        EXPECT_TRUE((b == 1 && i == 0 && w == 0) || (b == 0 && i == 1 && w == 1))
            << at << ": B " << b << ", I " << i << ", W " << w;
      }
  }
}

TEST(PipelineGenerators, EveryGeneratedScheduleValidatesAndRunsWithAndWithoutCommunication) {
  for (const Case& c : all_cases()) {
    const mp::Schedule s = mp::make_schedule(c.name, c.shape);
    const auto fault = mp::validate(s);
    EXPECT_FALSE(fault) << label(c) << ": " << fault->to_string();
    const mp::Schedule with_comm = mp::add_send_recv(s);
    const auto comm_fault = mp::validate(with_comm);
    EXPECT_FALSE(comm_fault) << label(c) << ": " << comm_fault->to_string();
    const auto stuck = mp::dry_run(with_comm);
    EXPECT_FALSE(stuck) << label(c) << ":\n" << stuck->to_string();
    EXPECT_FALSE(mp::dry_run(s)) << label(c) << " (compute only)";
  }
}

TEST(PipelineGenerators, SplitBackwardIsDeclaredInTheTable) {
  for (const auto& g : mp::generators()) {
    const mp::Schedule s = mp::make_schedule(g.name, {2, 2, g.multi_chunk ? 2 : 1});
    bool has_i = false, has_b = false;
    for (const auto& list : s.ranks)
      for (const mp::Action& a : list) {
        has_i = has_i || a.kind == Kind::I;
        has_b = has_b || a.kind == Kind::B;
      }
    EXPECT_EQ(has_i, g.splits_backward) << g.name;
    EXPECT_EQ(has_b, !g.splits_backward) << g.name;
  }
}

// ---- constraints ----

TEST(PipelineGenerators, RefusesShapesAScheduleCannotRun) {
  auto message = [](const std::string& name, mp::ScheduleShape shape) -> std::string {
    try {
      mp::make_schedule(name, shape);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  // Interleaved: micro-batches a multiple of pp, at least 2 chunks.
  EXPECT_NE(message("interleaved", {4, 6, 2}).find("multiple of 4"), std::string::npos);
  EXPECT_NE(message("interleaved", {2, 4, 1}).find("at least 2 chunks"), std::string::npos);
  EXPECT_EQ(message("interleaved", {4, 8, 2}), "");
  // The others run one chunk per rank.
  EXPECT_NE(message("1f1b", {2, 4, 2}).find("one chunk per rank"), std::string::npos);
  EXPECT_NE(message("gpipe", {0, 4, 1}).find("at least 1 rank"), std::string::npos);
  EXPECT_NE(message("gpipe", {2, 0, 1}).find("at least 1 micro-batch"), std::string::npos);
  const std::string unknown = message("pipedream-3bw", {2, 2, 1});
  EXPECT_NE(unknown.find("'pipedream-3bw'"), std::string::npos) << unknown;
  // Chimera pairs ranks and halves the micro-batches.
  EXPECT_NE(message("chimera", {3, 4, 1}).find("even pp"), std::string::npos);
  EXPECT_NE(message("chimera", {2, 3, 1}).find("use an even number"), std::string::npos);
  EXPECT_NE(unknown.find("zb-h1"), std::string::npos) << unknown;
}
