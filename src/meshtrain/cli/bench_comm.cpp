// `meshtrain bench comm`: bandwidth and latency of one collective over a range of sizes, with
// the nccl-tests conventions: algbw = size / time; busbw = algbw x 2(p-1)/p for all_reduce,
// x (p-1)/p for reduce_scatter, all_gather and all_to_all, x 1 for broadcast and sendrecv;
// size is the whole buffer (all_reduce, broadcast), the whole input of reduce_scatter, the
// whole output of all_gather, one rank's buffer for all_to_all, one message for sendrecv.
// Every result is checked against a serial reference after the timed loop. As peer figures it
// prints, from the same run, on threads: the single-thread memcpy bandwidth (ratio = busbw /
// memcpy) and the memory-traffic limit of the machine, two threads copying `size` bytes each at
// once with their total rate halved, with memcpy or with streaming stores, whichever is faster
// (limit = busbw / that; an all-reduce at world 2 that reads and writes each byte once moves
// what such a copy moves); under mpi: the MPI library's own
// collective (`native`), with the ratio.
//
// Time per size: all ranks barrier, then run the operation back to back, --iters times (by
// default from the size: 256 MiB worth, at least 20 and at most 10000, so small messages are
// timed over many operations), --reps times. Each iteration's time is that of the slowest rank;
// the figure is the median over all timed iterations. Float32 only.
//
// Hosts (--ranks-per-host K, or mpirun's hosts under mpi): two more columns give the bytes one
// operation sent to ranks on other hosts, counted by the communicator (CommStats::
// bytes_sent_cross_host) in one untimed run: the most any rank sent, and the mean over ranks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/comm/select.h"
#include "meshtrain/comm/world.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::cli {

namespace {
namespace mc = meshtrain::comm;
namespace train = meshtrain::train;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string backend, op = "all_reduce", sizes = "4K:256M", algo = "auto";
  int world = 0, iters = 0, warmup = 3, reps = 3;  // iters 0: iters_for(size)
  int ranks_per_host = 0;
  bool ranks_per_host_given = false;
  std::size_t chunk = 0;
  double timeout_s = 60;
};

// ---- size parsing ----
// Sizes are whole numbers of bytes, optionally with a binary suffix (K, M, G; KiB, MiB, GiB;
// B), written as a plain decimal ("4096", "1.5K", "2e3"); no sign, hex, inf or nan. Each must be
// a multiple of the element size (float32: 4 bytes) and at most kMaxSizeBytes, so doubling a
// range never overflows.
constexpr std::size_t kElement = sizeof(float);
constexpr std::size_t kMaxSizeBytes = std::size_t{1} << 40;  // 1 TiB

std::size_t parse_size(const std::string& s, const std::string& spec) {
  const std::string quoted = "--sizes " + spec + ": ";
  if (s.empty()) throw UsageError(quoted + "a size is empty; give sizes like 4K, 64M or 1G separated by single commas");
  // The number: digits, an optional fraction, an optional exponent, and nothing else.
  std::size_t pos = 0;
  auto digits = [&] {
    const std::size_t from = pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') ++pos;
    return pos > from;
  };
  bool number = digits();
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    number = digits() || number;
  }
  if (number && pos < s.size() && (s[pos] == 'e' || s[pos] == 'E')) {
    const std::size_t mark = pos++;
    if (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) ++pos;
    if (!digits()) pos = mark;  // "4E" is not an exponent: leave it to the unit check
  }
  if (!number)
    throw UsageError(quoted + "'" + s + "' is not a size; give a whole number of bytes like 4096, 4K, 64M or 1G");
  const std::string unit = s.substr(pos);
  double mul = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mul = 1024;
  else if (unit == "M" || unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw UsageError(quoted + "unknown unit in '" + s + "'; give a whole number of bytes, or K, M or G after it");
  const double bytes = std::strtod(s.substr(0, pos).c_str(), nullptr) * mul;
  if (!std::isfinite(bytes) || bytes > static_cast<double>(kMaxSizeBytes))
    throw UsageError(quoted + "'" + s + "' is more than 1 TiB (1024G), the largest size bench comm takes; give "
                     "smaller sizes");
  if (bytes != std::floor(bytes)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", bytes);
    throw UsageError(quoted + "'" + s + "' is " + buf + " bytes, not a whole number of bytes; give a size like 4096, "
                     "4K or 1.5K");
  }
  const auto b = static_cast<std::size_t>(bytes);
  if (b < kElement)
    throw UsageError(quoted + "'" + s + "' is " + std::to_string(b) +
                     " bytes, less than one float32 element; give at least 4 bytes");
  if (b % kElement != 0)
    throw UsageError(quoted + "'" + s + "' is " + std::to_string(b) +
                     " bytes, not a multiple of the 4-byte float32 element; give " +
                     std::to_string(b / kElement * kElement) + " or " + std::to_string((b / kElement + 1) * kElement));
  return b;
}

