// Faults on the threads backend: a rank that throws, a rank that returns early ("exits"), a rank
// that never calls, mismatched collectives in debug mode, and point-to-point timeouts. In each
// case every other rank must fail with a CommError naming the operation, the group, the
// sequence number and the ranks not heard from, and nothing hangs. The checks are on what
// failed and why (the error kind says whether a rank was failed by a peer's notice or by its
// deadline); a late rank waits for the others' failure as an event rather than sleeping a
// guessed time, so a loaded machine cannot reorder them. Times are bounded only as hang guards
// (30 s, far above every deadline here) and from below by the deadline, which cannot fire early.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "meshtrain/comm/threads_backend.h"

namespace mc = meshtrain::comm;
using namespace std::chrono_literals;
using mc::Communicator;

namespace {
constexpr double kHangGuard = 30.0;  // seconds; no case here should come near it

struct Outcome {
  std::mutex m;
  std::condition_variable cv;
  int failed = 0;
  std::vector<std::string> errors;  // what() of the CommErrors, by rank
  std::vector<int> kinds;
  std::vector<double> seconds;       // when each rank failed, from the start
  explicit Outcome(int n) : errors(n), kinds(n, -1), seconds(n, -1) {}
  // Blocks until `n` ranks have recorded their CommError (or the hang guard passes).
  void wait_failed(int n) {
    std::unique_lock lk(m);
    cv.wait_for(lk, std::chrono::duration<double>(kHangGuard), [&] { return failed >= n; });
  }
};

// Runs fn on `world` ranks; records each rank's CommError; returns the exception run_threads
// rethrew (empty if none) and the wall time.
std::string run(int world, Outcome& out, double& wall, std::function<void(Communicator&)> fn, mc::Timeout t = 1500ms,
                int debug = 0) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string top;
  try {
    mc::run_threads(world, [&](Communicator& c) {
      try {
        fn(c);
      } catch (const mc::CommError& e) {
        std::lock_guard g(out.m);
        out.errors[c.rank()] = e.what();
        out.kinds[c.rank()] = static_cast<int>(e.kind());
        out.seconds[c.rank()] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++out.failed;
        out.cv.notify_all();
        throw;
      }
    }, {.timeout = t, .debug = debug});
  } catch (const std::exception& e) {
    top = e.what();
  }
  wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return top;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

// ---- a rank throws ----
TEST(ThreadsFaults, RankThatThrowsFailsTheOthersPromptly) {
  Outcome out(4);
  double wall = 0;
  const std::string top = run(4, out, wall, [](Communicator& c) {
    std::vector<float> x(1000, 1.0f);
    c.all_reduce(x);  // #0 succeeds everywhere
    if (c.rank() == 2) throw std::runtime_error("boom in rank 2");
    c.all_reduce(x);  // #1: rank 2 never arrives
  }, 60s);
  EXPECT_EQ(top, "boom in rank 2");  // the earliest exception, rethrown on the caller
  EXPECT_LT(wall, kHangGuard);       // hang guard; peer_failed below shows the deadline did not end it
  for (int r : {0, 1, 3}) {
    // #1 normally; #0 for a rank still finishing #0 when the abort arrives.
    EXPECT_TRUE(has(out.errors[r], "all_reduce #1 on group 'world'") || has(out.errors[r], "all_reduce #0 on group 'world'"))
        << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "ranks not heard from: [2]")) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "boom in rank 2")) << out.errors[r];
    EXPECT_EQ(out.kinds[r], static_cast<int>(mc::ErrorKind::peer_failed));
  }
}

// ---- a rank exits (returns from its function) ----
TEST(ThreadsFaults, RankThatReturnsEarlyFailsTheOthers) {
  Outcome out(3);
  double wall = 0;
  const std::string top = run(3, out, wall, [](Communicator& c) {
    std::vector<double> x(10, 1.0);
    if (c.rank() == 1) return;
    c.all_reduce(x, {.algorithm = mc::Algorithm::tree});
  }, 60s);
  EXPECT_LT(wall, kHangGuard);
  for (int r : {0, 2}) {
    EXPECT_TRUE(has(out.errors[r], "all_reduce #0 on group 'world'")) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "[1]")) << out.errors[r];
    EXPECT_EQ(out.kinds[r], static_cast<int>(mc::ErrorKind::peer_failed)) << out.errors[r];
  }
  EXPECT_FALSE(top.empty());
}

