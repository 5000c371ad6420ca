// `calibrate`: measures this machine into a MachineProfile (plan/machine.h).
//
// Every figure is the median of several timed repetitions (detail::median_seconds: the cost
// model predicts a run's median step), each repetition at least a few milliseconds long; the
// links keep the best of their repetitions' means. The work is a list of named tasks, so the
// progress callback knows the total before the first one runs:
//   kernels   GEMMs, element-wise kernels and attention (plan/calibrate_kernels.h) and the
//             layers of convolutional networks (plan/calibrate_cnn.h), each row in three rounds
//             (CalibrateOptions::rounds) over the whole list of both, keeping the median of its
//             rounds' (quick mode: one round);
//   cores     ranks sharing cores (their efficiency, a pipeline hand-over) and the call overhead;
//   links     all_reduce and sendrecv (to the next rank) over the threads backend at world 2,
//             and over MPI when launched by mpirun, at a few sizes, fitted to alpha + beta n.
// Limits: one host; the threads link is measured at world 2 only; an MPI link is classed as
// shared memory when every rank runs on one host name, else TCP (other fabrics are not told apart).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/comm/world.h"
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/plan/calibrate_cnn.h"
#include "meshtrain/plan/calibrate_kernels.h"
#include "meshtrain/plan/machine.h"

#ifndef MESHTRAIN_GIT_COMMIT
#define MESHTRAIN_GIT_COMMIT "unknown"
#endif

namespace meshtrain::plan {

namespace {
namespace mc = meshtrain::comm;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
using detail::fmt;
using detail::median_seconds_of;

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon == std::string::npos) break;
      auto v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      if (!v.empty()) return v;
    }
  return "unknown";
}

// The last-level cache as one core sees it, measured where sysfs does not say (a VM that shows
// no cache directories): one thread reads arrays of 1, 2, 4, ... 256 MiB and the cache is the
// largest that still reads at least 1.5x as fast as memory (the faster of 128 and 256 MiB). On
// the VMs that show none the rate falls gradually past 8 MiB (a 2-core AMD EPYC: 65 GB/s at
// 8 MiB, 39 at 16, 30 at 32, 25 at 64, 20-22 from memory), so this gives 16 MiB there, where a
// machine whose sysfs says 32 MiB measures alike; the cost model uses half of it per rank. 0 when
// no size reads faster than memory.
int64_t measured_llc_bytes() {
  constexpr int64_t kMiB = int64_t{1} << 20;
  std::vector<std::pair<int64_t, double>> rate;  // bytes, GB/s (best of 3 timed passes)
  volatile float sink = 0;
  for (int64_t bytes = kMiB; bytes <= 256 * kMiB; bytes *= 2) {
    std::vector<float> a(static_cast<size_t>(bytes / 4), 1.0f);
    const int passes = static_cast<int>(std::max<int64_t>(2, 256 * kMiB / bytes));
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < passes; ++k) {
        float acc[16] = {};
        for (size_t i = 0; i + 16 <= a.size(); i += 16)
          for (int j = 0; j < 16; ++j) acc[j] += a[i + static_cast<size_t>(j)];
        sink = sink + acc[0] + acc[15];
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(bytes) * passes / s / 1e9);
    }
    rate.emplace_back(bytes, best);
  }
  const double memory = std::max(rate[rate.size() - 1].second, rate[rate.size() - 2].second);
  int64_t llc = 0;
  for (const auto& [bytes, gbs] : rate)
    if (gbs >= 1.5 * memory) llc = bytes;
  return llc;
}

// The memory this machine's processes may use: MemTotal, lowered by a cgroup memory limit
// (cgroup v2's memory.max, v1's limit_in_bytes; "max" and v1's huge "no limit" are none).
// Not MemAvailable: the file describes the machine, not the load on it when measured. 0: unknown.
int64_t memory_bytes() {
  int64_t total = 0;
  {
    std::ifstream f("/proc/meminfo");
    std::string key, rest;
    long long kib = 0;
    while (f >> key >> kib) {
      std::getline(f, rest);
      if (key == "MemTotal:") {
        total = static_cast<int64_t>(kib) * 1024;
        break;
      }
    }
  }
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    unsigned long long limit = 0;
    if (f >> limit && limit > 0 && limit < (1ull << 60) && (total == 0 || static_cast<int64_t>(limit) < total))
      total = static_cast<int64_t>(limit);
  }
  return total;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "unknown";
  return buf;
}

