// `calibrate`: measures this machine into a MachineProfile (plan/machine.h).
//
// Every figure is the median of several timed repetitions (detail::median_seconds: the cost
// model predicts a run's median step), each repetition at least a few milliseconds long; the
// kernels' and the CNN rows are measured in three rounds over their lists and keep the median
// of their rounds' (detail::add_round_tasks; quick mode: one round); the links keep the best of
// their repetitions' means. The work is a list of named
// tasks, so the progress callback knows the total before the first one runs:
//   GEMM      kernels::gemm at a few shape classes x thread counts x float32 (and bf16 where
//             kernels::bf16_isa() is not "emulated"); bf16 times include converting A and B;
//   add       c = a + b over arrays far larger than the caches, OpenMP over `threads`;
//   attention kernels/attention.h forward + backward at a GPT-2-small-like shape;
//   links     all_reduce and sendrecv (to the next rank) over the threads backend at world 2,
//             and over MPI when launched by mpirun, at a few sizes, fitted to alpha + beta n.
// Limits: one host; the threads link is measured at world 2 only; an MPI link is classed as
// shared memory when every rank runs on one host name, else TCP (other fabrics are not told apart).
#include <sched.h>
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

#include "meshtrain/comm/world.h"
#include "meshtrain/kernels/adamw.h"
#include "meshtrain/kernels/attention.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/kernels/gelu.h"
#include "meshtrain/kernels/layernorm.h"
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/plan/calibrate_cnn.h"
#include "meshtrain/plan/machine.h"

#ifndef MESHTRAIN_GIT_COMMIT
#define MESHTRAIN_GIT_COMMIT "unknown"
#endif

namespace meshtrain::plan {

namespace {
namespace mc = meshtrain::comm;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The median time of one run of `fn` (detail::median_seconds): one warm-up run, then at least
// `reps` runs and at least `min_total` seconds of them.
double median_seconds_of(const std::function<void()>& fn, int reps, double min_total) {
  fn();
  std::vector<double> t;
  const auto start = Clock::now();
  for (int i = 0; i < reps || since(start) < min_total; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(since(t0));
    if (i > 10000) break;  // a run too fast to time: enough samples
  }
  return detail::median_seconds(std::move(t));
}

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

// The largest cache level's size of cpu0 (sysfs "32768K"), 0 when unknown.
int64_t llc_bytes() {
  int64_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lf(dir + "level"), sf(dir + "size"), tf(dir + "type");
    int level = 0;
    std::string size, type;
    if (!(lf >> level) || !(sf >> size)) continue;
    tf >> type;
    if (type == "Instruction" || size.empty()) continue;
    int64_t n = 0;
    try {
      n = std::stoll(size);
    } catch (const std::exception&) {
      continue;
    }
    const char unit = size.back();
    if (unit == 'K') n <<= 10;
    else if (unit == 'M') n <<= 20;
    if (level > best_level) best_level = level, best = n;
  }
  return best;
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

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

std::string human_bytes(int64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}

// The large arrays the kernels' rows measure on, kept for one calibration: without them every
// round of every row would allocate and first-touch up to 384 MiB again (0.8-1.5 s a row on the
// 2-core VM, more than the measurement). Array `slot` holds at least `n` floats, each `value`.
class Arrays {
 public:
  float* get(size_t slot, int64_t n, float value) {
    if (slots_.size() <= slot) slots_.resize(slot + 1);
    std::vector<float>& v = slots_[slot];
    if (v.size() < static_cast<size_t>(n)) v.assign(static_cast<size_t>(n), value);
    else std::fill_n(v.begin(), n, value);
    return v.data();
  }

