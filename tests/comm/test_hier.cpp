// Hierarchical all-reduce (comm/hier.cpp) on emulated hosts (threads, ranks [0, K) host 0, ...):
// the bytes the communicator counts as sent across hosts equal docs/comm.md's formulas for hier
// and the flat ring; results equal the flat ring's (bitwise for integer data, and whenever one
// host or one rank per host makes the summation order the ring's; within float round-off
// otherwise); `auto` picks hier only when the links between hosts are slower.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checks.h"
#include "meshtrain/comm/world.h"

namespace mc = meshtrain::comm;
using mc::Algorithm;
using mc::Communicator;

namespace {

struct Hosts {
  int H, K;
  int p() const { return H * K; }
  std::string str() const {
    std::string s;
    s += std::to_string(H);
    s += "x";
    s += std::to_string(K);
    return s;
  }
};
const Hosts kLayouts[] = {{2, 2}, {2, 3}, {3, 2}, {4, 1}, {1, 4}};

// ---- the formulas (docs/comm.md, "Hierarchical all-reduce") ----
// A ring all-reduce of m elements over q ranks (blocks of even_layout(m, q)): rank i sends every
// block but its own in the reduce-scatter and every block but block i+1 in the all-gather.
std::uint64_t ring_sent(std::size_t m, int q, int i, std::size_t es) {
  if (q == 1 || m == 0) return 0;
  const mc::Layout l = mc::even_layout(m, q);
  return es * (2 * m - l.count(i) - l.count((i + 1) % q));
}
// Flat ring: rank r sends only to r+1, which is on another host for the last rank of each host.
std::uint64_t flat_cross(std::size_t n, const Hosts& h, int r, std::size_t es) {
  const int next = (r + 1) % h.p();
  return r / h.K != next / h.K ? ring_sent(n, h.p(), r, es) : 0;
}
// hier: only the ring across hosts of shard k (block k of even_layout(n, K)) crosses hosts.
std::uint64_t hier_cross(std::size_t n, const Hosts& h, int r, std::size_t es) {
  return ring_sent(mc::even_layout(n, h.K).count(r % h.K), h.H, r / h.K, es);
}

// Runs one all-reduce of n floats with `a` on every rank and returns each rank's cross-host bytes.
std::vector<std::uint64_t> counted(const Hosts& h, std::size_t n, Algorithm a) {
  std::vector<std::uint64_t> out(static_cast<std::size_t>(h.p()));
  mc::run_threads(h.p(), [&](Communicator& c) {
    c.set_hosts(mc::hosts_in_blocks(c.size(), h.K));
    std::vector<float> v(n, 1.0f);
    c.reset_stats();
    c.all_reduce(v, {.algorithm = a, .chunk_bytes = 256});
    out[static_cast<std::size_t>(c.rank())] = c.stats().bytes_sent_cross_host;
  });
  return out;
}

// Inputs of rank r: random floats, or small integers (exact sums in any order).
template <class T>
std::vector<T> input(int r, std::size_t n, bool integers) {
  std::mt19937 g(static_cast<unsigned>(r * 7919 + n));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = integers ? static_cast<T>(std::lround(u(g) * 50)) : static_cast<T>(u(g));
  return v;
}

// hier's result and the flat ring's, on every rank, for one (layout, n, op).
template <class T>
void compare_with_ring(const Hosts& h, std::size_t n, mc::ReduceOp op, bool integers) {
  std::mutex m;
  std::vector<std::string> failures;
  mc::run_threads(h.p(), [&](Communicator& c) {
    c.set_hosts(mc::hosts_in_blocks(c.size(), h.K));
    const std::vector<T> in = input<T>(c.rank(), n, integers);
    std::vector<T> ring(n), hier(n);
    c.all_reduce(in, ring, {.op = op, .algorithm = Algorithm::ring, .chunk_bytes = 4096});
    c.all_reduce(in, hier, {.op = op, .algorithm = h.H > 1 ? Algorithm::hier : Algorithm::ring, .chunk_bytes = 4096});
    // One host or one rank per host: hier's order of summation is the ring's.
    const bool bitwise = integers || h.H == 1 || h.K == 1;
    for (std::size_t i = 0; i < n; ++i) {
      const double tol = bitwise ? 0.0 : 4.0 * h.p() * std::numeric_limits<T>::epsilon() * (std::fabs(double(ring[i])) + 1);
      if (std::fabs(double(hier[i]) - double(ring[i])) > tol) {
        std::lock_guard lk(m);
        std::string f = h.str();
        f += " n=";
        f += std::to_string(n);
        f += " rank ";
        f += std::to_string(c.rank());
        f += " element ";
        f += std::to_string(i);
        failures.push_back(f);
        return;
      }
    }
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

}  // namespace

// ---- bytes across hosts ----
TEST(HierAllReduce, CountedCrossHostBytesEqualTheFormulas) {
  for (const Hosts& h : kLayouts)
    for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{1031}, std::size_t{12000}, std::size_t{65543}}) {
      const std::string what = h.str() + " n=" + std::to_string(n);
      const std::vector<std::uint64_t> ring = counted(h, n, Algorithm::ring);
      std::uint64_t hier_total = 0;
      for (int r = 0; r < h.p(); ++r) EXPECT_EQ(ring[r], flat_cross(n, h, r, 4)) << what << " ring rank " << r;
      if (h.H == 1) continue;  // hier needs two hosts
      const std::vector<std::uint64_t> hier = counted(h, n, Algorithm::hier);
      for (int r = 0; r < h.p(); ++r) {
        EXPECT_EQ(hier[r], hier_cross(n, h, r, 4)) << what << " hier rank " << r;
        hier_total += hier[r];
      }
      // Over all ranks, exactly: each of the K rings across hosts moves 2 (H-1) x its shard.
      EXPECT_EQ(hier_total, 2u * (h.H - 1) * n * 4) << what;
    }
}

TEST(HierAllReduce, DivisibleSizesGiveTheClosedForms) {
  const std::size_t n = 12000;  // divisible by every p, K and H x K here: no rounding
  for (const Hosts& h : kLayouts) {
    if (h.H == 1) continue;
    const std::vector<std::uint64_t> hier = counted(h, n, Algorithm::hier);
    const std::vector<std::uint64_t> ring = counted(h, n, Algorithm::ring);
    for (int r = 0; r < h.p(); ++r) {
      // hier: 2 (H-1)/H x n/K per rank; ring: 2 (p-1)/p x n on the last rank of each host, else 0.
      EXPECT_EQ(hier[r], 2 * (h.H - 1) * (n * 4 / h.K) / h.H) << h.str() << " rank " << r;
      const bool last = r % h.K == h.K - 1;
      EXPECT_EQ(ring[r], last ? 2 * (h.p() - 1) * (n * 4) / h.p() : 0u) << h.str() << " rank " << r;
    }
  }
}

// ---- results ----
TEST(HierAllReduce, EqualsTheFlatRing) {
  const std::size_t sizes[] = {1, 2, 7, 1031, (std::size_t{1} << 18) + 3, std::size_t{1} << 20};  // up to 4 MiB
  for (const Hosts& h : kLayouts)
    for (std::size_t n : sizes) {
      compare_with_ring<float>(h, n, mc::ReduceOp::sum, /*integers=*/true);
      compare_with_ring<float>(h, n, mc::ReduceOp::sum, /*integers=*/false);
    }
  for (const Hosts& h : kLayouts) {
    compare_with_ring<float>(h, 1031, mc::ReduceOp::avg, false);
    compare_with_ring<double>(h, 1031, mc::ReduceOp::sum, false);
    compare_with_ring<std::int64_t>(h, 1031, mc::ReduceOp::sum, true);
    compare_with_ring<float>(h, 1031, mc::ReduceOp::max, false);
  }
}

TEST(HierAllReduce, PassesTheWholeCollectiveMatrixOnHosts) {
  // Every operation, algorithm (hier included), count, type and reduction of checks.h.
  for (const Hosts& h : {Hosts{2, 2}, Hosts{2, 3}, Hosts{3, 2}})
    EXPECT_NO_THROW(mc::run_threads(h.p(), [&](Communicator& c) {
      c.set_hosts(mc::hosts_in_blocks(c.size(), h.K));
      mc::testing::check_everything(c);
    }, {.timeout = std::chrono::seconds(60)})) << h.str();
}

TEST(HierAllReduce, SubGroupsInheritTheirRanksHosts) {
  // 8 ranks on 2 hosts; the even ranks form a group of 4 with 2 on each host.
  mc::run_threads(8, [](Communicator& c) {
    c.set_hosts(mc::hosts_in_blocks(8, 4));
    auto g = c.split(c.rank() % 2, c.rank());
    EXPECT_EQ(g->num_hosts(), 2);
    EXPECT_EQ(g->ranks_per_host(), 2);
    std::vector<float> v(100, 1.0f);
    g->all_reduce(v, {.algorithm = Algorithm::hier});
    EXPECT_EQ(v[99], 4.0f);
  });
}

TEST(HierAllReduce, OneHostIsAUsageError) {
  mc::run_threads(4, [](Communicator& c) {
    std::vector<float> v(10, 1.0f);
    try {
      c.all_reduce(v, {.algorithm = Algorithm::hier});
      ADD_FAILURE() << "hier ran on one host";
    } catch (const mc::CommError& e) {
      EXPECT_EQ(e.kind(), mc::ErrorKind::usage);
      EXPECT_NE(std::string(e.what()).find("two or more hosts"), std::string::npos) << e.what();
    }
  });
}

// ---- auto ----
// Links as a cluster file gives them (docs/planner.md: alpha = latency_us, beta = 1 / bandwidth).
mc::CostParams link(double gbps, double latency_us) { return {latency_us * 1e-6, 1.0 / (gbps * 1e9), 1.0 / 10e9}; }

TEST(HierChooser, PicksHierOnlyWhenTheLinksBetweenHostsAreSlower) {
  const mc::CostParams in_host = link(10, 5), slow = link(0.125, 1000);  // shared memory; 1 Gbit/s, 1 ms
  for (const Hosts& h : {Hosts{2, 2}, Hosts{2, 8}, Hosts{4, 2}}) {
    const mc::HostLayout slower{h.H, h.K, in_host, slow}, same{h.H, h.K, in_host, in_host};
    EXPECT_EQ(mc::choose_all_reduce(std::size_t{64} << 20, slower, "threads"), Algorithm::hier) << h.str();
    EXPECT_LT(mc::predicted_hier_seconds(std::size_t{64} << 20, slower),
              mc::predicted_flat_seconds(Algorithm::ring, std::size_t{64} << 20, slower));
    for (std::size_t n : {std::size_t{4}, std::size_t{4096}, std::size_t{64} << 20}) {
      EXPECT_NE(mc::choose_all_reduce(n, same, "threads"), Algorithm::hier) << h.str() << " n=" << n;
      EXPECT_EQ(mc::choose_all_reduce(n, same, "threads"), mc::choose_algorithm(mc::OpKind::all_reduce, n, h.p(), "threads"));
    }
  }
  // A100 nodes as examples/clusters/a100-3072.json describes them: NVLink 300 GB/s 3 us inside,
  // 25 GB/s 5 us across.
  const mc::HostLayout a100{4, 8, link(300, 3), link(25, 5)};
  EXPECT_EQ(mc::choose_all_reduce(std::size_t{64} << 20, a100, "threads"), Algorithm::hier);
  // One host, or one rank per host: nothing to gain.
  EXPECT_NE(mc::choose_all_reduce(std::size_t{64} << 20, {1, 4, in_host, slow}, "threads"), Algorithm::hier);
  EXPECT_NE(mc::choose_all_reduce(std::size_t{64} << 20, {4, 1, in_host, slow}, "threads"), Algorithm::hier);
}

TEST(HierChooser, AutoRunsHierOnACommunicatorToldItsHostLinksAreSlower) {
  const Hosts h{2, 2};
  const std::size_t n = 1 << 20;
  std::vector<std::uint64_t> got(4), plain(4);
  mc::run_threads(4, [&](Communicator& c) {
    std::vector<float> v(n, 1.0f);
    c.set_hosts(mc::hosts_in_blocks(4, 2));  // emulated hosts, the backend's own link: flat
    c.all_reduce(v);
    plain[c.rank()] = c.stats().bytes_sent_cross_host;
    c.set_hosts(mc::hosts_in_blocks(4, 2), link(0.125, 1000));
    c.reset_stats();
    c.all_reduce(v);
    got[c.rank()] = c.stats().bytes_sent_cross_host;
    EXPECT_EQ(v[0], 16.0f);
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[r], hier_cross(n, h, r, 4)) << "rank " << r;
  EXPECT_NE(plain, got);
}

// ---- sliced over shared memory (hier.cpp, hier_sliced) ----
// On threads the ranks of an emulated host share memory, so hier runs as a pipeline of pieces
// once a message spans more than MESHTRAIN_COMM_HIER_SLICE_BYTES (set small here: many pieces).
namespace {

struct SliceBytes {  // sets the slice for a scope (no rank thread runs while it changes)
  explicit SliceBytes(std::size_t b) { setenv("MESHTRAIN_COMM_HIER_SLICE_BYTES", std::to_string(b).c_str(), 1); }
  ~SliceBytes() { unsetenv("MESHTRAIN_COMM_HIER_SLICE_BYTES"); }
};
constexpr std::size_t kSlice = 4096;  // bytes: pieces of 2048 / K bytes a block

// hier.cpp's piece: slice / K bytes, rounded down to whole 64-byte units times H.
std::size_t piece_elems(const Hosts& h, std::size_t es) {
  const std::size_t unit = std::max<std::size_t>(1, 64 / es) * h.H;
  return std::max<std::size_t>(1, kSlice / h.K / es / unit) * unit;
}
// Bytes across hosts of the sliced hier: each piece of block k goes through its own ring.
std::uint64_t sliced_cross(std::size_t n, const Hosts& h, int r, std::size_t es) {
  const mc::Layout l = mc::even_layout(n, h.K);
  const std::size_t m = l.count(r % h.K), q = piece_elems(h, es);
  std::uint64_t sum = 0;
  for (std::size_t first = 0; first < m; first += q) sum += ring_sent(std::min(q, m - first), h.H, r / h.K, es);
  return sum;
}

// Every rank's result of one all-reduce of `input` with hier (after `warm` earlier calls).
template <class T>
std::vector<std::vector<T>> hier_results(const Hosts& h, std::size_t n, mc::ReduceOp op, bool integers,
                                         std::vector<std::uint64_t>* cross = nullptr) {
  std::vector<std::vector<T>> out(static_cast<std::size_t>(h.p()));
  if (cross) cross->assign(static_cast<std::size_t>(h.p()), 0);
  mc::run_threads(h.p(), [&](Communicator& c) {
    c.set_hosts(mc::hosts_in_blocks(c.size(), h.K));
    const std::vector<T> in = input<T>(c.rank(), n, integers);
    std::vector<T> v(n);
    c.reset_stats();
    c.all_reduce(in, v, {.op = op, .algorithm = Algorithm::hier, .chunk_bytes = 1024});
    if (cross) (*cross)[static_cast<std::size_t>(c.rank())] = c.stats().bytes_sent_cross_host;
    out[static_cast<std::size_t>(c.rank())] = std::move(v);
  });
  return out;
}

template <class T>
void sliced_equals_unsliced(const Hosts& h, std::size_t n, mc::ReduceOp op, bool integers) {
  std::vector<std::vector<T>> sliced, whole;
  {
    SliceBytes s(kSlice);
    sliced = hier_results<T>(h, n, op, integers);
  }
  {
    SliceBytes s(0);  // slicing off: the three phases one after the other
    whole = hier_results<T>(h, n, op, integers);
  }
  for (int r = 0; r < h.p(); ++r)
    for (std::size_t i = 0; i < n; ++i)
      if (std::memcmp(&sliced[r][i], &whole[r][i], sizeof(T)) != 0) {
        ADD_FAILURE() << h.str() << " n=" << n << " rank " << r << " element " << i << ": " << sliced[r][i]
                      << " sliced, " << whole[r][i] << " unsliced";
        return;
      }
}

}  // namespace

TEST(HierSliced, CountedCrossHostBytesEqualTheSlicedFormula) {
  SliceBytes s(kSlice);
  for (const Hosts& h : {Hosts{2, 2}, Hosts{2, 3}, Hosts{3, 2}, Hosts{2, 4}})
    for (std::size_t n : {std::size_t{12000}, std::size_t{65543}, std::size_t{100003}}) {
      std::vector<std::uint64_t> cross;
      hier_results<float>(h, n, mc::ReduceOp::sum, true, &cross);
      std::uint64_t total = 0;
      for (int r = 0; r < h.p(); ++r) {
        EXPECT_EQ(cross[r], sliced_cross(n, h, r, 4)) << h.str() << " n=" << n << " rank " << r;
        total += cross[r];
      }
      EXPECT_EQ(total, 2u * (h.H - 1) * n * 4) << h.str() << " n=" << n;
    }
}

TEST(HierSliced, DivisibleSizesGiveTheClosedForm) {
  // n divisible by K x H: every piece splits evenly across hosts, so 2 (H-1)/H x n/K per rank,
  // as unsliced.
  SliceBytes s(kSlice);
  const std::size_t n = 12000;
  for (const Hosts& h : {Hosts{2, 2}, Hosts{2, 3}, Hosts{3, 2}}) {
    std::vector<std::uint64_t> cross;
    hier_results<float>(h, n, mc::ReduceOp::sum, true, &cross);
    ASSERT_GT(n / h.K, piece_elems(h, 4)) << "several pieces";
    for (int r = 0; r < h.p(); ++r) {
      EXPECT_EQ(cross[r], 2 * (h.H - 1) * (n * 4 / h.K) / h.H) << h.str() << " rank " << r;
      EXPECT_EQ(cross[r], hier_cross(n, h, r, 4)) << h.str() << " rank " << r;
    }
  }
}

TEST(HierSliced, TwoHostsGiveTheUnslicedBitsExactly) {
  // At H = 2 the sliced pipeline adds in the unsliced order: bit for bit the same, whatever
  // the type, the reduction, or a size that leaves a short last piece.
  for (const Hosts& h : {Hosts{2, 2}, Hosts{2, 3}, Hosts{2, 4}})
    for (std::size_t n : {std::size_t{4097}, std::size_t{65543}}) {
      sliced_equals_unsliced<float>(h, n, mc::ReduceOp::sum, false);
      sliced_equals_unsliced<float>(h, n, mc::ReduceOp::avg, false);
      sliced_equals_unsliced<float>(h, n, mc::ReduceOp::max, false);
      sliced_equals_unsliced<double>(h, n, mc::ReduceOp::sum, false);
      sliced_equals_unsliced<std::int64_t>(h, n, mc::ReduceOp::sum, true);
      sliced_equals_unsliced<std::int64_t>(h, n, mc::ReduceOp::avg, true);
    }
}

TEST(HierSliced, ThreeHostsAreDeterministicAndEqualTheRingWithinRoundOff) {
  // At H = 3 the order of the three host sums depends on where an element falls in its piece:
  // deterministic, exact for integers, within round-off of the flat ring for floats.
  SliceBytes s(kSlice);
  const Hosts h{3, 2};
  const std::size_t n = 65543;
  const auto a = hier_results<float>(h, n, mc::ReduceOp::sum, false);
  const auto b = hier_results<float>(h, n, mc::ReduceOp::sum, false);
  EXPECT_EQ(a, b);
  compare_with_ring<float>(h, n, mc::ReduceOp::sum, false);
  compare_with_ring<float>(h, n, mc::ReduceOp::sum, true);
  compare_with_ring<double>(h, n, mc::ReduceOp::avg, false);
  compare_with_ring<std::int64_t>(h, n, mc::ReduceOp::sum, true);
}

TEST(HierSliced, ManyCallsSyncAndAsyncMixedWithSmallOnes) {
  // Sliced and unsliced calls in turn, async ones queued behind each other, and a sub-group:
  // the exchanges' numbers and the worker's hand-over carry from call to call.
  SliceBytes s(kSlice);
  const Hosts h{2, 2};
  mc::run_threads(h.p(), [&](Communicator& c) {
    c.set_hosts(mc::hosts_in_blocks(c.size(), h.K));
    for (int round = 0; round < 3; ++round) {
      std::vector<float> big(20000 + round, float(c.rank() + 1)), small(100, 1.0f), big2(30001, 2.0f);
      c.all_reduce(big, {.algorithm = Algorithm::hier});
      c.all_reduce(small, {.algorithm = Algorithm::hier});
      mc::Work w1 = c.all_reduce_async(big2, {.algorithm = Algorithm::hier});
      mc::Work w2 = c.all_reduce_async(big, {.algorithm = Algorithm::hier});
      w1.wait();
      w2.wait();
      EXPECT_EQ(big.front(), 40.0f);  // (1+2+3+4) x 4
      EXPECT_EQ(big.back(), 40.0f);
      EXPECT_EQ(small[99], 4.0f);
      EXPECT_EQ(big2[30000], 8.0f);
    }
  });
}

TEST(HierSliced, SlicesWhereTheMessageSpansTwoSlicesOrMore) {
  // MESHTRAIN_COMM_HIER_TIMES prints one line per rank for each sliced call (its phases' times):
  // the lines show which calls were sliced, and how many steps they took.
  SliceBytes s(kSlice);
  setenv("MESHTRAIN_COMM_HIER_TIMES", "1", 1);
  ::testing::internal::CaptureStderr();
  mc::run_threads(4, [&](Communicator& c) {
    c.set_hosts(mc::hosts_in_blocks(4, 2));
    std::vector<float> one_slice(kSlice / 4, 1.0f), many(kSlice / 4 * 10, 1.0f);
    c.all_reduce(one_slice, {.algorithm = Algorithm::hier});
    c.all_reduce(many, {.algorithm = Algorithm::hier});
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  unsetenv("MESHTRAIN_COMM_HIER_TIMES");
  // #0 (one slice) was not sliced; #1 (10 slices) was, each block (20480 bytes) in 10 pieces of 2048.
  EXPECT_EQ(err.find("#0 rank"), std::string::npos) << err;
  for (int k = 0; k < 2; ++k) {
    std::string line = "hier threads #1 rank ";
    line += std::to_string(k);
    line += "/2: ";
    EXPECT_NE(err.find(line), std::string::npos) << err;
  }
  EXPECT_NE(err.find(", 10 pieces of 2048 B a block"), std::string::npos) << err;
}

TEST(HierSliced, RankThatThrowsFailsTheOthersPromptly) {
  // Rank 3 throws instead of entering a sliced all-reduce: its host peer fails in the shared-
  // memory exchange, the other host's ranks in the ring across hosts or their exchange; every
  // one of them reports all_reduce #1, long before the deadline, and the workers let go.
  // Rank 3 throws once every rank has left all_reduce #0: it may leave #0 first (its host's
  // part done), and its failure would then fail the others still finishing #0.
  SliceBytes s(kSlice);
  std::vector<std::string> errors(4);
  std::atomic<int> past_first{0};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    mc::run_threads(4, [&](Communicator& c) {
      c.set_hosts(mc::hosts_in_blocks(4, 2));
      std::vector<float> x(20000, 1.0f);
      c.all_reduce(x, {.algorithm = Algorithm::hier});
      past_first.fetch_add(1);
      if (c.rank() == 3) {
        while (past_first.load() < 4) std::this_thread::yield();
        throw std::runtime_error("boom in rank 3");
      }
      try {
        c.all_reduce(x, {.algorithm = Algorithm::hier});
      } catch (const mc::CommError& e) {
        errors[static_cast<std::size_t>(c.rank())] = e.what();
        throw;
      }
    }, {.timeout = std::chrono::seconds(60)});
  } catch (const std::exception&) {
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  for (int r : {0, 1, 2})
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("all_reduce #1 on group 'world'"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
}

TEST(HierSliced, RankThatNeverCallsTimesOut) {
  SliceBytes s(kSlice);
  std::vector<std::string> errors(4);
  std::atomic<bool> release{false};
  try {
    mc::run_threads(4, [&](Communicator& c) {
      c.set_hosts(mc::hosts_in_blocks(4, 2));
      std::vector<float> x(20000, 1.0f);
      c.all_reduce(x, {.algorithm = Algorithm::hier});
      if (c.rank() == 1) {
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      try {
        c.all_reduce(x, {.algorithm = Algorithm::hier, .timeout = std::chrono::milliseconds(500)});
      } catch (const mc::CommError& e) {
        errors[static_cast<std::size_t>(c.rank())] = e.what();
        release = true;
        throw;
      }
    }, {.timeout = std::chrono::seconds(60)});
  } catch (const std::exception&) {
  }
  release = true;
  for (int r : {0, 2, 3})
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("all_reduce #1 on group 'world'"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
}
