// Parameter server (parallel/data/param_server.h, train/ps_trainer.h): staleness 0 reproduces the
// single-rank loss curve like all-reduce data parallelism (DESIGN decision 1); a bound of 3
// holds a fast worker exactly at 3 steps ahead of a stalled one, and with one worker slowed 2x
// no read is ever more than 3 ahead;
// the asynchronous mode finishes, learns and holds no one back; bad options are refused before
// any work. Staleness is checked on the events the server reports (reads granted, reads held),
// never on how a run happened to be scheduled.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>

#include "layout_fixture.h"
#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/parallel/data/param_server.h"
#include "meshtrain/train/ps_trainer.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/validate.h"
#include "temp_dir.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

train::TrainOptions options(int dp, int servers, int64_t staleness) {
  train::TrainOptions o = meshtrain::testing::layout_options(dp);
  o.ps_servers = servers;
  o.staleness = staleness;
  return o;
}

// Runs parameter-server training the way `meshtrain train` does (resolve, open, dispatch).
train::TrainResult run_ps(train::TrainOptions o, train::PSRunLog* log) {
  model::GPTConfig cfg = train::resolve_options(o);
  train::TokenDataset data = train::TokenDataset::open(o.data, o.val_fraction, o.seq);
  return train::train_parameter_server(o, cfg, data, log);
}

const std::vector<float>& reference_curve() {
  static std::vector<float> curve = [] {
    auto r = train::train(options(1, 0, 0));
    std::vector<float> c;
    for (auto& s : r.steps) c.push_back(s.loss);
    return c;
  }();
  return curve;
}

// Every round holds W = 2 pushes (one optimizer step per global batch); only the last may hold
// fewer, when the budget ends with a worker's push alone.
void expect_full_rounds(const train::PSRunLog& log) {
  ASSERT_FALSE(log.round_pushes.empty());
  for (size_t i = 0; i < log.round_pushes.size(); ++i) {
    EXPECT_LE(log.round_pushes[i], 2) << "round " << i;
    if (i + 1 < log.round_pushes.size()) {
      EXPECT_EQ(log.round_pushes[i], 2) << "round " << i;
    }
  }
}

double mean_loss(const std::vector<train::StepRecord>& s, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += s[i].loss;
  return sum / static_cast<double>(to - from);
}

}  // namespace

// ---- layout ----

