// The executor on toy stages (ranks as threads, no model): values and gradients travel through
// every stage in the right order for each schedule, micro-batches in flight and saved bytes
// follow the schedule's bound, and bad inputs are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/comm/world.h"
#include "meshtrain/pipeline/executor.h"
#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"

namespace mp = meshtrain::pipeline;
using meshtrain::Shape;
using meshtrain::Tensor;
namespace nn = meshtrain::nn;

namespace {

constexpr int64_t kN = 256;  // floats per activation

// Stage s: y = 2 x + s (the first stage starts from x = micro-batch index); backward dx = 2 dy
// (the last stage starts from dy = 1). Forward saves its input (kN floats) until backward.
class ToyStage : public mp::StageRunner {
 public:
  ToyStage(int stage, int stages) : stage_(stage), stages_(stages) {}
  Tensor forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal&) override {
    Tensor x = Tensor::empty({kN});
    for (int64_t i = 0; i < kN; ++i) x.data()[i] = stage_ == 0 ? static_cast<float>(mb) : input.data()[i];
    ctx.save(this, {x});
    Tensor y = Tensor::empty({kN});
    for (int64_t i = 0; i < kN; ++i) y.data()[i] = 2 * x.data()[i] + static_cast<float>(stage_);
    order.push_back("F" + std::to_string(mb));
    if (stage_ == stages_ - 1) {
      outputs.resize(std::max<size_t>(outputs.size(), mb + 1));
      outputs[mb] = y.data()[kN - 1];
      return Tensor();
    }
    return y;
  }
  Tensor backward(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal&) override {
    ctx.saved(this);  // throws if forward saved nothing
    ctx.release(this);
    order.push_back("B" + std::to_string(mb));
    if (last) ++last_calls;
    Tensor dx = Tensor::empty({kN});
    for (int64_t i = 0; i < kN; ++i) dx.data()[i] = 2 * (stage_ == stages_ - 1 ? 1.f : dy.data()[i]);
    if (stage_ == 0) {
      grads.resize(std::max<size_t>(grads.size(), mb + 1));
      grads[mb] = dx.data()[0];
      return Tensor();
    }
    return dx;
  }
  // Split: I gives dx now (the same as backward's) and leaves a deferred weight gradient in the
  // context, holding kN floats; W runs it.
  Tensor backward_input(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) override {
    ctx.defer([this, mb](nn::Context&) { order.push_back("W" + std::to_string(mb)); }, kN * 4);
    Tensor dx = backward(ctx, mb, dy, false, portal);
    order.back()[0] = 'I';
    if (last) ++last_calls;
    return dx;
  }
  void backward_weights(nn::Context& ctx, int mb, bool last) override {
    ASSERT_TRUE(ctx.has_deferred()) << "W without its I";
    ctx.run_deferred();
    if (last) ++last_calls;
  }
  Shape boundary_shape() const override { return {kN}; }

  int stage_, stages_;
  std::vector<float> outputs, grads;  // last stage: y of each micro-batch; first stage: dx
  std::vector<std::string> order;
  int last_calls = 0;
};

struct RankResult {
  std::vector<mp::StepStats> steps;
  std::vector<std::vector<float>> outputs, grads;  // per chunk
  std::vector<int> last_calls;
};

std::vector<RankResult> run(const std::string& name, mp::ScheduleShape shape, int steps = 2) {
  const mp::Schedule schedule = mp::add_send_recv(mp::make_schedule(name, shape));
  std::vector<RankResult> out(shape.pp);
  meshtrain::comm::run_world(meshtrain::comm::Backend::threads, shape.pp, [&](meshtrain::comm::Communicator& world) {
    const int r = world.rank();
    std::vector<std::unique_ptr<ToyStage>> stages;
    std::vector<mp::StageRunner*> runners;
    for (int c = 0; c < shape.chunks; ++c) {
      stages.push_back(std::make_unique<ToyStage>(shape.stage_of(r, c), shape.stages()));
      runners.push_back(stages.back().get());
    }
    mp::Executor exec(schedule, r, &world, runners, 1);
    for (int s = 0; s < steps; ++s) out[r].steps.push_back(exec.run_step());
    for (auto& st : stages) {
      out[r].outputs.push_back(st->outputs);
      out[r].grads.push_back(st->grads);
      out[r].last_calls.push_back(st->last_calls);
    }
  });
  return out;
}