std::vector<std::size_t> parse_sizes(const std::string& spec) {
  std::vector<std::size_t> out;
  if (spec.empty()) throw UsageError("--sizes is empty; give a range LO:HI (e.g. 4K:256M) or a list (e.g. 4K,64M)");
  const auto colon = spec.find(':');
  if (colon == std::string::npos) {
    std::size_t start = 0;
    while (start <= spec.size()) {
      auto comma = spec.find(',', start);
      if (comma == std::string::npos) comma = spec.size();
      if (comma == start)
        throw UsageError("--sizes " + spec + ": item " + std::to_string(out.size() + 1) +
                         " is empty; give sizes like 4K,64M separated by single commas");
      out.push_back(parse_size(spec.substr(start, comma - start), spec));
      start = comma + 1;
    }
    return out;
  }
  if (spec.find_first_of(":,", colon + 1) != std::string::npos || spec.find(',') < colon)
    throw UsageError("--sizes " + spec + ": give either one range LO:HI (e.g. 4K:256M) or a list (e.g. 4K,64M), "
                     "not both or several ranges");
  const std::size_t lo = parse_size(spec.substr(0, colon), spec), hi = parse_size(spec.substr(colon + 1), spec);
  if (lo > hi) throw UsageError("--sizes " + spec + ": the range runs backwards; give LO:HI with LO at most HI");
  for (std::size_t s = lo; s <= hi; s *= 2) out.push_back(s);  // hi <= 1 TiB: no overflow
  return out;
}

std::string human(std::size_t b) {
  char buf[32];
  if (b >= (1u << 30) && b % (1u << 30) == 0) std::snprintf(buf, sizeof buf, "%zuG", b >> 30);
  else if (b >= (1u << 20) && b % (1u << 20) == 0) std::snprintf(buf, sizeof buf, "%zuM", b >> 20);
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%zuK", b >> 10);
  else std::snprintf(buf, sizeof buf, "%zu", b);
  return buf;
}

// ---- one operation ----

// Timed iterations per size when --iters is not given: 256 MiB worth, within [20, 10000].
int iters_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / std::max<std::size_t>(bytes, 1), 20, 10000));
}

// Ops whose buffer is cut into one block per rank: sizes round down to a multiple of the world.
bool splits(const std::string& op) { return op == "reduce_scatter" || op == "all_gather" || op == "all_to_all"; }

// The buffers one rank holds for `op` at size `bytes` (OpRun::setup), in bytes.
double rank_buffer_bytes(const std::string& op, int p, std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (op == "all_reduce" || op == "broadcast") return b;
  if (op == "reduce_scatter" || op == "all_gather") return b + b / p;
  return 2 * b;  // all_to_all, sendrecv: an input and an output of the whole size
}
struct OpRun {
  std::string op;
  mc::Algorithm algo;
  std::size_t chunk;
  std::size_t count;  // elements: see the header comment for what the size covers
  std::vector<float> in, out;
  double bus_factor;

