// calibrate's kernels' rows (plan/calibrate_kernels.h): GEMMs, element-wise kernels and
// attention, measured in rounds.
#include "meshtrain/plan/calibrate_kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/kernels/adamw.h"
#include "meshtrain/kernels/attention.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/kernels/gelu.h"
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/kernels/layernorm.h"
#include "meshtrain/plan/calibrate_cnn.h"

namespace meshtrain::plan::detail {

namespace {
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

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

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
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

namespace {

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

}  // namespace

void add_kernel_tasks(MachineProfile& p, const std::vector<int>& threads, bool quick, bool bf16, RoundTasks& tasks,
                      int rounds) {
  rounds = std::max(1, rounds);
  const std::vector<Shape> shapes =
      quick ? std::vector<Shape>{{"square_1024", 1024, 1024, 1024}, {"mlp_up_bt512", 512, 3072, 768},
                                   {"skinny_k128", 1024, 512, 128}, {"small_128", 128, 128, 128}}
              : std::vector<Shape>{{"square_1024", 1024, 1024, 1024}, {"square_2048", 2048, 2048, 2048},
                                   {"mlp_up_bt512", 512, 3072, 768},   {"mlp_up_bt4096", 4096, 3072, 768},
                                   {"mlp_down_bt4096", 4096, 768, 3072}, {"skinny_k128", 1024, 512, 128},
                                   {"small_128", 128, 128, 128}};
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
    const auto arrays = std::make_shared<Arrays>();
  std::vector<std::function<Row()>> rows;
  for (auto prec : precs)
    for (bool cold : {false, true}) {
      if (cold && prec == kernels::Precision::bf16) continue;  // the cost model scales bf16 by float32's ratio
      for (const auto& s : shapes)
        for (int t : threads)
          rows.push_back([s, prec, t, cold, q = quick, rounds, arrays] {
            return Row{measure_gemm(s, prec, t, q, cold, rounds, *arrays), {}, {}};
          });
    }
  // 3 arrays of 128 MiB, far beyond the caches in both modes (smaller arrays partly fit the L3).
  const int64_t elements = int64_t{32} << 20;
  for (int t : threads)
    rows.push_back([elements, t, q = quick, rounds, arrays] {
      return Row{{}, measure_add(elements, t, q, rounds, *arrays), {}};
    });
  for (const char* op : {"add", "layernorm", "gelu", "adamw"})
    for (int64_t n : {int64_t{1} << 20, int64_t{8} << 20}) {
      if (std::string(op) == "add" && n > (int64_t{1} << 20)) continue;  // the 32 Mi row above
      for (int t : threads)
        rows.push_back([op = std::string(op), n, t, q = quick, rounds, arrays] {
          return Row{{}, measure_kernel(op, n, t, q, rounds, *arrays), {}};
        });
    }
  // Head sizes 32 and 64 at short and long sequences (gpt-tiny's 64 x 32, gpt-small's 256 x
  // 64, GPT-2 small's 512 x 64): the kernel's rate depends on both.
  struct AttnShape {
    int64_t b, t, c, nh;
  };
  const std::vector<AttnShape> attn = quick ? std::vector<AttnShape>{{12, 64, 128, 4}, {4, 256, 384, 6}}
                                              : std::vector<AttnShape>{{12, 64, 128, 4}, {8, 256, 384, 6}, {2, 512, 768, 12}};
  for (const AttnShape& s : attn)
    for (int t : threads)
      rows.push_back([s, t, q = quick, rounds] {
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
      if (!g.empty()) p.gemm.push_back(median_of_rounds(g, {&GemmRate::gflops}));
      if (!e.empty()) p.elementwise.push_back(median_of_rounds(e, {&ElementwiseRate::bytes_per_s}));
      if (!a.empty()) p.attention.push_back(median_of_rounds(a, {&AttentionRate::gflops}));
    }
    return "kernels: " + std::to_string(p.gemm.size()) + " GEMM, " + std::to_string(p.elementwise.size()) +
           " element-wise and " + std::to_string(p.attention.size()) + " attention rows, each the median of " +
           std::to_string(rounds) + " round(s)";
  };
  add_round_tasks<Row>(std::move(rows), line, keep, tasks, rounds);
}

}  // namespace meshtrain::plan::detail