// y after all stages for micro-batch mb: x_{s+1} = 2 x_s + s.
float expected_output(int mb, int stages) {
  double x = mb;
  for (int s = 0; s < stages; ++s) x = 2 * x + s;
  return static_cast<float>(x);
}

}  // namespace

class ExecutorSchedules : public ::testing::TestWithParam<std::tuple<std::string, int, int, int>> {};

TEST_P(ExecutorSchedules, ValuesAndGradientsCrossEveryStage) {
  auto [name, pp, m, v] = GetParam();
  const mp::ScheduleShape shape{pp, m, v};
  auto ranks = run(name, shape);
  const int S = shape.stages();
  const int last_rank = shape.rank_of(S - 1), last_chunk = shape.chunk_of(S - 1);
  const auto& outs = ranks[last_rank].outputs[last_chunk];
  ASSERT_EQ(outs.size(), static_cast<size_t>(m));
  for (int mb = 0; mb < m; ++mb) EXPECT_EQ(outs[mb], expected_output(mb, S)) << "micro-batch " << mb;
  const auto& grads = ranks[0].grads[0];
  ASSERT_EQ(grads.size(), static_cast<size_t>(m));
  for (int mb = 0; mb < m; ++mb) EXPECT_EQ(grads[mb], std::ldexp(1.f, S)) << "micro-batch " << mb;
  for (int r = 0; r < pp; ++r)
    for (int c = 0; c < v; ++c)  // one last backward per chunk and step (I and W each, when split)
      EXPECT_EQ(ranks[r].last_calls[c], name == "zb-h1" ? 4 : 2);
}

INSTANTIATE_TEST_SUITE_P(
    All, ExecutorSchedules,
    ::testing::Values(std::tuple{"naive", 1, 3, 1}, std::tuple{"naive", 3, 2, 1}, std::tuple{"gpipe", 2, 4, 1},
                      std::tuple{"gpipe", 4, 3, 1}, std::tuple{"1f1b", 2, 5, 1}, std::tuple{"1f1b", 4, 8, 1},
                      std::tuple{"1f1b", 3, 1, 1}, std::tuple{"interleaved", 2, 4, 2},
                      std::tuple{"interleaved", 2, 2, 3}, std::tuple{"interleaved", 4, 8, 2},
                      std::tuple{"zb-h1", 2, 4, 1}, std::tuple{"zb-h1", 4, 8, 1}, std::tuple{"zb-h1", 3, 2, 1}),
    [](const auto& info) {
      if (std::get<0>(info.param) == "zb-h1")
        return "zbh1_p" + std::to_string(std::get<1>(info.param)) + "_m" + std::to_string(std::get<2>(info.param));
      return std::get<0>(info.param) == "1f1b" ? "onef1b_p" + std::to_string(std::get<1>(info.param)) + "_m" +
                                                     std::to_string(std::get<2>(info.param))
                                               : std::get<0>(info.param) + "_p" + std::to_string(std::get<1>(info.param)) +
                                                     "_m" + std::to_string(std::get<2>(info.param)) + "_v" +
                                                     std::to_string(std::get<3>(info.param));
    });