  void setup(int p, std::size_t bytes) {
    std::size_t n = bytes / sizeof(float);  // parse_sizes: a whole number of elements
    if (splits(op)) n = n / p * p;            // run_bench: at least p of them
    count = n;
    if (op == "all_reduce") bus_factor = 2.0 * (p - 1) / p;
    else if (op == "broadcast" || op == "sendrecv") bus_factor = 1.0;
    else bus_factor = double(p - 1) / p;
    if (op == "reduce_scatter") in.assign(n, 0.0f), out.assign(n / p, 0.0f);
    else if (op == "all_gather") in.assign(n / p, 0.0f), out.assign(n, 0.0f);
    else if (op == "all_to_all" || op == "sendrecv") in.assign(n, 0.0f), out.assign(n, 0.0f);
    else in.clear(), out.assign(n, 0.0f);
  }
  void run(mc::Communicator& c) {
    const int p = c.size(), r = c.rank();
    if (op == "all_reduce") c.all_reduce(out, {.algorithm = algo, .chunk_bytes = chunk});
    else if (op == "reduce_scatter") c.reduce_scatter(in, out, {.algorithm = algo, .chunk_bytes = chunk});
    else if (op == "all_gather") c.all_gather(in, out, {.algorithm = algo, .chunk_bytes = chunk});
    else if (op == "broadcast") c.broadcast(out, {.algorithm = algo, .chunk_bytes = chunk});
    else if (op == "all_to_all") c.all_to_all(in, out, {.algorithm = algo});
    else {  // sendrecv: to the next rank, from the previous one
      mc::Work s = c.isend(in, (r + 1) % p);
      c.recv(out, (r + p - 1) % p);
      s.wait();
    }
  }
  // Fills inputs from (rank, index), runs once, and compares with the serial reference.
  bool check(mc::Communicator& c) {
    const int p = c.size(), r = c.rank();
    auto v = [](int rank, std::size_t i) { return static_cast<float>(static_cast<long>((rank + 1) * 7 + i % 13) % 17); };
    auto& src = (op == "all_reduce" || op == "broadcast") ? out : in;
    const std::size_t blk = op == "all_gather" ? in.size() : 0;
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = v(r, i + r * blk);
    run(c);
    bool ok = true;
    for (std::size_t i = 0; i < out.size() && ok; ++i) {
      float want = 0;
      if (op == "all_reduce") {
        for (int q = 0; q < p; ++q) want += v(q, i);
      } else if (op == "reduce_scatter") {
        for (int q = 0; q < p; ++q) want += v(q, r * out.size() + i);
      } else if (op == "all_gather") {
        want = v(static_cast<int>(i / blk), i);
      } else if (op == "broadcast") {
        want = v(0, i);
      } else if (op == "all_to_all") {
        const std::size_t b = out.size() / p;
        want = v(static_cast<int>(i / b), r * b + i % b);
      } else {
        want = v((r + p - 1) % p, i);
      }
      ok = out[i] == want;
    }
    std::vector<std::int64_t> bad{ok ? 0 : 1};
    c.all_reduce(bad);
    std::fill(in.begin(), in.end(), 0.0f);
    std::fill(out.begin(), out.end(), 0.0f);
    return bad[0] == 0;
  }
  // Bytes one run sent to other hosts: the most any rank sent, and the mean over ranks.
  std::pair<double, double> cross_host_bytes(mc::Communicator& c) {
    c.reset_stats();
    run(c);
    std::vector<double> v{static_cast<double>(c.stats().bytes_sent_cross_host)};
    std::vector<double> most = v;
    c.all_reduce(most, {.op = mc::ReduceOp::max});
    c.all_reduce(v, {.op = mc::ReduceOp::avg});
    return {most[0], v[0]};
  }
  // Seconds per operation: each iteration's time on the slowest rank (every rank times each of
  // its iterations; an element-wise max over ranks follows each loop), the median over the
  // `iters` x `reps` timed iterations.
  double time(mc::Communicator& c, int warmup, int iters, int reps) {
    for (int i = 0; i < warmup; ++i) run(c);
    std::vector<double> all, t(static_cast<std::size_t>(iters));
    all.reserve(static_cast<std::size_t>(iters) * reps);
    for (int rep = 0; rep < reps; ++rep) {
      c.barrier();
      auto prev = Clock::now();
      for (int i = 0; i < iters; ++i) {
        run(c);
        const auto now = Clock::now();
        t[static_cast<std::size_t>(i)] = std::chrono::duration<double>(now - prev).count();
        prev = now;
      }
      c.all_reduce(t, {.op = mc::ReduceOp::max});
      all.insert(all.end(), t.begin(), t.end());
    }
    const auto mid = all.begin() + static_cast<std::ptrdiff_t>(all.size() / 2);
    std::nth_element(all.begin(), mid, all.end());
    return *mid;
  }
};