std::string human_bytes(int64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}

// ---- call overhead ----
// A layer call's fixed cost: a linear layer of 8 x 8 on one row, forward and backward through
// a Context (what every layer pays beyond its arithmetic: the output tensor, saving and taking
// back its input, three kernel calls), per kernel call, on `threads` threads.
double measure_call_overhead(int threads, bool quick) {
  nn::Linear lin("calibrate", 8, 8);
  Tensor x = Tensor::zeros({1, 8}), dy = Tensor::zeros({1, 8});
  const int inner = 200;
  const double t = median_seconds_of(
      [&] {
        for (int i = 0; i < inner; ++i) {
          nn::Context ctx(threads);
          lin.forward(ctx, x);
          lin.backward(ctx, dy);
        }
      },
      quick ? 3 : 5, quick ? 0.02 : 0.1) / inner;
  return std::max(1e-9, t / 3);
}

// ---- ranks sharing cores ----
// Ranks run as threads of one process: when they outnumber the cores they take turns, and a
// rank that waits in a collective holds its core for a while before it sleeps. Measured as a
// training step does it: each rank computes (GEMMs of 256 x 256 x 256, one thread) and then
// all-reduces a small vector, `iters` times; `cores` ranks, then 2 x cores ranks doing the
// same work each. The efficiency is (2 x the first time) / the second (1: perfect turns).
double measure_shared_core_efficiency(int cores, bool quick) {
  const int64_t n = 256;
  const int iters = quick ? 20 : 60, products = 4;
  auto run = [&](int ranks) {
    double seconds = 0;
    mc::ThreadsOptions one_thread;
    one_thread.threads_per_rank = 1;  // bound to the cores as a training run's ranks are
    mc::run_world(mc::Backend::threads, ranks, [&](mc::Communicator& c) {
      std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), out(n * n);
      std::vector<float> v(256, 1.f);
      const kernels::GemmOptions opt(1, kernels::Precision::f32);
      c.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        for (int k = 0; k < products; ++k)
          kernels::gemm(kernels::Trans::N, kernels::Trans::N, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, out.data(), n, opt);
        c.all_reduce(v);
      }
      c.barrier();
      if (c.rank() == 0) seconds = since(t0);
    }, one_thread);
    return seconds;
  };
  run(cores);  // warm-up
  double best = 0;
  for (int rep = 0; rep < (quick ? 2 : 3); ++rep) {
    const double one = run(cores), two = run(2 * cores);
    if (two > 0) best = std::max(best, std::min(1.0, 2 * one / two));
  }
  return std::max(0.05, best);
}

// A pipeline's hand-over when ranks outnumber the cores: `cores` ranks compute without a pause
// (GEMMs of 256 x 256 x 256) while `cores` others pass a token round a ring, each computing a
// little (a GEMM of 128 x 128 x 128) when it holds it and sleeping in its receive otherwise. The
// time of a hop beyond that compute is what a woken rank waits for a core the busy ranks hold.
double measure_oversubscribed_handoff(int cores, bool quick) {
  const int ring = std::max(2, cores), rounds = quick ? 10 : 30;
  std::atomic<bool> done{false};
  double per_hop = 0, compute = 0;
  mc::ThreadsOptions one_thread;
  one_thread.threads_per_rank = 1;  // bound to the cores as a training run's ranks are
  mc::run_world(mc::Backend::threads, cores + ring, [&](mc::Communicator& c) {
    const int64_t n = c.rank() < cores ? 256 : 128;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), out(n * n), token(16, 1.f);
    const kernels::GemmOptions opt(1, kernels::Precision::f32);
    auto work = [&] {
      kernels::gemm(kernels::Trans::N, kernels::Trans::N, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, out.data(), n, opt);
    };
    c.barrier();
    if (c.rank() < cores) {  // busy
      while (!done.load()) work();
    } else {
      const int r = c.rank() - cores, next = cores + (r + 1) % ring, prev = cores + (r + ring - 1) % ring;
      const auto t0 = Clock::now();
      for (int i = 0; i < rounds; ++i) {
        if (r != 0 || i > 0) c.recv(token, prev);
        work();
        c.send(token, next);
      }
      if (r == 0) {
        c.recv(token, prev);
        per_hop = since(t0) / (static_cast<double>(rounds) * ring);
        done.store(true);
      }
    }
    c.barrier();
    if (c.rank() == cores) compute = median_seconds_of(work, 20, 0.01);
  }, one_thread);
  return std::max(1e-7, per_hop - compute);
}