// GPipe keeps every micro-batch's activations until the flush; 1F1B at most pp - rank.
TEST(Executor, InFlightAndSavedBytesFollowTheSchedule) {
  const int pp = 4, m = 8;
  const int64_t per_mb = kN * static_cast<int64_t>(sizeof(float));
  auto gpipe = run("gpipe", {pp, m, 1}, 1);
  auto ofob = run("1f1b", {pp, m, 1}, 1);
  for (int r = 0; r < pp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(gpipe[r].steps[0].max_in_flight, m);
    EXPECT_EQ(gpipe[r].steps[0].peak_saved_bytes, m * per_mb);
    EXPECT_EQ(ofob[r].steps[0].max_in_flight, pp - r);
    EXPECT_EQ(ofob[r].steps[0].peak_saved_bytes, (pp - r) * per_mb);
  }
  for (int m2 : {2, 4, 16}) {  // GPipe grows linearly with m; 1F1B stays at pp on rank 0
    EXPECT_EQ(run("gpipe", {2, m2, 1}, 1)[0].steps[0].peak_saved_bytes, m2 * per_mb);
    EXPECT_EQ(run("1f1b", {2, m2, 1}, 1)[0].steps[0].peak_saved_bytes, std::min(m2, 2) * per_mb);
  }
}

TEST(Executor, TimelineHoldsEveryActionInOrder) {
  auto ranks = run("1f1b", {2, 3, 1}, 1);
  const mp::Schedule s = mp::add_send_recv(mp::make_schedule("1f1b", {2, 3, 1}));
  for (int r = 0; r < 2; ++r) {
    const auto& tl = ranks[r].steps[0].timeline;
    ASSERT_EQ(tl.size(), s.ranks[r].size());
    for (size_t i = 0; i < tl.size(); ++i) {
      EXPECT_EQ(tl[i].action, s.ranks[r][i]);
      EXPECT_LE(tl[i].start_us, tl[i].end_us);
      if (i) {
        EXPECT_LE(tl[i - 1].end_us, tl[i].start_us);
      }
    }
    EXPECT_GT(ranks[r].steps[0].compute_us, 0.0);
    EXPECT_GE(ranks[r].steps[0].bubble, 0.0);
    EXPECT_LT(ranks[r].steps[0].bubble, 1.0);
  }
}

TEST(Executor, RefusesWhatItCannotRun) {
  ToyStage a(0, 1);
  std::vector<mp::StageRunner*> one{&a};
  // A stage that cannot split its backward refuses I with a sentence instead of running wrongly.
  struct Unsplit : mp::StageRunner {
    Tensor forward(nn::Context&, int, const Tensor&, nn::Portal&) override { return Tensor(); }
    Tensor backward(nn::Context&, int, const Tensor&, bool, nn::Portal&) override { return Tensor(); }
    Shape boundary_shape() const override { return {1}; }
  } unsplit;
  mp::Executor zb(mp::make_schedule("zb-h1", {1, 2, 1}), 0, nullptr, {&unsplit}, 1);
  EXPECT_THROW(zb.run_step(), std::invalid_argument);
  // Chunks that do not match the schedule, and a pipeline without its group.
  EXPECT_THROW(mp::Executor(mp::make_schedule("interleaved", {1, 2, 2}), 0, nullptr, one, 1), std::invalid_argument);
  EXPECT_THROW(mp::Executor(mp::make_schedule("1f1b", {2, 2, 1}), 0, nullptr, one, 1), std::invalid_argument);
  // A hand-broken list (a backward before its forward) is refused by validation.
  mp::Schedule broken;
  broken.name = "custom";
  broken.shape = {1, 1, 1};
  broken.ranks = {mp::parse_actions("0B0 0F0")};
  try {
    mp::Executor(broken, 0, nullptr, one, 1);
    ADD_FAILURE() << "a backward before its forward was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("invalid schedule"), std::string::npos) << e.what();
  }
}