 private:
  std::vector<std::vector<float>> slots_;
};

// ---- GEMM ----
struct Shape {
  const char* name;
  int64_t m, n, k;
};

// `cold`: the operands rotate through copies filling twice the last-level cache (at least
// 64 MiB), so each product reads them from memory, as a layer of a model whose activations do
// not fit in the caches does; the time is the mean over one pass of the copies.
// `rounds`: the row is measured that many times (detail::add_round_tasks), each with its share of
// the time one measurement took.
GemmRate measure_gemm(const Shape& s, kernels::Precision prec, int threads, bool quick, bool cold, int rounds, Arrays& arrays) {
  const kernels::GemmOptions opt(threads, prec);
  const int64_t per = s.m * s.k + s.k * s.n + s.m * s.n;
  const int64_t span = std::max<int64_t>(int64_t{64} << 20, 2 * llc_bytes());
  const int64_t copies = cold ? std::max<int64_t>(2, span / (4 * per)) : 1;
  float* buf = arrays.get(0, per * copies, 0.25f);
  int64_t next = 0;
  auto product = [&] {
    float* a = buf + (next++ % copies) * per;
    float* b = a + s.m * s.k;
    float* c = b + s.k * s.n;
    kernels::gemm(kernels::Trans::N, kernels::Trans::N, s.m, s.n, s.k, 1.f, a, s.k, b, s.n, 0.f, c, s.n, opt);
  };
  double t = 0;
  if (cold) {
    for (int64_t i = 0; i < copies; ++i) product();  // one pass before timing: the copies rotate from memory
    const int passes = quick ? 1 : std::max(1, 2 / rounds);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < passes * copies; ++i) product();
    t = since(t0) / static_cast<double>(passes * copies);
  } else {
    t = median_seconds_of(product, quick ? 3 : std::max(2, 5 / rounds), (quick ? 0.05 : 0.3) / rounds);
  }
  GemmRate r{s.name, s.m, s.n, s.k, prec == kernels::Precision::bf16 ? "bf16" : "float32", threads,
             2.0 * static_cast<double>(s.m * s.n * s.k) / t / 1e9};
  r.cold = cold;
  return r;
}

// ---- element-wise ----
ElementwiseRate measure_add(int64_t n, int threads, bool quick, int rounds, Arrays& arrays) {
  const float* pa = arrays.get(0, n, 1.f);
  const float* pb = arrays.get(1, n, 2.f);
  float* pc = arrays.get(2, n, 0.f);
  const double t = median_seconds_of(
      [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t i = 0; i < n; ++i) pc[i] = pa[i] + pb[i];
      },
      quick ? 3 : std::max(2, 5 / rounds), (quick ? 0.05 : 0.3) / rounds);
  return {"add", n, threads, 12.0 * static_cast<double>(n) / t};
}

// The layers' own memory-bound kernels on n elements (1 Mi: 4 MiB, a small model's
// activations, in the caches; 8 Mi: 32 MiB an array, from memory), with the bytes the cost
// model counts for them (model/cost.h):
// layernorm forward + backward 6 x 4 bytes an element, GELU forward + backward 5 x 4, AdamW
// 7 x 4 (the parameter, gradient and two moments read; parameter and moments written), add 12.
ElementwiseRate measure_kernel(const std::string& op, int64_t n, int threads, bool quick, int rounds, Arrays& arrays) {
  const int64_t C = 512, N = n / C;
  float *x = arrays.get(0, n, 0.3f), *y = arrays.get(1, n, 0.f), *dx = arrays.get(2, n, 0.f),
        *dy = arrays.get(3, n, 0.01f), *m = arrays.get(4, n, 0.f), *v = arrays.get(5, n, 0.f);
  std::vector<float> mean(N), rstd(N), w(C, 1.f), b(C), dw(C), db(C);
  double bytes = 0;
  std::function<void()> fn;
  if (op == "layernorm") {
    bytes = 6.0 * 4 * n;
    fn = [&] {
      kernels::layernorm_forward(y, mean.data(), rstd.data(), x, w.data(), b.data(), N, C, threads);
      kernels::layernorm_backward(dx, dw.data(), db.data(), dy, x, w.data(), mean.data(), rstd.data(),
                                  N, C, threads);
    };
  } else if (op == "gelu") {
    bytes = 5.0 * 4 * n;
    fn = [&] {
      kernels::gelu_forward(y, x, n, threads);
      kernels::gelu_backward(dx, x, dy, n, threads);
    };
  } else if (op == "adamw") {
    bytes = 7.0 * 4 * n;
    kernels::AdamWParams ap;
    fn = [&] { kernels::adamw_update(y, dy, m, v, n, ap, threads); };
  } else {
    bytes = 12.0 * n;
    fn = [&] { kernels::add(y, x, dy, n, threads); };
  }
  const double t = median_seconds_of(fn, quick ? 5 : std::max(3, 10 / rounds), (quick ? 0.05 : 0.15) / rounds);
  return {op, n, threads, bytes / t};
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
    });
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
  });
  return std::max(1e-7, per_hop - compute);
}