// ---- a rank never calls ----
TEST(ThreadsFaults, RankThatNeverCallsTimesOutWithinDeadline) {
  Outcome out(4);
  double wall = 0;
  const std::string top = run(4, out, wall, [&out](Communicator& c) {
    auto g = c.split(0, c.rank(), "dp[0]");
    std::vector<float> x(4096, 1.0f);
    g->all_reduce(x);  // dp[0] #0
    if (c.rank() == 3) out.wait_failed(3);  // arrives only after the others gave up on it
    g->all_reduce(x, {.algorithm = mc::Algorithm::ring});  // dp[0] #1
  }, 1000ms);
  // The first rank to reach its deadline times out and aborts the job; a rank still waiting
  // then fails by that notice (peer_failed), which carries the timeout.
  int timed_out = 0;
  for (int r : {0, 1, 2}) {
    EXPECT_TRUE(has(out.errors[r], "all_reduce #1 on group 'dp[0]'")) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "ranks not heard from: [3]")) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "failed (timeout)")) << out.errors[r];
    EXPECT_TRUE(out.kinds[r] == static_cast<int>(mc::ErrorKind::timeout) ||
                out.kinds[r] == static_cast<int>(mc::ErrorKind::peer_failed)) << out.errors[r];
    timed_out += out.kinds[r] == static_cast<int>(mc::ErrorKind::timeout);
    EXPECT_GT(out.seconds[r], 0.99);  // a deadline never fires early
    EXPECT_LT(out.seconds[r], kHangGuard);
  }
  EXPECT_GE(timed_out, 1);
  EXPECT_TRUE(has(top, "dp[0]")) << top;
}

// ---- debug mode: mismatched collectives ----
TEST(ThreadsFaults, DebugModeReportsTheFirstMismatchingRank) {
  Outcome out(4);
  double wall = 0;
  run(4, out, wall, [](Communicator& c) {
    std::vector<float> x(8, 1.0f), y(32);
    c.all_reduce(x);
    if (c.rank() == 2) c.all_gather(x, y);  // wrong collective
    else c.all_reduce(x);
  }, 60s, 1);
  EXPECT_LT(wall, kHangGuard);  // hang guard; the kind below shows no deadline was involved
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out.kinds[r], static_cast<int>(mc::ErrorKind::mismatch)) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "rank 2 called all_gather #1")) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "first mismatching rank: [2]")) << out.errors[r];
  }
}

TEST(ThreadsFaults, DebugModeReportsCountMismatch) {
  Outcome out(3);
  double wall = 0;
  run(3, out, wall, [](Communicator& c) {
    std::vector<float> x(c.rank() == 1 ? 5 : 4, 1.0f);
    c.all_reduce(x);
  }, 60s, 1);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out.kinds[r], static_cast<int>(mc::ErrorKind::mismatch)) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "rank 1 called all_reduce #0(count=5")) << out.errors[r];
    EXPECT_TRUE(has(out.errors[r], "count=4")) << out.errors[r];
  }
}

// ---- point-to-point and Work deadlines ----
TEST(ThreadsFaults, ReceiveWithoutSenderTimesOut) {
  Outcome out(2);
  double wall = 0;
  run(2, out, wall, [&out](Communicator& c) {
    std::vector<float> x(4);
    if (c.rank() == 0) c.recv(x, 1, {.tag = 5, .timeout = 300ms});
    else out.wait_failed(1);  // stays alive (silent) until rank 0 gave up
  });
  EXPECT_TRUE(has(out.errors[0], "recv #0 on group 'world'")) << out.errors[0];
  EXPECT_TRUE(has(out.errors[0], "rank 1")) << out.errors[0];
  EXPECT_EQ(out.kinds[0], static_cast<int>(mc::ErrorKind::timeout)) << out.errors[0];
  EXPECT_GT(out.seconds[0], 0.29);
  EXPECT_LT(wall, kHangGuard);
}

TEST(ThreadsFaults, AsyncWorkWaitWithTimeoutAndOperationDeadline) {
  Outcome out(2);
  double wall = 0;
  run(2, out, wall, [&out](Communicator& c) {
    std::vector<float> x(4, 1.0f);
    if (c.rank() == 1) {
      out.wait_failed(1);  // silent until rank 0's operation has failed by its deadline
      return;
    }
    mc::Work w = c.all_reduce_async(x, {.timeout = 1500ms});
    EXPECT_FALSE(w.is_completed());
    EXPECT_THROW(w.wait(100ms), mc::CommError);  // the wait gives up; the operation goes on
    w.wait();                                      // ... and fails by its own deadline
  });
  EXPECT_TRUE(has(out.errors[0], "all_reduce #0")) << out.errors[0];
  EXPECT_EQ(out.kinds[0], static_cast<int>(mc::ErrorKind::timeout)) << out.errors[0];
  EXPECT_GT(out.seconds[0], 1.49);
  EXPECT_LT(out.seconds[0], kHangGuard);
}

TEST(ThreadsFaults, GlobalDefaultTimeoutApplies) {
  const auto old = Communicator::default_timeout();
  Communicator::set_default_timeout(700ms);
  std::atomic<int> kind{-1};
  std::mutex m;
  std::condition_variable cv;
  mc::run_threads(2, [&](Communicator& c) {
    EXPECT_EQ(c.timeout(), 700ms);
    if (c.rank() == 0) {
      std::vector<float> x(4);
      try {
        c.broadcast(x, {.root = 1});
      } catch (const mc::CommError& e) {
        kind = static_cast<int>(e.kind());
      }
      std::lock_guard g(m);
      cv.notify_all();
    } else {
      std::unique_lock lk(m);  // silent until rank 0 is done; 30 s: hang guard
      cv.wait_for(lk, std::chrono::duration<double>(kHangGuard), [&] { return kind.load() != -1; });
    }
  });
  EXPECT_EQ(kind.load(), static_cast<int>(mc::ErrorKind::timeout));
  Communicator::set_default_timeout(old);
}