// ZB-H1 defers W: rank 0's weight gradients run after later micro-batches' input gradients, so
// a context lives from F to W; the deferred bytes count as held.
TEST(Executor, ZeroBubbleRunsWeightGradientsLate) {
  auto ranks = run("zb-h1", {2, 4, 1}, 1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(ranks[r].steps[0].max_in_flight, 1);
    EXPECT_GT(ranks[r].steps[0].peak_saved_bytes, 0);
  }
  const mp::Schedule s = mp::make_schedule("zb-h1", {2, 4, 1});
  // The compute order each rank ran is the generator's list.
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> want;
    for (const mp::Action& a : s.ranks[r]) want.push_back(std::string(mp::to_string(a.kind)) + std::to_string(a.microbatch));
    std::vector<std::string> got;
    for (const auto& t : ranks[r].steps[0].timeline)
      if (mp::is_compute(t.action.kind))
        got.push_back(std::string(mp::to_string(t.action.kind)) + std::to_string(t.action.microbatch));
    EXPECT_EQ(got, want) << "rank " << r;
  }
}

// ---- skip connections across stages (portals) ----

namespace {

// Stage `from` hands its input x to stage `to`, which adds it to its own input: y_to =
// 2 (x + p) + to. Backward: the consumer returns dp = 2 dy for the portal, the producer adds it
// to its input gradient.
class PortalStage : public ToyStage {
 public:
  PortalStage(int stage, int stages, int from, int to) : ToyStage(stage, stages), from_(from), to_(to) {}
  int portal_to() const override { return stage_ == from_ ? to_ : -1; }
  int portal_from() const override { return stage_ == to_ ? from_ : -1; }
  Tensor forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal) override {
    Tensor x = input;
    if (stage_ == 0) {
      x = Tensor::empty({kN});
      for (int64_t i = 0; i < kN; ++i) x.data()[i] = static_cast<float>(mb);
    }
    if (stage_ == from_) portal.out = x.clone();
    if (stage_ == to_) {
      Tensor sum = Tensor::empty({kN});
      for (int64_t i = 0; i < kN; ++i) sum.data()[i] = x.data()[i] + portal.in.data()[i];
      x = sum;
    }
    return ToyStage::forward(ctx, mb, x, portal);
  }
  Tensor backward(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) override {
    Tensor dx = ToyStage::backward(ctx, mb, dy, last, portal);
    const float d = stage_ == 0 ? grads[mb] : dx.data()[0];  // 2 dy, the same in every element
    if (stage_ == to_) {
      portal.out = Tensor::empty({kN});
      portal.out.fill(d);
    }
    if (stage_ == from_) {
      if (stage_ == 0) grads[mb] += portal.in.data()[0];
      else
        for (int64_t i = 0; i < kN; ++i) dx.data()[i] += portal.in.data()[i];
    }
    return dx;
  }
  int from_, to_;
};

}  // namespace