// ---- attention ----
AttentionRate measure_attention(int64_t B, int64_t T, int64_t C, int64_t NH, int threads, bool quick, int rounds) {
  std::vector<float> qkv(B * T * 3 * C), out(B * T * C), lse(B * NH * T), dout(B * T * C, 0.01f), dqkv(B * T * 3 * C);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.f - 0.5f;
  const double t = median_seconds_of(
      [&] {
        kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, threads);
        kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, threads);
      },
      quick ? 2 : std::max(2, 3 / rounds), (quick ? 0.05 : 0.3) / rounds);
  return {B, T, C, NH, threads, 6.0 * B * T * T * C / t / 1e9};
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
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

MachineProfile calibrate(const CalibrateOptions& o, const CalibrateProgress& progress) {
  const auto start = Clock::now();
  const int cores = usable_cores();
  if (o.threads < 0) throw std::invalid_argument("--threads must be at least 1 (or 0 for every core)");
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
  p.llc_bytes = llc_bytes();
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
    const std::vector<Shape> shapes =
        o.quick ? std::vector<Shape>{{"square_1024", 1024, 1024, 1024}, {"mlp_up_bt512", 512, 3072, 768},
                                     {"skinny_k128", 1024, 512, 128}, {"small_128", 128, 128, 128}}
                : std::vector<Shape>{{"square_1024", 1024, 1024, 1024}, {"square_2048", 2048, 2048, 2048},
                                     {"mlp_up_bt512", 512, 3072, 768},   {"mlp_up_bt4096", 4096, 3072, 768},
                                     {"mlp_down_bt4096", 4096, 768, 3072}, {"skinny_k128", 1024, 512, 128},
                                     {"small_128", 128, 128, 128}};
    const auto threads = thread_counts(most, o.quick);
    std::vector<kernels::Precision> precs{kernels::Precision::f32};
    if (bf16) precs.push_back(kernels::Precision::bf16);
    // The kernels' rows, measured in rounds as the CNN rows are (a moment in which a shared VM
    // runs one thread's core at a fraction of its speed does not become a row): GEMMs,
    // element-wise kernels, attention.
    struct Row {
      std::optional<GemmRate> gemm;
      std::optional<ElementwiseRate> elementwise;
      std::optional<AttentionRate> attention;
    };
    const int rounds = o.quick ? 1 : detail::kKernelRounds;
    const auto arrays = std::make_shared<Arrays>();
    std::vector<std::function<Row()>> rows;
    for (auto prec : precs)
      for (bool cold : {false, true}) {
        if (cold && prec == kernels::Precision::bf16) continue;  // the cost model scales bf16 by float32's ratio
        for (const auto& s : shapes)
          for (int t : threads)
            rows.push_back([s, prec, t, cold, q = o.quick, rounds, arrays] {
              return Row{measure_gemm(s, prec, t, q, cold, rounds, *arrays), {}, {}};
            });
      }
    // 3 arrays of 128 MiB, far beyond the caches in both modes (smaller arrays partly fit the L3).
    const int64_t elements = int64_t{32} << 20;
    for (int t : threads)
      rows.push_back([elements, t, q = o.quick, rounds, arrays] {
        return Row{{}, measure_add(elements, t, q, rounds, *arrays), {}};
      });
    for (const char* op : {"add", "layernorm", "gelu", "adamw"})
      for (int64_t n : {int64_t{1} << 20, int64_t{8} << 20}) {
        if (std::string(op) == "add" && n > (int64_t{1} << 20)) continue;  // the 32 Mi row above
        for (int t : threads)
          rows.push_back([op = std::string(op), n, t, q = o.quick, rounds, arrays] {
            return Row{{}, measure_kernel(op, n, t, q, rounds, *arrays), {}};
          });
      }
    // Head sizes 32 and 64 at short and long sequences (gpt-tiny's 64 x 32, gpt-small's 256 x
    // 64, GPT-2 small's 512 x 64): the kernel's rate depends on both.
    struct AttnShape {
      int64_t b, t, c, nh;
    };
    const std::vector<AttnShape> attn = o.quick ? std::vector<AttnShape>{{12, 64, 128, 4}, {4, 256, 384, 6}}
                                                : std::vector<AttnShape>{{12, 64, 128, 4}, {8, 256, 384, 6}, {2, 512, 768, 12}};
    for (const AttnShape& s : attn)
      for (int t : threads)
        rows.push_back([s, t, q = o.quick, rounds] {
          return Row{{}, {}, measure_attention(s.b, s.t, s.c, s.nh, t, q, rounds)};
        });
    const auto line = [](const Row& row) -> std::string {
      if (row.gemm) {
        const GemmRate& g = *row.gemm;
        return "gemm " + g.precision + " " + g.shape + " (" + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" +
               std::to_string(g.k) + ")" + (g.cold ? " from memory" : "") + " threads " + std::to_string(g.threads) + ": " +
               fmt("%.1f", g.gflops) + " GFLOP/s";
      }
      if (row.elementwise) {
        const ElementwiseRate& e = *row.elementwise;
        const std::string where = e.elements > (int64_t{8} << 20)   ? ""
                                  : e.elements > (int64_t{1} << 20) ? " (from memory)"
                                                                    : " (in cache)";
        return e.op + " " + std::to_string(e.elements) + " floats" + where + " threads " + std::to_string(e.threads) + ": " +
               fmt("%.2f", e.bytes_per_s / 1e9) + " GB/s";
      }
      const AttentionRate& a = *row.attention;
      return "attention fwd+bwd (" + std::to_string(a.b) + ", " + std::to_string(a.t) + ", " + std::to_string(a.c) + ", " +
             std::to_string(a.nh) + " heads) threads " + std::to_string(a.threads) + ": " + fmt("%.1f", a.gflops) + " GFLOP/s";
    };
    const auto keep = [&p, rounds](const std::vector<std::vector<Row>>& measured) {
      for (const std::vector<Row>& of : measured) {
        std::vector<GemmRate> g;
        std::vector<ElementwiseRate> e;
        std::vector<AttentionRate> a;
        for (const Row& r : of) {
          if (r.gemm) g.push_back(*r.gemm);
          if (r.elementwise) e.push_back(*r.elementwise);
          if (r.attention) a.push_back(*r.attention);
        }
        if (!g.empty()) p.gemm.push_back(detail::median_of_rounds(g, {&GemmRate::gflops}));
        if (!e.empty()) p.elementwise.push_back(detail::median_of_rounds(e, {&ElementwiseRate::bytes_per_s}));
        if (!a.empty()) p.attention.push_back(detail::median_of_rounds(a, {&AttentionRate::gflops}));
      }
      return "kernels: " + std::to_string(p.gemm.size()) + " GEMM, " + std::to_string(p.elementwise.size()) +
             " element-wise and " + std::to_string(p.attention.size()) + " attention rows, each the median of " +
             std::to_string(rounds) + " round(s)";
    };
    detail::add_round_tasks<Row>(std::move(rows), line, keep, tasks, rounds);
    // Convolutional networks' layers as they run (plan/calibrate_cnn.h).
    detail::add_cnn_tasks(p, threads, o.quick, tasks, o.quick ? 1 : detail::kCnnRounds);
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