double memcpy_seconds(std::size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  return best;
}

// A copy with non-temporal stores (no read-for-ownership of the destination), as glibc's memcpy
// does above its threshold; the threshold comes from the last-level cache the CPU reports, and a
// VM can report one larger than the buffers, so memcpy alone may not show what the memory does.
void stream_copy(char* dst, const char* src, std::size_t bytes) {
#if defined(__AVX512F__)
  std::size_t i = 0;
  for (; i < bytes && reinterpret_cast<std::uintptr_t>(dst + i) % 64 != 0; ++i) dst[i] = src[i];
  for (; i + 64 <= bytes; i += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  for (; i < bytes; ++i) dst[i] = src[i];
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

// The memory-traffic limit: ranks 0 and 1 each copy `bytes` between buffers of their own at once,
// `iters` times, once with memcpy and once with streaming stores; the slowest of the two ranks
// gives the time, and the fastest of three loops of each kind counts. Returns one thread's share
// of the two threads' copy rate (bytes / time), GB/s; 0 at world 1.
double copy2_half_rate(mc::Communicator& c, std::size_t bytes, int iters) {
  if (c.size() < 2) return 0;
  const bool copier = c.rank() < 2;
  std::vector<char> a(copier ? bytes : 0, 1), b(copier ? bytes : 0, 0);
  if (copier) std::memcpy(b.data(), a.data(), bytes);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    c.barrier();
    const auto t0 = Clock::now();
    if (copier)
      for (int i = 0; i < iters; ++i) {
        if (rep % 2) stream_copy(b.data(), a.data(), bytes);
        else std::memcpy(b.data(), a.data(), bytes);
        asm volatile("" : : "r"(b.data()) : "memory");
      }
    std::vector<double> t{copier ? std::chrono::duration<double>(Clock::now() - t0).count() / iters : 0.0};
    c.all_reduce(t, {.op = mc::ReduceOp::max});
    best = std::min(best, t[0]);
  }
  return static_cast<double>(bytes) / best / 1e9;
}

// ---- hosts ----
// --ranks-per-host, and the two or more hosts --algo hier needs.
void check_hosts(const BenchArgs& a, mc::Backend backend, int ranks, mc::Algorithm algo) {
  try {
    if (a.ranks_per_host_given) train::check_ranks_per_host(a.ranks_per_host, ranks);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (algo != mc::Algorithm::hier) return;
  const bool mpi = backend == mc::Backend::mpi;
  const int hosts = a.ranks_per_host > 0 ? ranks / a.ranks_per_host : mpi ? mc::mpi_world()->num_hosts() : 1;
  if (hosts < 2)
    throw UsageError("--algo hier reduces inside each host and then across hosts, and the " + std::to_string(ranks) +
                     " ranks are one host; " +
                     (mpi ? std::string("place the processes on two or more hosts, or give --ranks-per-host K to group them")
                          : "give --ranks-per-host K to emulate hosts (ranks [0, K) are host 0, ...), K below " +
                                std::to_string(ranks) + " and dividing it"));
  if (mpi && a.ranks_per_host == 0 && mc::mpi_world()->ranks_per_host() == 0)
    throw UsageError("--algo hier needs as many ranks on each host, and mpirun placed them unevenly; give "
                     "--ranks-per-host K to group them");
}

// ---- the command ----
void run_bench(const BenchArgs& a) {
  const mc::Backend backend = a.backend.empty() ? mc::default_backend() : (a.backend == "mpi" ? mc::Backend::mpi : mc::Backend::threads);
  if (backend == mc::Backend::mpi && !mc::have_mpi()) throw UsageError("--backend mpi: this meshtrain was built without MPI");
  if (backend == mc::Backend::mpi && !mc::launched_by_mpirun())
    throw UsageError("--backend mpi needs the ranks started by mpirun, e.g. mpirun -np 2 meshtrain bench comm --backend mpi");
  const int world = backend == mc::Backend::threads ? (a.world ? a.world : 2) : a.world;
  if (backend == mc::Backend::threads && world < 1) throw UsageError("--world must be at least 1");
  if (backend == mc::Backend::mpi && a.world && a.world != mc::mpi_world()->size())
    throw UsageError("--world " + std::to_string(a.world) + " differs from the " + std::to_string(mc::mpi_world()->size()) +
                     " processes mpirun started (leave --world out under mpirun)");
  if (a.iters < 0) throw UsageError("--iters must be at least 1");
  if (a.reps < 1) throw UsageError("--reps must be at least 1");
  const auto algo = mc::parse_algorithm(a.algo);
  if (!algo) throw UsageError("--algo: unknown algorithm '" + a.algo + "'");
  static const std::pair<const char*, mc::OpKind> kinds[] = {
      {"all_reduce", mc::OpKind::all_reduce}, {"reduce_scatter", mc::OpKind::reduce_scatter},
      {"all_gather", mc::OpKind::all_gather}, {"broadcast", mc::OpKind::broadcast}, {"all_to_all", mc::OpKind::all_to_all}};
  bool known_op = a.op == "sendrecv";
  for (auto& [name, kind] : kinds)
    if (a.op == name) {
      known_op = true;
      if (!mc::supports(kind, *algo)) throw UsageError("--algo " + a.algo + " does not implement " + a.op);
    }
  if (!known_op) throw UsageError("--op: unknown operation '" + a.op + "'");
  if (a.op == "sendrecv" && *algo != mc::Algorithm::automatic) throw UsageError("--op sendrecv takes no --algo");
  if (*algo == mc::Algorithm::native && backend != mc::Backend::mpi) throw UsageError("--algo native needs --backend mpi");

  // ---- sizes, and the memory they take, before any rank starts ----
  const std::vector<std::size_t> sizes = parse_sizes(a.sizes);
  const int ranks = backend == mc::Backend::threads ? world : mc::mpi_world()->size();
  check_hosts(a, backend, ranks, *algo);
  const std::size_t largest = *std::max_element(sizes.begin(), sizes.end());
  bool rounded = false;
  if (splits(a.op))
    for (std::size_t s : sizes) {
      if (s < kElement * ranks)
        throw UsageError("--sizes " + a.sizes + ": " + human(s) + " is less than one float32 element per rank for " +
                         a.op + " over " + std::to_string(ranks) + " ranks; give sizes of at least " +
                         std::to_string(kElement * ranks) + " bytes");
      rounded = rounded || s % (kElement * ranks) != 0;
    }
  const int local = backend == mc::Backend::threads ? ranks : 1;  // ranks in this process
  const bool native_peer = backend == mc::Backend::mpi && a.op != "sendrecv";
  double need = local * rank_buffer_bytes(a.op, ranks, largest) * (native_peer ? 2 : 1);
  if (backend == mc::Backend::threads) need += 6.0 * static_cast<double>(largest);  // the memcpy and copy references
  const train::Machine machine = train::Machine::probe();
  if (machine.memory_bytes > 0 && need > static_cast<double>(machine.memory_bytes))
    throw UsageError("--sizes " + a.sizes + ": the largest size, " + human(largest) + ", needs at least " +
                     train::format_bytes(need) + " of buffers in this process (" + std::to_string(local) +
                     " rank(s) of " + a.op + (backend == mc::Backend::threads ? ", plus the memcpy reference" : "") +
                     ") but the machine has " + train::format_bytes(static_cast<double>(machine.memory_bytes)) +
                     " available (" + machine.memory_source + "); give smaller --sizes or a smaller --world");

  mc::ThreadsOptions topts{.timeout = mc::Timeout(static_cast<long>(a.timeout_s * 1000))};
  bool all_ok = true;
  mc::run_world(backend, backend == mc::Backend::threads ? world : 0, [&](mc::Communicator& c) {
    const int p = c.size();
    const bool lead = c.rank() == 0;
    const bool mpi = backend == mc::Backend::mpi;
    const bool peer_native = mpi && a.op != "sendrecv";
    if (a.ranks_per_host > 0) c.set_hosts(mc::hosts_in_blocks(p, a.ranks_per_host), c.host_link());
    const bool hosts = c.num_hosts() > 1;
    if (lead) {
      const std::string iters = a.iters ? std::to_string(a.iters) : std::string("auto");
      std::printf("# meshtrain bench comm: op=%s backend=%s world=%d algo=%s iters=%s reps=%d dtype=float32\n",
                  a.op.c_str(), mc::to_string(backend), p, a.algo.c_str(), iters.c_str(), a.reps);
      std::printf("# busbw = algbw x %s; time: per iteration the slowest rank's, the median over %s iterations x "
                  "--reps\n",
                  a.op == "all_reduce" ? "2(p-1)/p" : (a.op == "broadcast" || a.op == "sendrecv") ? "1" : "(p-1)/p",
                  a.iters ? "--iters" : "iters (by size: 256 MiB worth, 20 to 10000)");
      if (!mpi)
        std::printf("# ratio = busbw / memcpy (one thread alone); limit = busbw / copy2/2, where copy2/2 is half "
                    "the total rate of two threads copying size bytes each at once (memcpy or streaming stores, "
                    "the faster)\n");
      else if (peer_native)
        std::printf("# native: the MPI library's own collective (MPI_I...), timed the same way; ratio = busbw / native\n");
      if (rounded)
        std::printf("# %s: sizes are rounded down to a multiple of %d ranks x 4 bytes (the size column shows what ran)\n",
                    a.op.c_str(), ranks);
      if (hosts)
        std::printf("# hosts: %d of %d ranks; xhost: bytes one operation sent to other hosts (most of any rank, "
                    "mean over ranks)\n", c.num_hosts(), c.ranks_per_host());
      std::printf("%10s %11s %7s %11s %11s %11s %6s %12s %7s", "size", "count", "algo", "time(us)", "algbw(GB/s)",
                  "busbw(GB/s)", "check", mpi ? "native(GB/s)" : "memcpy(GB/s)", "ratio");
      if (!mpi) std::printf(" %14s %7s", "copy2/2(GB/s)", "limit");
      if (hosts) std::printf(" %12s %12s", "xhost(max)", "xhost(mean)");
      std::printf("\n");
    }
    for (std::size_t bytes : sizes) {
      OpRun run{a.op, *algo, a.chunk, 0, {}, {}, 1.0};
      run.setup(p, bytes);
      const std::size_t sz = run.count * sizeof(float);
      const bool ok = run.check(c);
      const auto [xmax, xmean] = hosts ? run.cross_host_bytes(c) : std::pair<double, double>{0, 0};
      const int iters = a.iters ? a.iters : iters_for(sz);
      const int warmup = a.iters ? a.warmup : std::max(a.warmup, iters / 10);
      const double t = run.time(c, warmup, iters, a.reps);
      const double algbw = sz / t / 1e9, busbw = algbw * run.bus_factor;
      double peer = 0;
      if (peer_native) {
        OpRun nat{a.op, mc::Algorithm::native, 0, 0, {}, {}, 1.0};
        nat.setup(p, bytes);
        peer = sz / nat.time(c, warmup, iters, a.reps) / 1e9 * nat.bus_factor;
      }
      double limit = 0;
      if (!mpi) {
        if (lead) peer = sz / memcpy_seconds(sz, std::max(3, iters)) / 1e9;
        c.barrier();
        limit = copy2_half_rate(c, sz, std::max(3, iters));
      }
      all_ok = all_ok && ok;
      std::string used = a.op == "sendrecv" ? "p2p" : mc::to_string(*algo);
      for (auto& [name, kind] : kinds) {
        if (a.op != name || *algo != mc::Algorithm::automatic) continue;
        mc::Algorithm chosen = kind == mc::OpKind::all_reduce && hosts ? mc::choose_all_reduce(sz, c.host_layout(), c.backend())
                                                                       : mc::choose_algorithm(kind, sz, p, c.backend());
        if (const std::size_t lim = c.shared_memory_limit())  // as the communicator does
          chosen = mc::prefer_shared_memory(kind, chosen, p, sz, lim);
        used = std::string("auto:") + mc::to_string(chosen);
      }
      if (lead) {
        std::printf("%10s %11zu %7s %11.2f %11.3f %11.3f %6s %12.3f %7.2f", human(sz).c_str(), run.count,
                    used.c_str(), t * 1e6, algbw, busbw, ok ? "ok" : "WRONG", peer, peer > 0 ? busbw / peer : 0.0);
        if (!mpi) std::printf(" %14.3f %7.2f", limit, limit > 0 ? busbw / limit : 0.0);
        if (hosts) std::printf(" %12.0f %12.0f", xmax, xmean);
        std::printf("\n");
      }
      std::fflush(stdout);
    }
  }, topts);
  if (!all_ok) throw std::runtime_error("bench comm: some results were wrong (see the check column)");
}
}  // namespace

void add_bench_comm_command(CLI::App& bench) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench.add_subcommand("comm", "Collective bandwidth and latency (nccl-tests conventions)");
  cmd->add_option("--backend", args->backend, "threads or mpi (default: mpi under mpirun, else threads)")
      ->check(CLI::IsMember({"threads", "mpi"}));
  cmd->add_option("--op", args->op, "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all or sendrecv")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "sendrecv"}));
  cmd->add_option("--world", args->world, "ranks (threads backend; default 2; under mpirun: the mpirun size)")
      ->check(integer<int>(1));
  cmd->add_option("--sizes", args->sizes,
                  "bytes, whole multiples of 4 (K, M, G suffixes): a range LO:HI doubling (4K:256M), or a list (4K,64M)");
  cmd->add_option("--algo", args->algo,
                  "auto, ring, rhd, tree, direct, hier (all_reduce over two or more hosts), shm (all_reduce, ranks on "
                  "one host) or native (mpi)")
      ->check(CLI::IsMember({"auto", "ring", "rhd", "tree", "direct", "hier", "shm", "native"}));
  CLI::Option* rph = cmd->add_option("--ranks-per-host", args->ranks_per_host,
                  "ranks per host: ranks [0,K) are host 0, [K,2K) host 1, ... (threads: emulated hosts; mpi: "
                  "overrides mpirun's hosts); adds the bytes sent across hosts to the table");
  cmd->add_option("--iters", args->iters, "timed iterations per size (default: 256 MiB worth, 20 to 10000)")
      ->check(integer<int>(1));
  cmd->add_option("--warmup", args->warmup, "untimed iterations per size")->check(integer<int>(0));
  cmd->add_option("--reps", args->reps, "repetitions of the timed loop; the best is reported")->check(integer<int>(1));
  cmd->add_option("--chunk", args->chunk, "pipelining segment in bytes (0: the backend default)")->check(integer<std::size_t>());
  cmd->add_option("--timeout", args->timeout_s, "per-operation deadline in seconds");
  cmd->callback([args, rph] {
    args->ranks_per_host_given = rph->count() > 0;
    // The flags alone (run_bench checks the rest): --world (at least 1 when given) is capped
    // like train's ranks (train/validate.h).
    try {
      if (args->world > 0) meshtrain::train::check_ranks("--world", args->world, 0, meshtrain::train::Machine::probe());
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (!(args->timeout_s > 0) || !std::isfinite(args->timeout_s))
      throw UsageError("--timeout must be a finite number of seconds above 0");
    run_bench(*args);
  });
}

}  // namespace meshtrain::cli