TEST(ParamServer, ShardsCoverTheParametersUnevenly) {
  auto l = parallel::PSLayout::make(2, 3, 10);
  EXPECT_EQ(l.n, (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(l.off, (std::vector<int64_t>{0, 4, 7}));
  EXPECT_EQ(l.server_rank(0), 2);
  EXPECT_THROW(parallel::PSLayout::make(2, 3, 2), std::invalid_argument);
  EXPECT_THROW(parallel::PSLayout::make(0, 1, 10), std::invalid_argument);
}

// ---- staleness 0 == synchronous data parallelism == one rank ----

class ParamServerSync : public ::testing::TestWithParam<int> {};

TEST_P(ParamServerSync, MatchesSingleRank) {
  const auto& ref = reference_curve();
  train::PSRunLog log;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_ps(options(2, GetParam(), 0), &log);
  const double call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.steps.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    double rel = std::fabs(r.steps[i].loss - ref[i]) / std::fabs(ref[i]);
    EXPECT_LT(rel, 1e-5) << GetParam() << " server(s): step " << i << " loss " << r.steps[i].loss
                         << " vs single-rank " << ref[i];
  }
  EXPECT_LT(ref.back(), ref.front() - 0.5f);  // the curve moves, so equality proves something
  EXPECT_EQ(log.pushes, (std::vector<int64_t>{30, 30}));
  EXPECT_EQ(log.round_pushes, std::vector<int64_t>(30, 2));
  for (auto& rd : log.reads) EXPECT_LE(rd.ahead, 0) << "worker " << rd.worker << " clock " << rd.clock;
  // Each round took time, and the rounds fit inside the call that ran them.
  double sum_ms = 0;
  for (auto& s : r.steps) EXPECT_GT(s.step_ms, 0.0) << "round " << s.step, sum_ms += s.step_ms;
  EXPECT_LE(sum_ms, call_ms);
  ASSERT_TRUE(r.final_val_loss.has_value());
}

INSTANTIATE_TEST_SUITE_P(Servers, ParamServerSync, ::testing::Values(1, 2),
                         [](const auto& info) { return "servers" + std::to_string(info.param); });

// SGD and LAMB on the servers: with 2 servers a tensor may be cut between them, and LAMB's
// per-tensor norms are summed over the servers, so both stay on the single-rank curve.
TEST(ParamServerOptimizers, SgdAndLambMatchSingleRank) {
  for (auto kind : {train::OptimizerKind::sgd, train::OptimizerKind::lamb}) {
    auto single = options(1, 0, 0);
    single.steps = 10;
    single.optim.kind = kind;
    single.optim.lr = kind == train::OptimizerKind::sgd ? 0.05f : 0.02f;
    const auto ref = train::train(single).steps;
    ASSERT_LT(ref.back().loss, ref.front().loss - 0.3f) << to_string(kind);
    auto ps = single;
    ps.dp = 2, ps.ps_servers = 2;
    const auto r = run_ps(ps, nullptr);
    ASSERT_EQ(r.steps.size(), ref.size()) << to_string(kind);
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_LT(std::fabs(r.steps[i].loss - ref[i].loss) / std::fabs(ref[i].loss), 1e-5)
          << to_string(kind) << ": step " << i << " loss " << r.steps[i].loss << " vs single-rank " << ref[i].loss;
  }
}

// ---- bounded staleness ----

// The bound acting, shown by events the server reports rather than by timings: worker 0 reads
// step 0 and then waits until the server says it held worker 1 back; worker 1 runs freely. With
// s = 3 worker 1 must get steps 0..3 (3 ahead of worker 0's 0 pushes) and be held at step 4,
// and after worker 0's pushes land no read is ever more than 3 ahead.
TEST(ParamServer, StalenessBoundHoldsTheFastWorkerAtTheBound) {
  const auto layout = parallel::PSLayout::make(2, 1, 16);
  std::mutex m;
  std::condition_variable cv;
  std::vector<parallel::PSRead> holds, reads;
  comm::run_threads(3, [&](comm::Communicator& w) {
    if (w.rank() == 2) {
      std::vector<float> values(16, 0.f), grad(16, 0.f);
      parallel::PSServerOptions so{.staleness = 3, .budget = 16};
      so.on_hold = [&](const parallel::PSRead& h) {
        std::lock_guard g(m);
        holds.push_back(h);
        cv.notify_all();
      };
      parallel::ParameterServer ps(w, layout, 0, values, grad, so, [](int64_t) { return parallel::PSUpdate{}; });
      ps.serve();
      reads = ps.reads();
      return;
    }
    const int me = w.rank();
    parallel::PSWorker client(w, layout, me);
    std::vector<float> values(16), grads(16, 0.01f);
    int64_t clock = 0;
    if (me == 0) {
      ASSERT_TRUE(client.pull(0, values));
      std::unique_lock lk(m);  // hang guard only: the hold is an event, it does not depend on timing
      ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return !holds.empty(); }))
          << "the server never held the fast worker back";
      lk.unlock();
      client.push(clock++, grads, 1.0, 1e-4);
    }
    while (client.pull(clock, values)) client.push(clock++, grads, 1.0, 1e-4);
    client.finish({});
  }, {.timeout = std::chrono::seconds(60)});
  ASSERT_FALSE(holds.empty());
  EXPECT_EQ(holds[0].worker, 1);
  EXPECT_EQ(holds[0].clock, 4);
  EXPECT_EQ(holds[0].ahead, 4);
  for (auto& h : holds) EXPECT_GT(h.clock, 3) << "worker " << h.worker << " held at step " << h.clock;
  int64_t most = -1;
  for (auto& rd : reads) {
    EXPECT_LE(rd.ahead, 3) << "worker " << rd.worker << " read step " << rd.clock << " " << rd.ahead << " ahead";
    if (rd.worker == 1) most = std::max(most, rd.ahead);
  }
  EXPECT_EQ(most, 3);  // worker 1 went right up to the bound before it was held
  EXPECT_EQ(reads.size(), 16u);  // the budget, however it split
}

// Through the trainer with worker 0 slowed: whatever the timing, no read is more than 3 steps
// ahead, every hold is a read the bound forbade at the time, the budget is spent, and it learns.
TEST(ParamServer, StalenessBoundHoldsWithASlowWorker) {
  auto o = options(2, 1, 3);
  o.slow_worker_factor = 2.0;
  train::PSRunLog log;
  auto r = run_ps(o, &log);
  ASSERT_EQ(log.pushes.size(), 2u);
  EXPECT_EQ(log.pushes[0] + log.pushes[1], 60);  // the sample budget, however it splits
  for (auto& rd : log.reads)
    EXPECT_LE(rd.ahead, 3) << "worker " << rd.worker << " read for step " << rd.clock << " ran "
                           << rd.ahead << " steps ahead of the slowest";
  for (auto& h : log.holds) EXPECT_GT(h.clock, 3) << "worker " << h.worker << " held at step " << h.clock;
  expect_full_rounds(log);
  EXPECT_GE(r.steps.size(), 30u);
  EXPECT_LT(mean_loss(r.steps, r.steps.size() - 5, r.steps.size()), mean_loss(r.steps, 0, 5) - 0.5);
}

