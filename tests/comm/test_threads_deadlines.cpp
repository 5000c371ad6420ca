// The threads backend when things go wrong outside a collective's own ranks: a rank thread that
// cannot be started, a missed deadline blamed on the rank that did not post its side (not on a
// peer that was itself waiting), and the stuck-ranks watchdog for a rank busy in computation.
// Everything is ordered by events (flags, latches); time limits are hang guards only.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "meshtrain/comm/threads_backend.h"

namespace mc = meshtrain::comm;
using namespace std::chrono_literals;
using mc::Communicator;

namespace {

// A one-shot gate: wait() returns once open() was called, or after `guard` (a hang guard).
class Latch {
 public:
  void open() {
    {
      std::lock_guard g(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds guard = 60s) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, guard, [&] { return open_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

void spin_until(const std::atomic<bool>& flag) {
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (!flag.load() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A start_thread hook that refuses rank `fail_at` as a process out of threads would.
mc::ThreadsOptions refusing(int fail_at, std::atomic<int>& attempts) {
  mc::ThreadsOptions o;
  o.timeout = 60s;  // started ranks must fail at once, not at this deadline
  o.start_thread = [fail_at, &attempts](int rank, std::function<void()> body) {
    attempts.fetch_add(1);
    if (rank == fail_at) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    return std::thread(std::move(body));
  };
  return o;
}

}  // namespace

// ---- a rank thread that cannot be started ----
TEST(ThreadsStart, FailedStartStopsAndJoinsTheStartedRanks) {
  std::atomic<int> attempts{0}, entered{0}, left{0}, comm_errors{0};
  const auto t0 = std::chrono::steady_clock::now();
  bool threw = false;
  try {
    mc::run_threads(5, [&](Communicator& c) {
      entered.fetch_add(1);
      struct Leave {
        std::atomic<int>& n;
        ~Leave() { n.fetch_add(1); }
      } leave{left};
      std::vector<float> x(64, 1.0f);
      try {
        c.all_reduce(x);  // rank 3 never arrives
      } catch (const mc::CommError&) {
        comm_errors.fetch_add(1);
        throw;
      }
    }, refusing(3, attempts));
  } catch (const mc::ThreadStartError& e) {
    threw = true;
    EXPECT_EQ(e.rank(), 3);
    EXPECT_EQ(e.world(), 5);
    const std::string what = e.what();
    EXPECT_TRUE(has(what, "rank 3 of 5")) << what;
    EXPECT_TRUE(has(what, std::make_error_code(std::errc::resource_unavailable_try_again).message())) << what;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(threw);
  EXPECT_EQ(attempts.load(), 4);  // no attempt after the refused one
  // Every started rank ran, failed in its collective and returned before run_threads did.
  EXPECT_EQ(entered.load(), 3);
  EXPECT_EQ(left.load(), 3);
  EXPECT_EQ(comm_errors.load(), 3);
  EXPECT_LT(s, 30.0);  // hang guard: the deadline is 60 s
}

TEST(ThreadsStart, RefusedFirstThreadRunsNothing) {
  std::atomic<int> attempts{0}, entered{0};
  EXPECT_THROW(mc::run_threads(3, [&](Communicator&) { entered.fetch_add(1); }, refusing(0, attempts)),
               mc::ThreadStartError);
  EXPECT_EQ(attempts.load(), 1);
  EXPECT_EQ(entered.load(), 0);
}

TEST(ThreadsStart, RanksBusyInComputeStopAtTheirNextOperation) {
  std::atomic<int> attempts{0}, left{0};
  EXPECT_THROW(mc::run_threads(3, [&](Communicator& c) {
    struct Leave {
      std::atomic<int>& n;
      ~Leave() { n.fetch_add(1); }
    } leave{left};
    std::this_thread::sleep_for(50ms);  // computing while rank 2's start fails
    c.barrier();
  }, refusing(2, attempts)), mc::ThreadStartError);
  EXPECT_EQ(left.load(), 2);
}

// ---- who is late ----
// Ranks as in a parameter server: rank 2 (server) has posted receives from both workers and
// polls them; rank 0 (slow worker) computes and posts nothing; rank 1 waits for the server's
// reply and misses its deadline. The one that did not post its side is rank 0.
TEST(ThreadsBlame, DeadlineNamesTheRankThatDidNotPostNotTheWaitingPeer) {
  std::atomic<bool> server_posted{false}, worker_computing{false}, released{false};
  std::mutex m;
  std::vector<int> blamed;
  std::string what;
  int kind = -1;
  EXPECT_THROW(mc::run_threads(3, [&](Communicator& c) {
    std::vector<float> msg(4, 0.0f);
    if (c.rank() == 0) {
      worker_computing = true;
      spin_until(released);  // "compute" until rank 1 has its error
      c.send(msg, 2, {.tag = 1});
    } else if (c.rank() == 2) {
      std::vector<float> a(4), b(4);
      mc::Work from0 = c.irecv(a, 0, {.tag = 1}), from1 = c.irecv(b, 1, {.tag = 1});
      server_posted = true;
      while (!from0.is_completed() && !from1.is_completed()) std::this_thread::sleep_for(1ms);
      from0.wait();
      from1.wait();
    } else {
      spin_until(server_posted);
      spin_until(worker_computing);
      try {
        c.recv(msg, 2, {.tag = 2, .timeout = 300ms});
      } catch (const mc::CommError& e) {
        std::lock_guard g(m);
        blamed = e.ranks();
        what = e.what();
        kind = static_cast<int>(e.kind());
        released = true;
        throw;
      }
    }
  }, {.timeout = 60s}), mc::CommError);
  EXPECT_EQ(kind, static_cast<int>(mc::ErrorKind::timeout)) << what;
  EXPECT_EQ(blamed, std::vector<int>{0}) << what;
  EXPECT_TRUE(has(what, "rank 2")) << what;  // the peer it waited on is still mentioned
}

// A peer that is itself computing (no receive posted, no wait) is the one to blame.
TEST(ThreadsBlame, PeerBusyOutsideCommunicationIsBlamedItself) {
  std::atomic<bool> computing{false}, released{false};
  std::vector<int> blamed;
  EXPECT_THROW(mc::run_threads(2, [&](Communicator& c) {
    std::vector<float> msg(4, 0.0f);
    if (c.rank() == 0) {
      computing = true;
      spin_until(released);
      c.send(msg, 1);
    } else {
      spin_until(computing);
      try {
        c.recv(msg, 0, {.timeout = 200ms});
      } catch (const mc::CommError& e) {
        blamed = e.ranks();
        released = true;
        throw;
      }
    }
  }, {.timeout = 60s}), mc::CommError);
  EXPECT_EQ(blamed, std::vector<int>{0});
}

// A collective whose ranks all arrived but one waits on a chain: ranks 0 and 1 are in an
// all_reduce with rank 2 still computing; the error names rank 2 (it never entered).
TEST(ThreadsBlame, CollectiveNamesTheRankThatNeverEntered) {
  std::atomic<bool> released{false};
  std::vector<int> blamed;
  std::mutex m;
  EXPECT_THROW(mc::run_threads(3, [&](Communicator& c) {
    std::vector<float> x(16, 1.0f);
    if (c.rank() == 2) {
      spin_until(released);
      c.all_reduce(x);
      return;
    }
    try {
      c.all_reduce(x, {.timeout = 300ms});
    } catch (const mc::CommError& e) {
      std::lock_guard g(m);
      if (e.kind() == mc::ErrorKind::timeout) blamed = e.ranks();
      released = true;
      throw;
    }
  }, {.timeout = 60s}), mc::CommError);
  EXPECT_EQ(blamed, std::vector<int>{2});
}

// ---- the stuck-ranks watchdog ----
TEST(ThreadsWatchdog, HandlerGetsTheFailureWhileARankIsStuckInCompute) {
  Latch release;
  std::atomic<int> calls{0};
  std::atomic<bool> rank0_done_at_call{true};
  std::atomic<bool> rank0_done{false};
  std::vector<int> stuck;
  std::string first_what;
  mc::ThreadsOptions o;
  o.timeout = 300ms;
  o.stuck_grace = 100ms;
  o.on_stuck = [&](std::exception_ptr first, const std::vector<int>& ranks) {
    calls.fetch_add(1);
    rank0_done_at_call = rank0_done.load();
    stuck = ranks;
    try {
      std::rethrow_exception(first);
    } catch (const std::exception& e) {
      first_what = e.what();
    }
    release.open();  // the CLI ends the process here; the test lets rank 0 finish instead
  };
  std::string top;
  try {
    mc::run_threads(2, [&](Communicator& c) {
      std::vector<float> msg(4, 0.0f);
      if (c.rank() == 0) {
        release.wait();  // stuck in "compute" until the handler runs (60 s hang guard)
        rank0_done = true;
        return;
      }
      c.recv(msg, 0);  // misses its 300 ms deadline
    }, o);
  } catch (const mc::CommError& e) {
    top = e.what();
  }
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(rank0_done_at_call.load());  // called while rank 0 was still stuck
  EXPECT_EQ(stuck, std::vector<int>{0});
  EXPECT_EQ(first_what, top);  // the handler saw the error run_threads rethrows
  EXPECT_TRUE(has(top, "[0]")) << top;
}

TEST(ThreadsWatchdog, NoHandlerCallWhenEveryRankStops) {
  std::atomic<int> calls{0};
  mc::ThreadsOptions o;
  o.timeout = 60s;
  o.stuck_grace = 30s;  // generous: the ranks below stop at once, so it never expires
  o.on_stuck = [&](std::exception_ptr, const std::vector<int>&) { calls.fetch_add(1); };
  EXPECT_THROW(mc::run_threads(3, [](Communicator& c) {
    if (c.rank() == 1) throw std::runtime_error("rank 1 gives up");
    c.barrier();
  }, o), std::runtime_error);
  EXPECT_EQ(calls.load(), 0);
}

TEST(ThreadsWatchdog, ProcessWideHandlerIsUsedWithoutAnOption) {
  Latch release;
  std::atomic<int> calls{0};
  mc::set_stuck_ranks_handler([&](std::exception_ptr, const std::vector<int>& ranks) {
    calls.fetch_add(1);
    EXPECT_EQ(ranks, std::vector<int>{1});
    release.open();
  }, 50ms);
  EXPECT_THROW(mc::run_threads(2, [&](Communicator& c) {
    if (c.rank() == 1) {
      release.wait();
      return;
    }
    throw std::runtime_error("rank 0 gives up");
  }, {.timeout = 60s}), std::runtime_error);
  mc::set_stuck_ranks_handler({});
  EXPECT_EQ(calls.load(), 1);
}