// ---- links ----
// Through the smallest and the largest point; alpha and beta kept above 0 (noise can tilt a
// two-point line): a non-positive slope falls back to the largest point's seconds per byte, a
// non-positive intercept to the smallest point's time.
void fit(LinkFit& f) {
  const auto& lo = f.points.front();
  const auto& hi = f.points.back();
  f.beta_s_per_byte = (hi.seconds - lo.seconds) / static_cast<double>(hi.bytes - lo.bytes);
  if (!(f.beta_s_per_byte > 0)) f.beta_s_per_byte = hi.seconds / static_cast<double>(hi.bytes);
  f.alpha_s = lo.seconds - f.beta_s_per_byte * static_cast<double>(lo.bytes);
  if (!(f.alpha_s > 0)) f.alpha_s = lo.seconds;
  f.max_fit_error = 0;
  for (const auto& p : f.points)
    f.max_fit_error = std::max(f.max_fit_error, std::abs(f.predict_s(static_cast<double>(p.bytes)) - p.seconds) / p.seconds);
}

// The slowest rank's mean seconds of `op` over `iters`, best of `reps` (as bench comm times).
double time_op(mc::Communicator& c, const std::function<void()>& op, int iters, int reps) {
  op();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    c.barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) op();
    std::vector<double> t{since(t0) / iters};
    c.all_reduce(t, {.op = mc::ReduceOp::max});
    best = std::min(best, t[0]);
  }
  return best;
}

// all_reduce and sendrecv on `c` at `sizes`; every rank returns the same fits.
std::vector<LinkFit> measure_links(mc::Communicator& c, const std::string& link, const std::vector<int64_t>& sizes,
                                   bool quick) {
  std::vector<LinkFit> fits;
  const int p = c.size(), r = c.rank();
  for (const char* op : {"all_reduce", "sendrecv"}) {
    LinkFit f{link, op, p, 0, 0, 0, {}};
    for (int64_t bytes : sizes) {
      const std::size_t n = static_cast<std::size_t>(bytes) / sizeof(float);
      std::vector<float> in(n, 1.f), out(n, 0.f);
      const int iters = static_cast<int>(std::clamp<int64_t>((quick ? (8 << 20) : (64 << 20)) / bytes, 3, 200));
      const double t = time_op(
          c,
          [&] {
            if (f.op == "all_reduce") {
              c.all_reduce(out);
            } else {
              mc::Work s = c.isend(in, (r + 1) % p);
              c.recv(out, (r + p - 1) % p);
              s.wait();
            }
          },
          iters, quick ? 3 : 5);
      f.points.push_back({bytes, t});
    }
    fit(f);
    fits.push_back(f);
  }
  return fits;
}

std::string link_line(const LinkFit& f) {
  return "link " + f.link + " " + f.op + " world " + std::to_string(f.world) + ": alpha " +
         fmt("%.2f", f.alpha_s * 1e6) + " us, 1/beta " + fmt("%.2f", 1e-9 / f.beta_s_per_byte) + " GB/s";
}

// A 64-bit hash of this host's name, for telling whether MPI ranks share a host.
int64_t host_hash() {
  const std::string h = host_name();
  uint64_t x = 1469598103934665603ull;
  for (unsigned char ch : h) x = (x ^ ch) * 1099511628211ull;
  return static_cast<int64_t>(x >> 2);
}

std::vector<int> thread_counts(int most, bool quick) {
  std::vector<int> t{1};
  if (!quick)
    for (int k = 2; k < most; k *= 2) t.push_back(k);
  if (most > 1) t.push_back(most);
  return t;
}

}  // namespace