TEST(ParamServer, AsynchronousFinishesAndLearns) {
  auto o = options(2, 2, -1);
  o.slow_worker_factor = 2.0;
  train::PSRunLog log;
  auto r = run_ps(o, &log);
  EXPECT_EQ(log.pushes[0] + log.pushes[1], 60);
  EXPECT_TRUE(log.holds.empty()) << "an unbounded run held worker " << log.holds[0].worker;  // nothing held anyone back
  expect_full_rounds(log);
  ASSERT_GE(r.steps.size(), 10u);
  EXPECT_LT(mean_loss(r.steps, r.steps.size() - 5, r.steps.size()), mean_loss(r.steps, 0, 5) - 0.5);
  ASSERT_TRUE(r.final_val_loss.has_value());
  EXPECT_TRUE(std::isfinite(*r.final_val_loss));
}

// ---- nothing hangs silently (DESIGN decision 7) ----

// A worker that goes quiet (alive, but sends nothing) makes the server fail at its deadline
// with a CommError naming the silent worker; a worker that exits without saying done fails the
// server at once.
TEST(ParamServer, SilentOrVanishedWorkerFailsTheServer) {
  // The silent worker stays alive until the server has failed (an event, not a guessed sleep),
  // so the server's deadline is what ends the run however the threads are scheduled.
  std::mutex m;
  std::condition_variable cv;
  bool server_failed = false;
  auto serve = [&](comm::Communicator& w, bool silent) {
    const auto layout = parallel::PSLayout::make(1, 1, 8);
    if (w.rank() == 1) {
      std::vector<float> values(8, 0.f), grad(8, 0.f);
      parallel::ParameterServer ps(w, layout, 0, values, grad, {.staleness = 0, .budget = 10},
                                   [](int64_t) { return parallel::PSUpdate{}; });
      try {
        ps.serve();
      } catch (...) {
        std::lock_guard g(m);
        server_failed = true;
        cv.notify_all();
        throw;
      }
      return;
    }
    parallel::PSWorker client(w, layout, 0);
    std::vector<float> values(8);
    ASSERT_TRUE(client.pull(0, values));
    if (silent) {
      std::unique_lock lk(m);  // 60 s: hang guard only
      cv.wait_for(lk, std::chrono::seconds(60), [&] { return server_failed; });
    }
  };
  comm::ThreadsOptions opts;
  opts.timeout = std::chrono::milliseconds(300);
  try {
    comm::run_threads(2, [&](comm::Communicator& w) { serve(w, true); }, opts);
    FAIL() << "a silent worker went unnoticed";
  } catch (const comm::CommError& e) {
    EXPECT_EQ(e.kind(), comm::ErrorKind::timeout) << e.what();
    EXPECT_EQ(e.ranks(), std::vector<int>{0}) << e.what();
  }
  EXPECT_THROW(comm::run_threads(2, [&](comm::Communicator& w) { serve(w, false); }, opts), comm::CommError);
}

// ---- the memory estimate of an image model (train/validate.h) ----

// The start-up check's sum for a parameter server training a CNN: every worker holds the whole
// model's values and gradients and the activations of its rows (as a dp rank of the all-reduce
// trainer does), the servers together one more copy of the values and gradients and AdamW's two
// states; nothing else holds optimizer state.
TEST(ParamServer, MemoryEstimateOfAnImageModelCountsWorkersAndServers) {
  const auto spec = model::model_spec("cnn-small");
  double n = 0;
  for (const auto& [name, shape] : spec->param_shapes()) {
    double k = 1;
    for (int64_t d : shape) k *= static_cast<double>(d);
    n += k;
  }
  train::TrainOptions o;
  o.dp = 2, o.ps_servers = 2, o.batch = 16, o.seq = 1, o.data = "fashion-mnist";
  const train::MemoryEstimate e = train::estimate_memory(o, *spec);
  EXPECT_DOUBLE_EQ(e.params, 3 * 4 * n);
  EXPECT_DOUBLE_EQ(e.grads, 3 * 4 * n);
  EXPECT_DOUBLE_EQ(e.optimizer, 2 * 4 * n);
  EXPECT_EQ(e.ranks, 4);
  train::TrainOptions all_reduce = o;
  all_reduce.ps_servers = 0;
  const train::MemoryEstimate a = train::estimate_memory(all_reduce, *spec);
  EXPECT_GT(e.activations, 0.0);
  EXPECT_DOUBLE_EQ(e.activations, a.activations);  // two workers' rows = two dp ranks' rows
  EXPECT_DOUBLE_EQ(a.optimizer, 2 * 2 * 4 * n);    // each dp rank its own AdamW state
}

// ---- bad input ----

TEST(ParamServer, BadOptionsAreRefused) {
  auto o = options(2, 1, 0);
  o.zero = 1;
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, 1, -2);
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, -1, 0);
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, 1, 0);
  o.slow_worker_factor = 0.5;
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, 1, 0);
  meshtrain::testing::TempDir ckpt("ps_ckpt");
  o.checkpoint_dir = ckpt.file("ckpt");
  o.checkpoint_every = 5;
  EXPECT_THROW(train::train(o), std::invalid_argument);
  try {
    o = options(2, 1, 0);
    o.zero = 2;
    train::train(o);
    FAIL() << "ZeRO with a parameter server was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("choose one"), std::string::npos) << e.what();
  }
}