class ExecutorPortals : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(ExecutorPortals, SkipTensorGoesStraightToItsStageAndItsGradientBack) {
  auto [name, pp, v] = GetParam();
  const int m = 4;
  const mp::ScheduleShape shape{pp, m, v};
  const int S = shape.stages(), from = 0, to = S - 1;
  const mp::Schedule schedule = mp::add_send_recv(mp::make_schedule(name, shape));
  std::vector<std::vector<mp::StepStats>> stats(pp);
  std::vector<float> outputs, grads;
  meshtrain::comm::run_world(meshtrain::comm::Backend::threads, pp, [&](meshtrain::comm::Communicator& world) {
    const int r = world.rank();
    std::vector<std::unique_ptr<PortalStage>> stages;
    std::vector<mp::StageRunner*> runners;
    for (int c = 0; c < v; ++c) {
      stages.push_back(std::make_unique<PortalStage>(shape.stage_of(r, c), S, from, to));
      runners.push_back(stages.back().get());
    }
    mp::Executor exec(schedule, r, &world, runners, 1);
    stats[r].push_back(exec.run_step());
    exec.forward_only(m);  // evaluation carries the skip tensor too
    for (auto& st : stages) {
      if (st->stage_ == to) outputs = st->outputs;
      if (st->stage_ == 0) grads = st->grads;
    }
  });
  // Forward: x_{s+1} = 2 x_s + s, and the last stage adds the first stage's input first.
  for (int mb = 0; mb < m; ++mb) {
    double x = mb;
    for (int st = 0; st < S; ++st) x = 2 * (x + (st == to ? mb : 0)) + st;
    EXPECT_EQ(outputs[mb], static_cast<float>(x)) << "micro-batch " << mb;
    // Backward: 2^S through the chain plus 2 through the skip.
    EXPECT_EQ(grads[mb], std::ldexp(1.f, S) + 2.f) << "micro-batch " << mb;
  }
  // Only the two end ranks move the skip tensor: m tensors forward, m gradients back.
  const int64_t bytes = m * kN * 4;
  for (int r = 0; r < pp; ++r) {
    const auto& st = stats[r][0];
    const bool end = r == shape.rank_of(from) || r == shape.rank_of(to);
    const bool local = shape.rank_of(from) == shape.rank_of(to);
    EXPECT_EQ(st.portal_bytes_sent, end && !local ? bytes : 0) << "rank " << r;
    EXPECT_EQ(st.portal_bytes_received, end && !local ? bytes : 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, ExecutorPortals,
                         ::testing::Values(std::tuple{"gpipe", 4, 1}, std::tuple{"1f1b", 4, 1},
                                           std::tuple{"zb-h1", 4, 1}, std::tuple{"1f1b", 2, 1},
                                           std::tuple{"interleaved", 2, 2}),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           n = n == "1f1b" ? "onef1b" : n == "zb-h1" ? "zbh1" : n;
                           return n + "_p" + std::to_string(std::get<1>(info.param)) + "_v" +
                                  std::to_string(std::get<2>(info.param));
                         });

// ---- asynchronous schedules (pipedream-2bw): windows without a flush ----

namespace {

// Records every F and B with the micro-batch counted over steps (the window's step t: mb >= 0
// is t m + mb, mb < 0 the step before's), and checks the values as ToyStage does.
class CountingStage : public mp::StageRunner {
 public:
  CountingStage(int stage, int stages, int m) : stage_(stage), stages_(stages), m_(m) {}
  Tensor forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal&) override {
    EXPECT_GE(mb, 0) << "a forward of the step before";
    const int64_t id = step * m_ + mb;
    Tensor x = Tensor::empty({kN});
    for (int64_t i = 0; i < kN; ++i) x.data()[i] = stage_ == 0 ? static_cast<float>(id) : input.data()[i];
    ctx.save(this, {x});
    events.push_back({'F', id});
    Tensor y = Tensor::empty({kN});
    for (int64_t i = 0; i < kN; ++i) y.data()[i] = 2 * x.data()[i] + static_cast<float>(stage_);
    if (stage_ == stages_ - 1) {
      outputs[id] = y.data()[0];
      return Tensor();
    }
    return y;
  }
  Tensor backward(nn::Context& ctx, int mb, const Tensor& dy, bool, nn::Portal&) override {
    const int64_t id = (mb >= 0 ? step : step - 1) * m_ + (mb >= 0 ? mb : m_ + mb);
    ctx.saved(this);
    ctx.release(this);
    events.push_back({'B', id});
    Tensor dx = Tensor::empty({kN});
    for (int64_t i = 0; i < kN; ++i) dx.data()[i] = 2 * (stage_ == stages_ - 1 ? 1.f : dy.data()[i]);
    if (stage_ == 0) {
      grads[id] = dx.data()[0];
      return Tensor();
    }
    return dx;
  }
  Shape boundary_shape() const override { return {kN}; }

  int stage_, stages_, m_;
  int64_t step = 0;  // the step of the window being run (a drain: the step after the last one)
  std::vector<std::pair<char, int64_t>> events;
  std::map<int64_t, float> outputs, grads;
};

}  // namespace

