// Every operation x every algorithm x element counts {0, 1, primes, non-divisible} x world
// sizes 1..8 on the threads backend, checked against the serial reference of checks.h; plus
// split into sub-groups, async overlap, and statistics.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "checks.h"
#include "meshtrain/comm/threads_backend.h"

namespace mc = meshtrain::comm;
using mc::Algorithm;
using mc::Communicator;
using mc::ReduceOp;

// ---- the matrix ----
class ThreadsWorld : public ::testing::TestWithParam<int> {};

TEST_P(ThreadsWorld, EveryOperationAlgorithmAndCount) {
  const int world = GetParam();
  EXPECT_NO_THROW(mc::run_threads(world, [](Communicator& c) { mc::testing::check_everything(c); },
                                  {.timeout = std::chrono::seconds(60)}));
}

TEST_P(ThreadsWorld, SplitIntoGroups) {
  const int world = GetParam();
  EXPECT_NO_THROW(mc::run_threads(world, [&](Communicator& c) {
    // Two groups (even / odd ranks) ordered by descending rank; then all-reduce in each.
    auto g = c.split(c.rank() % 2, -c.rank(), "parity[" + std::to_string(c.rank() % 2) + "]");
    ASSERT_TRUE(g);
    std::vector<int> members;
    for (int r = world - 1; r >= 0; --r)
      if (r % 2 == c.rank() % 2) members.push_back(r);
    if (g->size() != static_cast<int>(members.size())) throw std::runtime_error("wrong group size");
    if (members[g->rank()] != c.rank()) throw std::runtime_error("wrong rank order in group");
    if (g->name() != "parity[" + std::to_string(c.rank() % 2) + "]") throw std::runtime_error("wrong name");
    std::vector<double> x{double(c.rank()), 1.0};
    g->all_reduce(x);
    double want = 0;
    for (int r : members) want += r;
    if (x[0] != want || x[1] != double(members.size())) throw std::runtime_error("wrong sum in group");
    mc::testing::check_all_reduce<float>(*g, 1031, Algorithm::ring, ReduceOp::sum, 0, 0);
    mc::testing::check_all_gather<float>(*g, 13, Algorithm::ring, true, false);
    // kNoColor: takes part, gets no group; nested split of a group.
    auto none = c.split(c.rank() == 0 ? mc::kNoColor : 0, 0);
    if ((c.rank() == 0) != (none == nullptr)) throw std::runtime_error("kNoColor handling");
    auto solo = g->split(g->rank(), 0);
    if (solo->size() != 1) throw std::runtime_error("singleton split");
    solo->all_reduce(x);
    c.barrier();
  }, {.timeout = std::chrono::seconds(30)}));
}

INSTANTIATE_TEST_SUITE_P(World, ThreadsWorld, ::testing::Range(1, 9));

// ---- async ----
TEST(ThreadsComm, AsyncCollectivesProgressWithoutWaitAndCompleteInOrder) {
  mc::run_threads(3, [](Communicator& c) {
    std::vector<float> a(100000, 1.0f), b(1000, 2.0f);
    mc::Work wa = c.all_reduce_async(a);
    mc::Work wb = c.all_reduce_async(b, {.op = ReduceOp::max});
    // Progress happens on the communicator's thread: poll without waiting (60 s: hang guard).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(wa.is_completed() && wb.is_completed()) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(wa.is_completed());
    EXPECT_TRUE(wb.is_completed());
    wa.wait();
    wb.wait();
    EXPECT_EQ(a[99999], 3.0f);
    EXPECT_EQ(b[0], 2.0f);
    EXPECT_EQ(wa.error(), nullptr);
    // A synchronous call issued after async ones runs after them.
    std::vector<std::int64_t> n{1};
    mc::Work w1 = c.all_reduce_async(n);
    c.all_reduce(n);
    EXPECT_EQ(n[0], 9);
  });
}

// ---- statistics ----
TEST(ThreadsComm, StatisticsCountBytesAndReset) {
  mc::run_threads(2, [](Communicator& c) {
    c.reset_stats();
    std::vector<float> x(1024, 1.0f);
    c.all_reduce(x, {.algorithm = Algorithm::ring});
    const mc::CommStats s = c.stats();
    // ring, p = 2: reduce-scatter sends half, all-gather sends half: 4 KiB out, 4 KiB in.
    EXPECT_EQ(s.bytes_sent, 4096u);
    EXPECT_EQ(s.bytes_received, 4096u);
    EXPECT_EQ(s.ops, 1u);
    EXPECT_GT(s.wait_seconds, 0.0);
    c.reset_stats();
    EXPECT_EQ(c.stats().bytes_sent, 0u);
  });
}

// ---- argument errors ----
TEST(ThreadsComm, BadArgumentsAreUsageErrors) {
  mc::run_threads(2, [](Communicator& c) {
    std::vector<float> a(4), b(3);
    try {
      c.all_reduce(a, b);
      ADD_FAILURE() << "size mismatch accepted";
    } catch (const mc::CommError& e) {
      EXPECT_EQ(e.kind(), mc::ErrorKind::usage);
      EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos);
    }
    EXPECT_THROW(c.all_gather(a, b, {.algorithm = Algorithm::rhd}), mc::CommError);
    EXPECT_THROW(c.all_reduce(a, {.algorithm = Algorithm::native}), mc::CommError);  // threads has no native
    EXPECT_THROW(c.broadcast(a, {.root = 5}), mc::CommError);
    c.barrier();
  });
}
