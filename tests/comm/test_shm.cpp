// The shared-memory all-reduce (comm/shm.cpp) on the threads backend: results bit for bit
// against a serial sum in the binomial tree's order and against Algorithm::tree, identical on
// every rank, for inputs whose sums depend on the order (not small integers); world 2 to 8;
// counts around the 64-byte blocks and past the non-temporal threshold; sum, avg, max, min;
// float, double, int64; many operations back to back with other algorithms and async ones in
// between; what `auto` picks; failures named like every other wait; and no allocation on the
// path of a synchronous all-reduce.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "alloc_count.h"
#include "meshtrain/comm/select.h"
#include "meshtrain/comm/threads_backend.h"

namespace mc = meshtrain::comm;
using mc::Algorithm;
using mc::Communicator;
using mc::ReduceOp;

namespace {

// Values whose float sums depend on the order of addition.
template <class T>
T input(int rank, std::size_t i, int salt) {
  std::uint64_t h = (static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^
                    (static_cast<std::uint64_t>(salt) * 0x94D049BB133111EBull);
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 29;
  if constexpr (std::is_floating_point_v<T>) {
    const double u = static_cast<double>(h >> 11) / 9007199254740992.0;  // [0, 1)
    return static_cast<T>((u - 0.5) * std::pow(10.0, static_cast<double>(h % 7) - 3));
  } else {
    return static_cast<T>(static_cast<std::int64_t>(h % 2001) - 1000);
  }
}

template <class T>
T combine(T a, T b, ReduceOp op) {
  if (op == ReduceOp::max) return a < b ? b : a;
  if (op == ReduceOp::min) return b < a ? b : a;
  return a + b;
}

// The binomial tree's order (tree.cpp, root 0): v's own value, then the subtrees of v+1, v+2,
// v+4, ... below v's lowest set bit.
template <class T>
T tree_sum(int v, int span, int p, std::size_t i, int salt, ReduceOp op) {
  T acc = input<T>(v, i, salt);
  for (int m = 1; m < span && v + m < p; m *= 2) acc = combine(acc, tree_sum<T>(v + m, m, p, i, salt, op), op);
  return acc;
}

template <class T>
T reference(int p, std::size_t i, int salt, ReduceOp op) {
  int span = 1;
  while (span < p) span *= 2;
  T acc = tree_sum<T>(0, span, p, i, salt, op);
  if (op == ReduceOp::avg) {
    if constexpr (std::is_same_v<T, float>) acc *= 1.0f / static_cast<float>(p);
    else if constexpr (std::is_same_v<T, double>) acc *= 1.0 / p;
    else acc /= p;
  }
  return acc;
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// All-reduces with `a` and checks every element bit for bit against the reference.
template <class T>
void check_bits(Communicator& c, std::size_t n, Algorithm a, ReduceOp op, int salt, bool out_of_place = false) {
  std::vector<T> x(n), y(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = input<T>(c.rank(), i, salt);
  if (out_of_place) c.all_reduce(x, y, {.op = op, .algorithm = a});
  else c.all_reduce(x, {.op = op, .algorithm = a});
  const std::vector<T>& got = out_of_place ? y : x;
  for (std::size_t i = 0; i < n; ++i) {
    const T want = reference<T>(c.size(), i, salt, op);
    if (!same_bits(got[i], want))
      throw std::runtime_error(std::string("all_reduce ") + mc::to_string(a) + " " + mc::to_string(op) + " world " +
                               std::to_string(c.size()) + " rank " + std::to_string(c.rank()) + " count " +
                               std::to_string(n) + " salt " + std::to_string(salt) + ": element " + std::to_string(i) +
                               " is " + std::to_string(static_cast<double>(got[i])) + ", expected " +
                               std::to_string(static_cast<double>(want)));
  }
}

}  // namespace

// ---- bits ----
class ShmWorld : public ::testing::TestWithParam<int> {};

TEST_P(ShmWorld, SumsInTheTreeOrderBitForBitOnEveryRank) {
  const int world = GetParam();
  EXPECT_NO_THROW(mc::run_threads(world, [](Communicator& c) {
    std::vector<std::size_t> counts{1, 2, 15, 16, 17, 31, 33, 1000, 4097, 65537};
    if (c.size() <= 4) counts.push_back((std::size_t{5} << 20) / 4 + 3);  // 5 MiB
    int salt = 0;
    if (c.size() == 2 || c.size() == 3) {  // past the 32 MiB streaming threshold (two ranks: the fused pass)
      const std::size_t big = (std::size_t{36} << 20) / 4 + 5;
      check_bits<float>(c, big, Algorithm::shm, ReduceOp::sum, ++salt);
      check_bits<float>(c, big, Algorithm::shm, ReduceOp::avg, ++salt);
      check_bits<float>(c, big, Algorithm::shm, ReduceOp::max, ++salt);
      check_bits<double>(c, big / 2, Algorithm::shm, ReduceOp::sum, ++salt, true);
    }
    for (std::size_t n : counts) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        check_bits<float>(c, n, Algorithm::shm, op, ++salt);
        check_bits<float>(c, n, Algorithm::tree, op, salt);  // the reference is tree's order
      }
      check_bits<double>(c, n, Algorithm::shm, ReduceOp::sum, ++salt);
      check_bits<double>(c, n, Algorithm::shm, ReduceOp::avg, ++salt, true);
      check_bits<std::int64_t>(c, n, Algorithm::shm, ReduceOp::avg, ++salt);
      check_bits<std::int64_t>(c, n, Algorithm::shm, ReduceOp::max, ++salt);
      check_bits<float>(c, n, Algorithm::shm, ReduceOp::sum, ++salt, true);
      // auto: shm at p = 2 and where tree was the choice, so the same bits; ring or rhd elsewhere.
      const Algorithm chosen = mc::choose_algorithm(mc::OpKind::all_reduce, n * 4, c.size(), "threads");
      if (mc::prefer_shared_memory(mc::OpKind::all_reduce, chosen, c.size()) == Algorithm::shm)
        check_bits<float>(c, n, Algorithm::automatic, ReduceOp::sum, ++salt);
    }
  }, {.timeout = std::chrono::seconds(120)}));
}

TEST_P(ShmWorld, BackToBackWithOtherOperationsInBetween) {
  const int world = GetParam();
  EXPECT_NO_THROW(mc::run_threads(world, [](Communicator& c) {
    for (int it = 0; it < 300; ++it) {
      const std::size_t n = 1 + static_cast<std::size_t>(it * 37) % 3000;
      check_bits<float>(c, n, Algorithm::shm, it % 3 == 0 ? ReduceOp::avg : ReduceOp::sum, it);
      if (it % 5 == 0) check_bits<float>(c, n, Algorithm::ring, ReduceOp::max, it);
      if (it % 7 == 0) {  // an async shm all-reduce (on the progress thread) then a synchronous one
        std::vector<float> a(n);
        for (std::size_t i = 0; i < n; ++i) a[i] = input<float>(c.rank(), i, 1000 + it);
        mc::Work w = c.all_reduce_async(a, {.algorithm = Algorithm::shm});
        check_bits<double>(c, n, Algorithm::shm, ReduceOp::sum, 2000 + it);
        w.wait();
        for (std::size_t i = 0; i < n; ++i)
          if (!same_bits(a[i], reference<float>(c.size(), i, 1000 + it, ReduceOp::sum)))
            throw std::runtime_error("async shm all_reduce: element " + std::to_string(i) + " differs");
      }
    }
  }, {.timeout = std::chrono::seconds(120)}));
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmWorld, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(Shm, SubGroupsExchangeOnlyAmongTheirMembers) {
  EXPECT_NO_THROW(mc::run_threads(4, [](Communicator& c) {
    auto g = c.split(c.rank() % 2, c.rank(), "half");
    for (int it = 0; it < 50; ++it) {
      check_bits<float>(*g, 1000 + static_cast<std::size_t>(it), Algorithm::shm, ReduceOp::sum, it);
      check_bits<float>(c, 999, Algorithm::shm, ReduceOp::sum, it);
    }
  }));
}

// ---- choice ----
TEST(Shm, AutoPicksItWhereItKeepsTheBits) {
  using mc::OpKind;
  for (std::size_t n : {std::size_t{4}, std::size_t{4096}, std::size_t{64} << 20})
    EXPECT_EQ(mc::prefer_shared_memory(OpKind::all_reduce, mc::choose_algorithm(OpKind::all_reduce, n, 2, "threads"), 2),
              Algorithm::shm);
  // p >= 3: only where tree was the choice (small messages); ring and rhd stay.
  EXPECT_EQ(mc::prefer_shared_memory(OpKind::all_reduce, Algorithm::tree, 4), Algorithm::shm);
  EXPECT_EQ(mc::prefer_shared_memory(OpKind::all_reduce, Algorithm::ring, 3), Algorithm::ring);
  EXPECT_EQ(mc::prefer_shared_memory(OpKind::all_reduce, Algorithm::rhd, 4), Algorithm::rhd);
  EXPECT_EQ(mc::prefer_shared_memory(OpKind::all_reduce, Algorithm::hier, 2), Algorithm::hier);
  EXPECT_EQ(mc::prefer_shared_memory(OpKind::broadcast, Algorithm::tree, 2), Algorithm::tree);
  EXPECT_EQ(mc::parse_algorithm("shm"), Algorithm::shm);
  EXPECT_TRUE(mc::supports(OpKind::all_reduce, Algorithm::shm));
  EXPECT_FALSE(mc::supports(OpKind::reduce_scatter, Algorithm::shm));
}

TEST(Shm, StatisticsCountWhatEachRankWroteToOthers) {
  mc::run_threads(2, [](Communicator& c) {
    c.reset_stats();
    std::vector<float> x(1024, 1.0f);
    c.all_reduce(x);  // auto: shm at p = 2
    // Each rank sums half (2 KiB) and writes it into the other's buffer (2 KiB sent), and the
    // other reads the other half of its buffer (2 KiB sent): 4 KiB each way, as ring counts.
    EXPECT_EQ(c.stats().bytes_sent, 4096u);
    EXPECT_EQ(c.stats().bytes_received, 4096u);
    EXPECT_EQ(x[0], 2.0f);
  });
}

// ---- no allocation ----
TEST(Shm, SynchronousAllReduceAllocatesNothing) {
  // auto at world 2 (every size) and at world 3 for 4 KiB (where tree was the choice): shm.
  for (int world : {2, 3}) {
    mc::run_threads(world, [&](Communicator& c) {
      const std::vector<std::size_t> sizes =
          c.size() == 2 ? std::vector<std::size_t>{1024, 16384, std::size_t{1} << 18} : std::vector<std::size_t>{1024};
      for (std::size_t n : sizes) {
        std::vector<float> x(n, 1.0f);
        for (int i = 0; i < 20; ++i) c.all_reduce(x);  // warm-up: first-use allocations
        c.barrier();
        const long b = mc::testing::allocations();
        mc::testing::count_allocations(true);
        for (int i = 0; i < 500; ++i) c.all_reduce(x, {.op = i % 2 ? ReduceOp::sum : ReduceOp::avg});
        mc::testing::count_allocations(false);
        const long counted = mc::testing::allocations() - b;
        c.barrier();
        EXPECT_EQ(counted, 0) << "world " << world << " count " << n;
      }
    });
  }
}

// ---- failures ----
TEST(Shm, RankThatThrowsFailsTheOthersNamingIt) {
  std::vector<std::string> errors(3);
  try {
    mc::run_threads(3, [&](Communicator& c) {
      std::vector<float> x(1000, 1.0f);
      c.all_reduce(x, {.algorithm = Algorithm::shm});
      if (c.rank() == 1) throw std::runtime_error("boom in rank 1");
      try {
        c.all_reduce(x, {.algorithm = Algorithm::shm});
      } catch (const mc::CommError& e) {
        errors[static_cast<std::size_t>(c.rank())] = e.what();
        throw;
      }
    }, {.timeout = std::chrono::seconds(60)});
  } catch (const std::exception&) {
  }
  for (int r : {0, 2}) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("all_reduce #1 on group 'world'"), std::string::npos)
        << errors[static_cast<std::size_t>(r)];
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("[1]"), std::string::npos) << errors[static_cast<std::size_t>(r)];
  }
}

TEST(Shm, RankThatNeverCallsTimesOutNamingIt) {
  std::vector<std::string> errors(2);
  std::vector<double> seconds(2, 0);
  std::atomic<bool> release{false};
  try {
    mc::run_threads(2, [&](Communicator& c) {
      std::vector<float> x(4096, 1.0f);
      c.all_reduce(x);
      if (c.rank() == 1) {
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c.all_reduce(x, {.timeout = std::chrono::milliseconds(300)});
      } catch (const mc::CommError& e) {
        errors[0] = e.what();
        seconds[0] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        release = true;
        throw;
      }
      release = true;
    }, {.timeout = std::chrono::seconds(60)});
  } catch (const std::exception&) {
  }
  EXPECT_NE(errors[0].find("all_reduce #1 on group 'world' failed (timeout)"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("ranks not heard from: [1]"), std::string::npos) << errors[0];
  EXPECT_GT(seconds[0], 0.29);
  EXPECT_LT(seconds[0], 30.0);
}