// Four steps with a flush after the second: every micro-batch of every step runs one forward
// and one backward on every stage, in that order, with the right values; the next step's
// forwards run while the step before's backwards are owed (no flush), and the drain leaves
// nothing in flight.
TEST(Executor, PipeDream2BWWindowsRunEveryMicroBatchOnceWithoutAFlush) {
  for (auto [pp, m] : {std::pair{2, 2}, std::pair{2, 5}, std::pair{4, 4}, std::pair{4, 6}}) {
    SCOPED_TRACE("pp " + std::to_string(pp) + ", m " + std::to_string(m));
    const mp::Schedule schedule = mp::make_schedule("pipedream-2bw", {pp, m, 1});
    ASSERT_EQ(schedule.period, m);
    const int steps = 4, flush_after = 1;
    std::vector<std::vector<std::pair<char, int64_t>>> events(pp);
    std::vector<std::map<int64_t, float>> outputs(pp), grads(pp);
    std::vector<std::vector<bool>> in_flight(pp);
    std::vector<int> max_in_flight(pp, 0);
    meshtrain::comm::run_world(meshtrain::comm::Backend::threads, pp, [&](meshtrain::comm::Communicator& world) {
      const int r = world.rank();
      CountingStage stage(r, pp, m);
      mp::Executor exec(schedule, r, &world, {&stage}, 1);
      for (int t = 0; t < steps; ++t) {
        stage.step = t;
        max_in_flight[r] = std::max(max_in_flight[r], exec.run_step().max_in_flight);
        in_flight[r].push_back(exec.in_flight());
        if (t == flush_after || t == steps - 1) {
          stage.step = t + 1;  // the drain's micro-batches are the step before's
          exec.drain();
          EXPECT_FALSE(exec.in_flight());
          EXPECT_EQ(exec.drain().timeline.size(), 0u) << "a second drain has nothing to do";
        }
      }
      events[r] = stage.events, outputs[r] = stage.outputs, grads[r] = stage.grads;
    });
    for (int r = 0; r < pp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      std::map<int64_t, int> f_at, b_at;
      for (int i = 0; i < static_cast<int>(events[r].size()); ++i) {
        auto [kind, id] = events[r][i];
        auto& at = kind == 'F' ? f_at : b_at;
        EXPECT_EQ(at.count(id), 0u) << kind << id << " twice";
        at[id] = i;
      }
      EXPECT_EQ(f_at.size(), static_cast<size_t>(steps * m));
      EXPECT_EQ(b_at.size(), static_cast<size_t>(steps * m));
      for (auto [id, i] : b_at) EXPECT_LT(f_at.at(id), i) << "B" << id << " before its forward";
      // Without a flush between steps 2 and 3, rank r runs step 3's first forward before step
      // 2's last backward exactly when 1F1B's warm-up holds forwards back (r < pp - 1).
      EXPECT_EQ(f_at.at(3 * m) < b_at.at(3 * m - 1), r < pp - 1);
      // After the flush, step 2 starts with nothing owed.
      EXPECT_GT(f_at.at(2 * m), b_at.at(2 * m - 1));
      EXPECT_EQ(in_flight[r][2], r < pp - 1) << "owed backwards after a steady window";
      EXPECT_LE(max_in_flight[r], pp - r) << "more in flight than 1F1B's bound";
    }
    for (int64_t id = 0; id < steps * m; ++id) {
      EXPECT_EQ(outputs[pp - 1].at(id), expected_output(static_cast<int>(id), pp)) << id;
      EXPECT_EQ(grads[0].at(id), std::ldexp(1.f, pp)) << id;
    }
  }
}

TEST(Executor, PipeDream2BWNeedsAsManyMicroBatchesAsRanks) {
  try {
    mp::make_schedule("pipedream-2bw", {4, 3, 1});
    ADD_FAILURE() << "m < pp accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--microbatches 4"), std::string::npos) << e.what();
  }
}