int usable_cores() {
  const size_t n = mc::allowed_cpus().size();  // the mask the threads backend binds ranks within
  return n > 0 ? static_cast<int>(n) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

MachineProfile calibrate(const CalibrateOptions& o, const CalibrateProgress& progress) {
  const auto start = Clock::now();
  const int cores = usable_cores();
  if (o.threads < 0) throw std::invalid_argument("--threads must be at least 1 (or 0 for every core)");
  if (o.rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  if (o.threads > cores)
    throw std::invalid_argument("--threads " + std::to_string(o.threads) + " is more than the " + std::to_string(cores) +
                                " cores this process may use; give at most " + std::to_string(cores));
  const int most = o.threads ? o.threads : cores;

  MachineProfile p;
  p.mode = o.quick ? "quick" : "full";
  p.date = utc_now();
  p.meshtrain_commit = MESHTRAIN_GIT_COMMIT;
  p.host = host_name();
  p.cpu_model = cpu_model();
  p.cores = cores;
  p.llc_bytes = detail::llc_bytes();
  if (p.llc_bytes == 0) p.llc_bytes = measured_llc_bytes();
  p.memory_bytes = memory_bytes();
  p.gemm_backend = kernels::gemm_backend();
  p.bf16_isa = kernels::bf16_isa();
  const bool bf16 = p.bf16_isa != "emulated";

  // ---- the task list ----
  std::vector<std::function<std::string()>> tasks;
  const bool under_mpi = o.mpi && mc::have_mpi() && mc::launched_by_mpirun();
  bool lead = true;
  std::shared_ptr<mc::Communicator> world;
  if (under_mpi) {
    world = mc::mpi_world();
    lead = world->rank() == 0;
    tasks.push_back([&, world] {
      std::vector<int64_t> lo{host_hash()}, hi{host_hash()};
      world->all_reduce(lo, {.op = mc::ReduceOp::min});
      world->all_reduce(hi, {.op = mc::ReduceOp::max});
      const std::string link = lo[0] == hi[0] ? "mpi_shared_memory" : "mpi_tcp";
      const std::vector<int64_t> sizes = o.quick ? std::vector<int64_t>{8, 64 << 10, 4 << 20}
                                                 : std::vector<int64_t>{8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
      auto fits = measure_links(*world, link, sizes, o.quick);
      p.links.insert(p.links.end(), fits.begin(), fits.end());
      p.not_measured.push_back({link == "mpi_tcp" ? "mpi_shared_memory" : "mpi_tcp",
                                "the mpirun ranks ran " + std::string(link == "mpi_tcp" ? "on several hosts" : "on one host") +
                                    "; start them " + (link == "mpi_tcp" ? "on one host" : "on two hosts (mpirun --host a,b)") +
                                    " to measure it"});
      return link_line(fits[0]) + "; " + link_line(fits[1]);
    });
  } else {
    const std::string why = mc::have_mpi() ? "not launched by mpirun; run mpirun -np 2 meshtrain calibrate to measure it"
                                           : "this meshtrain was built without MPI";
    p.not_measured.push_back({"mpi_shared_memory", why});
    p.not_measured.push_back({"mpi_tcp", mc::have_mpi() ? "not launched by mpirun; run mpirun -np 2 --host a,b "
                                                          "meshtrain calibrate across two hosts to measure it"
                                                        : why});
  }
  if (!bf16)
    p.not_measured.push_back({"bf16 GEMM", "not measured: no bf16 products on this CPU (" + kernels::bf16_fallback_note() + ")"});

  if (lead) {
    const auto threads = thread_counts(most, o.quick);
    // GEMMs, element-wise kernels and attention (plan/calibrate_kernels.h) and convolutional
    // networks' layers as they run (plan/calibrate_cnn.h), their rounds interleaved.
    const int rounds = o.quick ? 1 : o.rounds;
    detail::RoundTasks rounded;
    detail::add_kernel_tasks(p, threads, o.quick, bf16, rounded, rounds);
    detail::add_cnn_tasks(p, threads, o.quick, rounded, rounds);
    for (auto& t : rounded.in_order()) tasks.push_back(std::move(t));
    tasks.push_back([&p, cores, q = o.quick] {
      p.shared_core_efficiency = measure_shared_core_efficiency(cores, q);
      p.oversubscribed_handoff_s = measure_oversubscribed_handoff(cores, q);
      return "ranks sharing cores (2 per core): " + fmt("%.0f", 100 * p.shared_core_efficiency) +
             "% efficient, a pipeline hand-over " + fmt("%.1f", 1e6 * p.oversubscribed_handoff_s) + " us";
    });
    tasks.push_back([&p, q = o.quick] {
      p.call_overhead_s = measure_call_overhead(1, q);
      return "kernel call overhead: " + fmt("%.2f", p.call_overhead_s * 1e6) + " us";
    });
    tasks.push_back([&p, q = o.quick] {
      const std::vector<int64_t> sizes = q ? std::vector<int64_t>{8, 64 << 10, 4 << 20}
                                           : std::vector<int64_t>{8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
      std::vector<LinkFit> fits;
      mc::run_world(mc::Backend::threads, 2, [&](mc::Communicator& c) {
        auto f = measure_links(c, "threads", sizes, q);
        if (c.rank() == 0) fits = f;
      });
      p.links.insert(p.links.end(), fits.begin(), fits.end());
      return link_line(fits[0]) + "; " + link_line(fits[1]);
    });
  }

  // ---- run them ----
  const int total = static_cast<int>(tasks.size());
  for (int i = 0; i < total; ++i) {
    const std::string line = tasks[i]();
    if (progress) progress(i + 1, total, line);
  }
  // Under mpirun the other ranks sleep (polling every 20 ms) until rank 0 has measured the
  // rest: ending at once would leave them spinning in MPI's finalisation on the cores rank 0
  // is measuring.
  if (world && world->size() > 1) {
    std::vector<float> flag{1.f};
    if (lead) {
      for (int r = 1; r < world->size(); ++r) world->send(flag, r);
    } else {
      mc::Work w = world->irecv(flag, 0);
      while (!w.is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      w.wait();
    }
  }
  p.calibrate_seconds = std::max(since(start), 1e-9);
  return p;
}

// ---- the summary ----
std::string summary_table(const MachineProfile& p) {
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf, "machine: %s, %d cores, %.1f GiB, gemm %s, bf16 %s (%s mode, %.1f s)\n",
                p.cpu_model.c_str(), p.cores, static_cast<double>(p.memory_bytes) / (1 << 30), p.gemm_backend.c_str(),
                p.bf16_isa.c_str(), p.mode.c_str(), p.calibrate_seconds);
  s += buf;
  std::snprintf(buf, sizeof buf, "%-16s %-8s %7s %10s\n", "gemm shape", "dtype", "threads", "GFLOP/s");
  s += buf;
  for (const auto& g : p.gemm) {
    std::snprintf(buf, sizeof buf, "%-16s %-8s %7d %10.1f\n", g.shape.c_str(), g.precision.c_str(), g.threads, g.gflops);
    s += buf;
  }
  for (const auto& e : p.elementwise) {
    std::snprintf(buf, sizeof buf, "add (%lld floats)  threads %d: %.2f GB/s\n", static_cast<long long>(e.elements),
                  e.threads, e.bytes_per_s / 1e9);
    s += buf;
  }
  for (const auto& a : p.attention) {
    std::snprintf(buf, sizeof buf, "attention fwd+bwd (B %lld, T %lld, C %lld, %lld heads) threads %d: %.1f GFLOP/s\n",
                  static_cast<long long>(a.b), static_cast<long long>(a.t), static_cast<long long>(a.c),
                  static_cast<long long>(a.nh), a.threads, a.gflops);
    s += buf;
  }
  for (const auto& c : p.conv) {
    std::snprintf(buf, sizeof buf, "conv %-7s %3lld->%-3lld k%lld s%lld at %lld threads %d: %.1f / %.1f / %.1f GFLOP/s "
                  "(forward / data / weights)\n", c.format.c_str(), static_cast<long long>(c.ic), static_cast<long long>(c.oc),
                  static_cast<long long>(c.k), static_cast<long long>(c.stride), static_cast<long long>(c.h), c.threads,
                  c.fwd_gflops, c.bwd_data_gflops, c.bwd_weights_gflops);
    s += buf;
  }
  for (const auto& l : p.cnn_layers) {
    std::snprintf(buf, sizeof buf, "%-14s %-7s %8lld floats threads %d: %.1f / %.1f us (forward / backward)\n",
                  l.op.c_str(), l.format.c_str(), static_cast<long long>(l.elements), l.threads, l.fwd_s * 1e6, l.bwd_s * 1e6);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "%-18s %-10s %5s %10s %10s %8s  points (bytes: us)\n", "link", "op", "world", "alpha(us)",
                "1/beta GB/s", "fit err");
  s += buf;
  for (const auto& l : p.links) {
    std::snprintf(buf, sizeof buf, "%-18s %-10s %5d %10.2f %10.2f %7.0f%% ", l.link.c_str(), l.op.c_str(), l.world,
                  l.alpha_s * 1e6, 1e-9 / l.beta_s_per_byte, l.max_fit_error * 100);
    s += buf;
    for (const auto& pt : l.points) {
      std::snprintf(buf, sizeof buf, " %s:%.1f", human_bytes(pt.bytes).c_str(), pt.seconds * 1e6);
      s += buf;
    }
    s += "\n";
  }
  for (const auto& n : p.not_measured) s += "not measured: " + n.what + ": " + n.reason + "\n";
  return s;
}

std::string default_machine_path() {
  if (const char* f = std::getenv("MESHTRAIN_MACHINE_FILE"); f && *f) return f;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/meshtrain/machine.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/meshtrain/machine.json";
  // No home (a service, a bare container): the temporary directory, one file per user.
  std::error_code ec;
  const auto tmp = std::filesystem::temp_directory_path(ec);
  if (ec) return "";
  return (tmp / ("meshtrain-" + std::to_string(getuid())) / "machine.json").string();
}

std::optional<MachineProfile> machine_for_run(const std::string& path, bool may_calibrate, std::string* source,
                                              const std::function<bool(const std::string&)>& quick_calibration) {
  if (!path.empty()) {
    if (source) *source = "machine file " + path;
    return read_machine_file(path);
  }
  const std::string cached = default_machine_path();
  std::error_code ec;
  if (!cached.empty() && std::filesystem::is_regular_file(cached, ec)) {
    try {
      MachineProfile m = read_machine_file(cached);
      if (m.host == host_name() && m.cpu_model == cpu_model() && m.cores == usable_cores()) {
        if (source) *source = "machine file " + cached + " (" + m.mode + ", " + m.date + ")";
        return m;
      }
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "note: %s; measuring this machine again\n", e.what());
    }
  }
  if (!may_calibrate) return std::nullopt;
  std::fprintf(stderr, "note: measuring this machine for the cost model (meshtrain calibrate --quick, a few seconds)%s\n",
               cached.empty() ? "" : ("; kept in " + cached + " for the next runs").c_str());
  {  // other work on the cores lowers every rate measured now, and the file is kept
    std::ifstream avg("/proc/loadavg");
    double load = 0;
    if (avg >> load && load > 0.5 * usable_cores())
      std::fprintf(stderr, "note: the machine is busy (load average %.1f on %d cores): the rates measured now will be "
                           "low; measure again on a quiet machine (meshtrain calibrate --out %s --overwrite)\n",
                   load, usable_cores(), cached.empty() ? "machine.json" : cached.c_str());
  }
  std::error_code dir_ec;
  if (!cached.empty()) std::filesystem::create_directories(std::filesystem::path(cached).parent_path(), dir_ec);
  if (quick_calibration && !cached.empty() && quick_calibration(cached)) {
    try {
      MachineProfile m = read_machine_file(cached);
      if (source) *source = "quick calibration kept in " + cached;
      return m;
    } catch (const std::invalid_argument&) {  // measure here instead
    }
  }
  CalibrateOptions o;
  o.quick = true, o.mpi = false;
  MachineProfile m = calibrate(o);
  if (source) *source = "quick calibration" + (cached.empty() ? std::string() : " kept in " + cached);
  if (!cached.empty()) {
    try {
      write_machine_file(m, cached);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "note: could not keep the machine file (%s); the next run measures again\n", e.what());
    }
  }
  return m;
}

}  // namespace meshtrain::plan
