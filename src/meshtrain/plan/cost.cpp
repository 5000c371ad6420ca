#include "meshtrain/plan/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

#include "meshtrain/comm/select.h"
#include "meshtrain/parallel/branch/cnn_branch.h"
#include "meshtrain/parallel/spatial/cnn_spatial.h"
#include "meshtrain/parallel/tensor/cnn_tp.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"
#include "meshtrain/plan/cnn_memory.h"

namespace meshtrain::plan {

namespace {

[[noreturn]] void bad(const std::string& s) { throw std::invalid_argument(s); }

// ---- rates ----

// The measured entry for `threads` (the largest measured count at or below it; beyond the
// largest measured, scaled by the ratio).
template <class T, class Rate>
double by_threads(const std::vector<T>& rows, int threads, Rate rate) {
  double best = 0;
  int best_t = 0;
  for (const T& r : rows)
    if (r.threads <= threads && r.threads >= best_t && rate(r) > 0) {
      if (r.threads > best_t) best = 0;
      best_t = r.threads, best = std::max(best, rate(r));
    }
  if (best_t > 0 && best_t < threads) best *= static_cast<double>(threads) / best_t;
  return best;
}

// The measured rate for the op's shape: the shape classes of this precision and operand state
// (in the caches, or `cold`: from memory) at the rank's thread count, interpolated in
// log(m n k). bf16 from memory: bf16's rate in the caches x float32's ratio of the two states.
double gemm_rate(const Hardware& hw, const model::OpCost& o, int threads, bool bf16, bool cold = false) {
  if (!hw.has_machine) return hw.gemm_flops;
  const std::string precision = bf16 && hw.machine.bf16_isa != "emulated" ? "bf16" : "float32";
  bool have_cold = false;
  for (const GemmRate& g : hw.machine.gemm) have_cold |= g.cold && g.precision == precision;
  if (cold && !have_cold) {
    if (precision == "float32") return gemm_rate(hw, o, threads, false, false);
    const double f_hot = gemm_rate(hw, o, threads, false, false), f_cold = gemm_rate(hw, o, threads, false, true);
    return gemm_rate(hw, o, threads, true, false) * (f_hot > 0 ? f_cold / f_hot : 1.0);
  }
  const double size = std::log(std::max(1.0, static_cast<double>(o.m) * static_cast<double>(o.n) * static_cast<double>(o.k)));
  std::vector<std::pair<double, double>> pts;  // (log size, rate)
  for (const GemmRate& g : hw.machine.gemm) {
    if (g.precision != precision || g.cold != cold) continue;
    const double r = by_threads(std::vector<GemmRate>{g}, threads, [](const GemmRate& x) { return x.gflops; });
    if (r <= 0) continue;
    pts.emplace_back(std::log(static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k)), r * 1e9);
  }
  if (pts.empty()) return hw.gemm_flops;
  // Several shapes may have the same size: keep the mean rate per size.
  std::sort(pts.begin(), pts.end());
  std::vector<std::pair<double, double>> u;
  for (size_t i = 0; i < pts.size();) {
    size_t j = i;
    double s = 0;
    while (j < pts.size() && std::abs(pts[j].first - pts[i].first) < 1e-9) s += pts[j++].second;
    u.emplace_back(pts[i].first, s / static_cast<double>(j - i));
    i = j;
  }
  if (size <= u.front().first) return u.front().second;
  if (size >= u.back().first) return u.back().second;
  for (size_t i = 1; i < u.size(); ++i)
    if (size <= u[i].first) {
      const double w = (size - u[i - 1].first) / (u[i].first - u[i - 1].first);
      return u[i - 1].second * (1 - w) + u[i].second * w;
    }
  return u.back().second;
}

// The measured attention shape nearest in (log T, log head size) to the op's (m = T, n = head size).
double attention_rate(const Hardware& hw, const model::OpCost& o, int threads) {
  if (!hw.has_machine || hw.machine.attention.empty()) return hw.attention_flops;
  const double lt = std::log(std::max<int64_t>(1, o.m)), lh = std::log(std::max<int64_t>(1, o.n));
  double best_d = std::numeric_limits<double>::infinity();
  std::vector<AttentionRate> nearest;
  for (const AttentionRate& a : hw.machine.attention) {
    const double d = std::hypot(std::log(static_cast<double>(a.t)) - lt, std::log(static_cast<double>(a.c / a.nh)) - lh);
    if (d < best_d - 1e-9) best_d = d, nearest.clear();
    if (d <= best_d + 1e-9) nearest.push_back(a);
  }
  return 1e9 * by_threads(nearest, threads, [](const AttentionRate& a) { return a.gflops; });
}

// The measured rate of `kernel` (the "add" rows when it was not measured): its largest size
// (from memory) when `cold`, else its smallest (in the caches); the cluster's bandwidth without
// a machine file.
double bandwidth(const Hardware& hw, int threads, const std::string& kernel = "add", bool cold = false) {
  if (!hw.has_machine || hw.machine.elementwise.empty()) return hw.bytes_per_s;
  bool any = false;
  for (const ElementwiseRate& e : hw.machine.elementwise) any |= e.op == kernel;
  const std::string op = any ? kernel : "add";
  int64_t pick = cold ? 0 : std::numeric_limits<int64_t>::max();
  for (const ElementwiseRate& e : hw.machine.elementwise)
    if (e.op == op) pick = cold ? std::max(pick, e.elements) : std::min(pick, e.elements);
  std::vector<ElementwiseRate> rows;
  for (const ElementwiseRate& e : hw.machine.elementwise)
    if (e.op == op && e.elements == pick) rows.push_back(e);
  return by_threads(rows, threads, [](const ElementwiseRate& e) { return e.bytes_per_s; });
}

double call_overhead(const Hardware& hw) {
  if (hw.has_machine && hw.machine.call_overhead_s > 0) return hw.machine.call_overhead_s;
  return hw.call_overhead_s;
}

// ---- convolutional networks' layers (machine file version 4) ----

// The measured convolutions nearest the op's shape class, in its format (the other format when
// the file has none of it): the rate of call `part` (0 forward, 1 backward-data, 2
// backward-weights), a geometric mean weighted by inverse squared distance in (log ic, log oc,
// log k^2, log output positions per call) over the four nearest, at `t` threads. 0: none.
double conv_rate_at(const Hardware& hw, const model::OpCost& o, const std::string& format, int t, int part) {
  const auto lg = [](double x) { return std::log(std::max(1.0, x)); };
  const double positions = static_cast<double>(o.m);  // rows x output positions of this rank
  std::vector<std::pair<double, double>> near;  // (squared distance, log rate)
  for (const ConvRate& c : hw.machine.conv) {
    if (c.format != format || c.threads != t) continue;
    const double r = part == 0 ? c.fwd_gflops : part == 1 ? c.bwd_data_gflops : c.bwd_weights_gflops;
    const double out_h = static_cast<double>((c.h + 2 * (c.k / 2) - c.k) / c.stride + 1);
    const double d_ic = lg(static_cast<double>(o.ic)) - lg(static_cast<double>(c.ic));
    const double d_oc = lg(static_cast<double>(o.oc)) - lg(static_cast<double>(c.oc));
    const double d_k = lg(static_cast<double>(o.kernel_size * o.kernel_size)) - lg(static_cast<double>(c.k * c.k));
    const double d_p = lg(positions) - lg(static_cast<double>(c.n) * out_h * out_h);
    near.emplace_back(d_ic * d_ic + d_oc * d_oc + 2 * d_k * d_k + 0.5 * d_p * d_p, std::log(r * 1e9));
  }
  if (near.empty()) return 0;
  std::sort(near.begin(), near.end());
  double sw = 0, sl = 0;
  for (size_t i = 0; i < std::min<size_t>(4, near.size()); ++i) {
    const double w = 1 / (near[i].first + 1e-3) / (near[i].first + 1e-3);
    sw += w, sl += w * near[i].second;
  }
  return std::exp(sl / sw);
}

// The rate at the rank's `threads`: the best over the measured thread counts up to it (a
// kernel on more threads is not slower than on fewer; a count measured while other work held
// the cores can be), and beyond the largest measured, that one's scaled by the ratio.
double conv_rate(const Hardware& hw, const model::OpCost& o, int threads, int part) {
  if (!hw.has_machine || hw.machine.conv.empty()) return 0;
  const std::string want = o.nchw ? "nchw" : "blocked";
  bool any = false;
  for (const ConvRate& c : hw.machine.conv) any |= c.format == want;
  const std::string format = any ? want : (o.nchw ? "blocked" : "nchw");
  std::set<int> counts;
  for (const ConvRate& c : hw.machine.conv)
    if (c.format == format) counts.insert(c.threads);
  double best = 0;
  int largest = 0;
  for (int t : counts)
    if (t <= threads) best = std::max(best, conv_rate_at(hw, o, format, t, part)), largest = t;
  if (largest == 0) return conv_rate_at(hw, o, format, *counts.begin(), part);
  return best * static_cast<double>(threads) / largest;
}

// Seconds of a measured CNN layer's call at `elements`, from its rows at `t` threads (-1: none):
// the line through the two measured sizes nearest it (its fixed cost and its cost per element).
double layer_seconds_at(const Hardware& hw, const model::OpCost& o, const std::string& format, int t, bool bwd) {
  std::vector<const LayerRate*> rows;
  for (const LayerRate& l : hw.machine.cnn_layers)
    if (l.op == o.kernel && l.format == format && l.threads == t) rows.push_back(&l);
  if (rows.empty()) return -1;
  std::sort(rows.begin(), rows.end(), [](const LayerRate* a, const LayerRate* b) { return a->elements < b->elements; });
  const auto time = [&](const LayerRate* l) { return bwd ? l->bwd_s : l->fwd_s; };
  const double n = static_cast<double>(std::max<int64_t>(1, o.elements));
  if (rows.size() == 1) return time(rows[0]) * n / static_cast<double>(rows[0]->elements);
  size_t hi = 1;
  while (hi + 1 < rows.size() && static_cast<double>(rows[hi]->elements) < n) ++hi;
  const LayerRate *a = rows[hi - 1], *b = rows[hi];
  const double slope = std::max(0.0, (time(b) - time(a)) / static_cast<double>(b->elements - a->elements));
  const double fixed = std::max(0.0, time(a) - slope * static_cast<double>(a->elements));
  return fixed + slope * n;
}

// The fastest over the measured thread counts up to the rank's (as conv_rate), in the op's format
// (the other where the file has none of it); -1 when the file lacks the layer.
double layer_seconds(const Hardware& hw, const model::OpCost& o, int threads, bool bwd) {
  if (!hw.has_machine || hw.machine.cnn_layers.empty()) return -1;
  const std::string want = o.nchw ? "nchw" : "blocked";
  for (const std::string& format : {want, std::string(o.nchw ? "blocked" : "nchw")}) {
    std::set<int> counts;
    for (const LayerRate& l : hw.machine.cnn_layers)
      if (l.op == o.kernel && l.format == format) counts.insert(l.threads);
    if (counts.empty()) continue;
    double best = -1;
    for (int t : counts)
      if (t <= threads) {
        const double s = layer_seconds_at(hw, o, format, t, bwd);
        if (s >= 0 && (best < 0 || s < best)) best = s;
      }
    return best >= 0 ? best : layer_seconds_at(hw, o, format, *counts.begin(), bwd);
  }
  return -1;
}

// Whether the machine file holds rows of the op's kind measured at exactly `t` threads.
bool measured_at(const Hardware& hw, const model::OpCost& o, int t) {
  if (!hw.has_machine) return false;
  const auto at = [t](const auto& rows) {
    return std::any_of(rows.begin(), rows.end(), [t](const auto& r) { return r.threads == t; });
  };
  switch (o.cls) {
    case model::OpClass::gemm: return at(hw.machine.gemm);
    case model::OpClass::attention: return at(hw.machine.attention);
    case model::OpClass::conv: return at(hw.machine.conv);
    case model::OpClass::layer:
      return std::any_of(hw.machine.cnn_layers.begin(), hw.machine.cnn_layers.end(),
                         [&](const LayerRate& r) { return r.op == o.kernel && r.threads == t; });
    default: return at(hw.machine.elementwise);
  }
}

// Seconds of one op's forward (backward when `bwd`) on one rank; `part` of the backward: 0 all,
// 1 the input gradient (I), 2 the weight gradient (W).
double op_seconds(const Hardware& hw, const model::OpCost& o, int threads, bool bf16, bool cold, bool bwd, int part = 0) {
  if (o.cls == model::OpClass::conv && hw.has_machine && !hw.machine.conv.empty()) {
    // Each call at its own measured rate: forward, backward-data (not for the model's first
    // layer), backward-weights.
    if (!bwd) return o.fwd_flops / conv_rate(hw, o, threads, 0);
    const double f = o.fwd_flops;
    const double data = o.input_grad ? f / conv_rate(hw, o, threads, 1) : 0;
    const double weights = f / conv_rate(hw, o, threads, 2);
    return part == 1 ? data : part == 2 ? weights : data + weights;
  }
  if (o.cls == model::OpClass::layer) {
    if (bwd && part == 2) return 0;
    const double t = layer_seconds(hw, o, threads, bwd);
    // The CNN layer rows are measured on one array called again and again (in the caches); in a
    // stage that does not fit its share of the cache every layer reads what the layers before
    // it pushed out, at the elementwise kernels' rate from memory: the ratio of the "add" rows.
    if (t >= 0 && cold) {
      const double hot_bw = bandwidth(hw, threads, "add", false), cold_bw = bandwidth(hw, threads, "add", true);
      return hot_bw > 0 && cold_bw > 0 ? t * std::max(1.0, hot_bw / cold_bw) : t;
    }
    if (t >= 0) return t;
  }
  double flops = bwd ? o.bwd_flops : o.fwd_flops;
  double bytes = bwd ? o.bwd_bytes : o.fwd_bytes;
  const bool product = o.cls == model::OpClass::gemm || o.cls == model::OpClass::conv;
  int calls = bwd && product ? 2 : 1;
  if (bwd && part != 0) {
    if (product) flops /= 2, calls = 1;  // dgrad and wgrad, one product each
    else if (part == 2) return 0;        // only products have a weight gradient
    if (part == 2) bytes = 0;
  }
  double t = calls * call_overhead(hw);
  if (flops > 0) {
    const double rate =
        o.cls == model::OpClass::attention ? attention_rate(hw, o, threads) : gemm_rate(hw, o, threads, bf16, cold);
    if (rate > 0) t += flops / rate;
  }
  if (bytes > 0) {
    const double bw = bandwidth(hw, threads, o.cls == model::OpClass::layer ? "add" : o.kernel, cold);
    if (bw > 0) t += bytes / bw;
  }
  return t;
}

// ---- communication ----

// The cost parameters of a group of `p` ranks (within a node when it fits in one), with
// `ranks_per_core` ranks sharing each core (CPU: latency grows with it, as comm/select.h says).
comm::CostParams link_params(const Hardware& hw, int p, double ranks_per_core) {
  const bool across = hw.devices_per_node > 0 && p > hw.devices_per_node;
  if (hw.has_machine && !across) {
    if (const LinkFit* f = hw.machine.link("threads", "all_reduce")) {
      // The fit is a 2-rank ring all-reduce: 2 steps of alpha, n (beta + gamma / 2).
      const double a = f->alpha_s / 2 * std::max(1.0, ranks_per_core);
      return {a, f->beta_s_per_byte / 1.5, f->beta_s_per_byte / 1.5};
    }
  }
  const Link& l = across ? hw.inter : hw.intra;
  return {l.alpha_s * std::max(1.0, ranks_per_core), l.beta_s_per_byte, 0.0};
}

double collective_s(const Hardware& hw, comm::OpKind op, double bytes, int p, double ranks_per_core) {
  if (p <= 1 || bytes <= 0) return 0;
  const comm::CostParams c = link_params(hw, p, ranks_per_core);
  const auto n = static_cast<std::size_t>(bytes);
  return comm::predicted_seconds(op, comm::choose_algorithm(op, n, p, "threads"), n, p, c);
}

double p2p_s(const Hardware& hw, double bytes, bool across) {
  if (hw.has_machine && !across)
    if (const LinkFit* f = hw.machine.link("threads", "sendrecv")) return f->predict_s(bytes);
  const Link& l = across ? hw.inter : hw.intra;
  return l.alpha_s + l.beta_s_per_byte * bytes;
}

// The intra-layer group's communication of one op in forward (backward when `bwd`): its
// all-reduces (in their number of calls), its all-gathers, its halo messages.
double group_comm_s(const Hardware& hw, const model::OpCost& o, int p, double demand, bool bwd) {
  if (p <= 1) return 0;
  const double ar = bwd ? o.tp_bwd_bytes : o.tp_fwd_bytes;
  const int calls = std::max(1, bwd ? o.tp_bwd_calls : o.tp_fwd_calls);
  double t = ar > 0 ? calls * collective_s(hw, comm::OpKind::all_reduce, ar / calls, p, demand) : 0;
  const double ag = bwd ? o.tp_bwd_gather_bytes : o.tp_fwd_gather_bytes;
  if (ag > 0) t += collective_s(hw, comm::OpKind::all_gather, ag, p, demand);
  const double halo = bwd ? o.halo_bwd_bytes : o.halo_fwd_bytes;
  if (halo > 0 && o.halo_msgs > 0) t += o.halo_msgs * p2p_s(hw, halo / o.halo_msgs, false) * std::max(1.0, demand);
  return t;
}

model::StageSpec stage_spec(const std::vector<pipeline::LayerSpan>& spans, size_t s) {
  model::StageSpec st;
  st.first_layer = spans[s].first, st.end_layer = spans[s].end;
  st.embedding = s == 0, st.head = s + 1 == spans.size();
  return st;
}

}  // namespace

void check_layout(const model::ModelSpec& spec, const Layout& l) {
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.microbatches < 1 || l.chunks < 1)
    bad("a layout needs dp, tp, pp, micro-batches and chunks of at least 1 (" + l.describe() + ")");
  if (l.batch % (static_cast<int64_t>(l.dp) * l.microbatches) != 0)
    bad("the global batch " + std::to_string(l.batch) + " does not divide into dp " + std::to_string(l.dp) + " x " +
        std::to_string(l.microbatches) + " micro-batches");
  if (l.zero < 0 || l.zero > 3) bad("the ZeRO stage must be 0 to 3");
  if (const model::GPTConfig* g = spec.gpt()) {
    if (l.split != Layout::Split::tensor) bad(spec.name() + " is a transformer: its layers split with tp only");
    parallel::validate_tp(*g, l.tp, {.sequence_parallel = l.sequence_parallel, .pad_vocab = l.pad_vocab}, l.seq);
  } else if (const model::CNNConfig* c = spec.cnn(); c && l.tp > 1) {
    switch (l.split) {
      case Layout::Split::tensor: parallel::validate_cnn_tp(*c, l.tp); break;
      case Layout::Split::spatial: parallel::validate_cnn_spatial(*c, l.tp); break;
      case Layout::Split::branch: parallel::validate_cnn_branch(*c, l.tp, l.branch_balance); break;
    }
  }
  const int stages = l.pp * (l.pp > 1 ? l.chunks : 1);
  if (spec.num_units() < stages)
    bad(spec.name() + " has " + std::to_string(spec.num_units()) + " units to cut between pipeline stages, fewer than " +
        "the " + std::to_string(stages) + " stages of pp " + std::to_string(l.pp) + (l.chunks > 1 ? " x chunks" : ""));
}

std::string Layout::describe() const {
  std::string s = "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                  " m=" + std::to_string(microbatches);
  if (pp > 1) s += " " + schedule + (chunks > 1 ? " v=" + std::to_string(chunks) : std::string());
  if (zero > 0) s += " zero=" + std::to_string(zero);
  if (recompute) s += " recompute";
  if (sequence_parallel) s += " sp";
  return s;
}

std::optional<AgainstOneRank> against_one_rank(const model::ModelSpec& spec, const Layout& l, const Hardware& hw,
                                               double step_s) {
  if (l.world() <= 1 || hw.cores <= 0 || hw.nodes != 1 || step_s <= 0) return std::nullopt;
  Layout one;
  one.batch = l.batch, one.seq = l.seq, one.bf16 = l.bf16, one.optimizer_state = l.optimizer_state;
  one.threads = std::max(1, std::min(hw.cores, l.world() * l.threads));
  try {
    const Prediction p = predict(spec, one, hw);
    if (p.step_s <= 0) return std::nullopt;
    return AgainstOneRank{p.step_s, one.threads, p.step_s / step_s};
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

Hardware hardware_from_machine(const MachineProfile& m, double memory_bytes) {
  Hardware hw;
  hw.name = m.host + " (" + m.cpu_model + ")";
  hw.nodes = 1;
  // Ranks are threads of one process on this machine: however many, they share one node (the
  // trainer allows 16 a core).
  hw.devices_per_node = 16 * std::max(1, m.cores);
  hw.cores = std::max(1, m.cores);
  hw.memory_bytes = memory_bytes;
  hw.has_machine = true;
  hw.machine = m;
  // MFU's peak: the best float32 GEMM rate at all cores.
  for (const GemmRate& g : m.gemm)
    if (g.precision == "float32" && g.threads == m.cores) hw.peak_flops = std::max(hw.peak_flops, g.gflops * 1e9);
  hw.peak_flops /= std::max(1, m.cores);  // per device: a core
  return hw;
}

std::vector<pipeline::LayerSpan> balance_stages(const model::ModelSpec& spec, const Layout& l) {
  const int stages = l.pp * (l.pp > 1 ? l.chunks : 1);
  const int64_t units = spec.num_units();
  if (units < stages)
    bad(spec.name() + " has " + std::to_string(units) + " units to cut between pipeline stages, fewer than the " +
        std::to_string(stages) + " stages of pp " + std::to_string(l.pp) + (l.chunks > 1 ? " x chunks" : ""));
  if (stages > 1 && l.chunks > 1) {
    if (units % stages != 0)
      bad("interleaved stages need " + spec.name() + "'s " + std::to_string(units) + " units to divide by " +
          std::to_string(stages));
    return pipeline::equal_layers(units, stages);
  }
  const model::CostQuery q{1, std::max<int64_t>(1, l.seq), 1, false};
  std::vector<double> unit_flops;
  for (int64_t u = 0; u < units; ++u)
    unit_flops.push_back(model::total_flops(spec.op_costs({u, u + 1, false, false}, q)));
  const double last = units > 0 ? model::total_flops(spec.op_costs({units - 1, units, false, true}, q)) -
                                      unit_flops.back()
                                : 0;
  const double first = units > 0 ? model::total_flops(spec.op_costs({0, 1, true, false}, q)) - unit_flops.front() : 0;
  return pipeline::balance_layers(unit_flops, stages, first, last);
}

std::vector<RankMemory> predict_memory(const model::ModelSpec& spec, const Layout& l) {
  check_layout(spec, l);
  const std::vector<pipeline::LayerSpan> spans = l.stages.empty() ? balance_stages(spec, l) : l.stages;
  const std::string name = l.pp == 1 ? "naive" : l.schedule == "zb" ? "zb-h1" : l.schedule;
  const pipeline::Schedule sched = pipeline::make_schedule(name, {l.pp, l.microbatches, l.pp == 1 ? 1 : l.chunks});
  const std::vector<int> in_flight = pipeline::peak_in_flight(sched);
  const int64_t rows = l.batch / l.dp / l.microbatches;
  const model::CostQuery q{rows, std::max<int64_t>(1, l.seq), l.tp, l.sequence_parallel};
  const double dp = l.dp;
  std::vector<RankMemory> out(static_cast<size_t>(l.pp));
  // Where each model stage lives: stage s on rank s % pp; under Chimera also on rank pp-1-s (the
  // up pipeline's copy), each rank then holding two stages.
  std::vector<std::pair<size_t, size_t>> placed;  // (model stage, rank)
  for (size_t s = 0; s < spans.size(); ++s) {
    placed.emplace_back(s, s % static_cast<size_t>(l.pp));
    if (sched.shape.bidirectional) placed.emplace_back(s, static_cast<size_t>(l.pp) - 1 - s);
  }
  // A CNN split over the intra-layer group, as one stage: what each of its ranks holds, measured
  // by running the split (plan/cnn_memory.h); otherwise the single rank's figures over the group.
  const bool probe = spec.cnn() && l.tp > 1 && spans.size() == 1;
  const bool measured = probe && l.split == Layout::Split::branch && l.branch_balance.empty();
  const SplitMemory sm = probe ? split_memory(*spec.cnn(), l.split, l.tp, l.branch_balance, rows,
                                              measured ? branch_costs(*spec.cnn(), rows, l.threads)
                                                       : std::map<std::string, std::vector<double>>{})
                               : SplitMemory{};
  std::vector<RankMemory> per_rank;
  for (int tr = 0; tr < (probe ? l.tp : 1); ++tr)  // the probed ranks one by one (then one stage)
    for (const auto& [s, rank] : placed) {
    RankMemory& m = out[rank];
    if (probe) m = RankMemory{};
    const model::StageSpec st = stage_spec(spans, s);
    const std::vector<model::OpCost> ops = spec.op_costs(st, q);
    const size_t t = static_cast<size_t>(tr);
    const double elems = probe ? sm.params[t] : spec.stage_param_elements(st, l.tp);
    m.params += 4 * elems / (l.zero >= 3 ? dp : 1);
    // ZeRO-2/3 as data_parallel.h runs them: the full gradient buckets live through backward
    // (freed after the step) beside this rank's reduced slice.
    m.grads += 4 * elems + (l.zero >= 2 && l.dp > 1 ? 4 * elems / dp : 0.0);
    m.optimizer += 4.0 * l.optimizer_state * elems / (l.zero >= 1 ? dp : 1);
    if (l.bf16) m.buffers += 2 * elems;
    // PipeDream-2BW (train/weight_versions.h): the stashed weight version and the previous
    // step's gradient, waiting for its update, beside the current ones.
    // PipeDream (train/weight_stash.h): stage s of p stashes the p - 1 - s versions its
    // micro-batches in flight ran forward on; its gradient is applied after each micro-batch.
    if (l.schedule == "pipedream") m.params += 4 * elems * static_cast<double>(spans.size() - 1 - s);
    else if (sched.period > 0) m.params += 4 * elems, m.grads += 4 * elems;
    const int f = std::max(1, in_flight[rank]);
    m.in_flight = f;
    const double saved = probe ? sm.kept[t] : model::total_saved_bytes(ops);
    const double bwd_peak = probe ? sm.peak[t] : model::backward_peak_bytes(ops);
    // Several chunks share the rank's in-flight count: charge each chunk its share. One
    // micro-batch is in backward (its saved bytes plus its transients, backward_peak_bytes);
    // the others hold what they saved (with recomputation: their stage input only).
    const double share = static_cast<double>(f) / (l.pp > 1 ? sched.shape.chunks : 1);
    const double held = l.recompute ? spec.boundary_bytes(st.first_layer, rows, q.T, 1) : saved;
    m.activations += share * held;
    // The executor posts every receive of the step at its start (pipeline/executor.cpp): a
    // gradient buffer per micro-batch for a stage that sends on (that of the micro-batch in
    // backward is its output gradient, which its transients count), an activation buffer per
    // micro-batch for one that receives (those of the micro-batches in flight are the saved
    // inputs counted above). What a stage sends it holds only until the send completes
    // (released as the step goes on): a stage output no layer saved is not counted.
    if (spans.size() > 1) {
      const double mbs = l.microbatches;
      if (s + 1 < spans.size()) m.buffers += (mbs - 1) * spec.boundary_bytes(st.end_layer, rows, q.T, 1);
      // A skip leaving the stage in a portal: the receive of its gradient, one per micro-batch,
      // posted at the step's start as well (none of them a saved activation or a transient).
      if (s + 1 < spans.size()) m.buffers += mbs * spec.skip_bytes(st.end_layer, rows);
      if (s > 0) m.buffers += std::max(0.0, mbs - share) * spec.boundary_bytes(st.first_layer, rows, q.T, 1);
      // An asynchronous schedule's window posts its step's receives while the previous step's
      // owed micro-batches (f - 1 of them) still hold the inputs they received.
      if (sched.period > 0 && s > 0) m.buffers += (f - 1) * spec.boundary_bytes(st.first_layer, rows, q.T, 1);
    }
    // The micro-batch in backward: beyond what it holds, its transients (recomputation: the
    // whole forward's saved activations again).
    m.temp = std::max(m.temp, bwd_peak - (l.recompute ? 0.0 : saved));
    if (l.zero >= 3) {
      // The unit being computed and the next one prefetched, gathered whole.
      double largest = 0;
      for (int64_t u = st.first_layer; u < st.end_layer; ++u)
        largest = std::max(largest, spec.stage_param_elements({u, u + 1, false, false}, l.tp));
      m.buffers = std::max(m.buffers, 2 * 4 * largest);
    }
    if (probe) per_rank.push_back(m);
  }
  if (probe) {
    // The rank that holds the most stands for the group; each rank's total beside it.
    std::vector<double> totals;
    for (const RankMemory& m : per_rank) totals.push_back(m.total());
    out[0] = per_rank[static_cast<size_t>(std::max_element(totals.begin(), totals.end()) - totals.begin())];
    out[0].by_tp_rank = totals;
  }
  return out;
}

Prediction predict(const model::ModelSpec& spec, const Layout& l, const Hardware& hw) {
  check_layout(spec, l);
  Prediction p;
  p.layout = l;
  if (spec.cnn() && hw.has_machine && (hw.machine.conv.empty() || hw.machine.cnn_layers.empty()))
    p.notes.push_back("the machine file (version " + std::to_string(hw.machine.version) +
                      ") has no measured convolutions or CNN layers: convolutions are priced as GEMMs and the other "
                      "layers by bandwidth, which can be far off; measure them with meshtrain calibrate");
  p.stages = l.stages.empty() ? balance_stages(spec, l) : l.stages;
  const std::string name = l.pp == 1 ? "naive" : l.schedule == "zb" ? "zb-h1" : l.schedule;
  p.schedule = pipeline::add_send_recv(pipeline::make_schedule(name, {l.pp, l.microbatches, l.pp == 1 ? 1 : l.chunks}));
  const int64_t rows = l.batch / l.dp / l.microbatches;
  const int64_t T = std::max<int64_t>(1, l.seq);
  model::CostQuery q{rows, T, l.tp, l.sequence_parallel};
  q.split = l.split == Layout::Split::spatial  ? model::CostQuery::Split::spatial
            : l.split == Layout::Split::branch ? model::CostQuery::Split::branch
                                               : model::CostQuery::Split::tensor;
  q.branch_balance = l.branch_balance;
  if (spec.cnn() && l.tp > 1 && l.split == Layout::Split::branch && l.branch_balance.empty())
    q.branch_costs = branch_costs(*spec.cnn(), rows, l.threads);
  const int world = l.world();
  // Ranks per core: CPU ranks are threads of one process that share its cores.
  const bool shared = hw.cores > 0;
  const double demand = shared ? static_cast<double>(world) * l.threads / hw.cores : 1.0;
  const int threads = l.threads;
  // How many ranks run the same work at once on a node's cores: the data-parallel replicas and
  // the intra-layer group, in step with each other (the rest take turns: `demand` below).
  // Pipeline stages are not counted: they compute at once only outside the bubble, and on the
  // 2-core VM resnet-small at pp 2 (1F1B) and resnet-cut at pp 2 (GPipe) ran their fastest
  // steps in 68.3 and 8.3 ms, against 65.4 and 7.9 predicted without them and 80.6 and 12.6 with.
  const int concurrent = shared ? std::max(1, std::min(l.dp * l.tp, hw.cores / std::max(1, threads))) : 1;
  const bool pp_across = world > hw.devices_per_node;

  const std::vector<int> in_flight = pipeline::peak_in_flight(p.schedule);
  pipeline::Costs costs;
  double worst_tp = 0, worst_b = 0, stage_grad_bytes = 0, stage_elems = 0;
  int64_t stage_tensors = 0;
  std::vector<double> unit_gather_bytes;  // ZeRO-3 per unit, the largest stage's
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const model::StageSpec st = stage_spec(p.stages, s);
    const std::vector<model::OpCost> ops = spec.op_costs(st, q);
    const double elems = spec.stage_param_elements(st, l.tp);
    // A CPU's last-level cache, shared by the process's ranks: when a micro-batch's saved
    // activations and the stage's parameters, gradients and optimizer state do not fit in a
    // rank's share, every layer reads its operands from memory (the machine file's rates "from
    // memory": GEMMs with rotating operands, the kernels on arrays beyond the cache).
    // The micro-batches in flight count (each holds its activations), and half the cache:
    // the rest holds what the step touches besides (buffers, the other ranks' data, code).
    bool cold = false;
    if (shared && hw.has_machine && hw.machine.llc_bytes > 0) {
      const double share = static_cast<double>(hw.machine.llc_bytes) / 2 / std::max(1, std::min(world, hw.cores));
      const int flight = std::max(1, in_flight.at(s % static_cast<size_t>(l.pp)));
      cold = model::total_saved_bytes(ops) * flight + 4.0 * (2 + l.optimizer_state) * elems > share;
    }
    // Convolutions and CNN layers of ranks computing at once on the node's cores share more
    // than the cores (memory bandwidth, the caches, on a VM whatever the host shares): k ranks
    // of t threads get together at most what one rank of k t threads gets, as measured, so such
    // an op takes at least k times its time at k t threads (where the cores scale linearly, its
    // time at t threads). Measured on a 2-core VM: tp 2's split convolutions (half the work, one
    // thread each) took what one rank's took at two threads, whose rows run 1.5-1.6x one
    // thread. The transformers' products did not show it (gpt-tiny at dp 2, one thread a rank,
    // 15.7 ms a step against one rank's 16.0 at two), so GEMMs keep their one-rank rates.
    const auto sec = [&](const model::OpCost& o, bool bwd, int part) {
      const double alone = op_seconds(hw, o, threads, l.bf16, cold, bwd, part);
      const bool cnn_op = o.cls == model::OpClass::conv || o.cls == model::OpClass::layer;
      if (!cnn_op || concurrent <= 1 || !measured_at(hw, o, threads * concurrent)) return alone;
      return std::max(alone, concurrent * op_seconds(hw, o, threads * concurrent, l.bf16, cold, bwd, part));
    };
    double F = 0, B = 0, I = 0, W = 0, tp_s = 0, fwd_compute = 0;
    // Ranks of the intra-layer group compute alike, except under the branch split (each its
    // branches): the slowest rank's.
    const int ranks = l.split == Layout::Split::branch && spec.cnn() ? l.tp : 1;
    for (int r = 0; r < ranks; ++r) {
      model::CostQuery qr = q;
      qr.tp_rank = r;
      const std::vector<model::OpCost> rops = r == 0 ? ops : spec.op_costs(st, qr);
      double f_ = 0, b_ = 0, i_ = 0, w_ = 0, tp_ = 0, fc_ = 0;
      for (const model::OpCost& o : rops) {
        const double f = sec(o, false, 0), b = sec(o, true, 0);
        const double tf = group_comm_s(hw, o, l.tp, demand, false), tb = group_comm_s(hw, o, l.tp, demand, true);
        if (s == 0 && r == 0) {
          const std::string kind = o.cls == model::OpClass::conv        ? "convolution"
                                   : o.cls == model::OpClass::gemm      ? "gemm"
                                   : o.cls == model::OpClass::attention ? "attention"
                                                                         : o.kernel;
          p.ops.push_back({o.name, kind, f, b, tf + tb});
        }
        fc_ += f;
        f_ += f, b_ += b;
        i_ += sec(o, true, 1), w_ += sec(o, true, 2);
        f_ += tf, b_ += tb, i_ += tb, tp_ += tf + tb;
      }
      if (f_ + b_ > F + B) F = f_, B = b_, I = i_, W = w_, tp_s = tp_, fwd_compute = fc_;
    }
    if (l.recompute) B += fwd_compute, I += fwd_compute;
    if (l.zero >= 3 && l.dp > 1) {
      // Every unit gathered before its forward and again before its backward, the next one
      // prefetched while this one computes: the first exposed, the rest hidden where the
      // device computes beside them (not on a CPU whose cores the ranks already fill).
      double all = 0, first = -1;
      for (int64_t u = st.first_layer; u < st.end_layer; ++u) {
        const double g = collective_s(hw, comm::OpKind::all_gather, 4 * spec.stage_param_elements({u, u + 1, false, false}, l.tp),
                                      l.dp, demand);
        all += g;
        if (first < 0) first = g;
      }
      const double exposed = shared && demand >= 1 ? all : std::max(0.0, first);
      F += exposed, B += exposed, I += exposed;
    }
    for (int mb = 0; mb < p.schedule.shape.microbatches; ++mb)  // an asynchronous schedule's: all unrolled steps
      for (int v = static_cast<int>(s); v < p.schedule.shape.stages(); v += l.pp) {  // Chimera: both pipelines' copies
        if (p.schedule.shape.model_stage(v) != static_cast<int>(s)) continue;
        costs.measured[{pipeline::Kind::F, v, mb}] = F;
        costs.measured[{pipeline::Kind::B, v, mb}] = B;
        costs.measured[{pipeline::Kind::I, v, mb}] = I;
        costs.measured[{pipeline::Kind::W, v, mb}] = W;
      }
    worst_tp = std::max(worst_tp, tp_s * l.microbatches);
    worst_b = std::max(worst_b, B);
    // The pp rank with the most parameters decides the data-parallel and optimizer times.
    if (elems > stage_elems) stage_elems = elems, stage_grad_bytes = 4 * elems;
    int64_t tensors = 0;
    for (const model::OpCost& o : ops) tensors += o.cls == model::OpClass::gemm ? 2 : (o.saved_bytes > 0 ? 2 : 0);
    stage_tensors = std::max(stage_tensors, tensors);
    if (s + 1 < p.stages.size())
      costs.transfer = std::max(costs.transfer, p2p_s(hw, spec.boundary_bytes(st.end_layer, rows, T, 1), pp_across));
  }
  // Ranks that outnumber the cores: a stage whose input arrives finds its core running another
  // rank, and waits for that rank's action to end (it yields at its next wait) or for the
  // scheduler to take the core from it, the measured hand-over (calibrate measures it against
  // ranks that never wait). An action of length L in progress has L^2 / (2 sum L) left on
  // average over the actions' time (the mean residual of a renewal process): the waiting
  // time is the smaller of the two. Measured on the 2-core VM, gpt-tiny at pp 4 (four ranks,
  // one thread each): 1.19x one rank's step, priced at 2.00x with the 1.9 ms hand-over on
  // every message.
  if (shared && demand > 1 && hw.has_machine) {
    double sum = 0, sum_sq = 0;
    for (const auto& [key, t] : costs.measured)
      if (std::get<0>(key) == pipeline::Kind::F || std::get<0>(key) == pipeline::Kind::B) sum += t, sum_sq += t * t;
    const double residual = sum > 0 ? sum_sq / (2 * sum) : hw.machine.oversubscribed_handoff_s;
    costs.transfer += std::min(hw.machine.oversubscribed_handoff_s, residual);
  }
  p.timeline = pipeline::simulate(p.schedule, costs);
  if (p.timeline.deadlock) bad("the schedule " + name + " does not finish: " + p.timeline.deadlock->to_string());
  double busy = 0, bubble = 0;
  for (size_t r = 0; r < p.timeline.busy.size(); ++r) busy += p.timeline.busy[r], bubble += p.timeline.bubble[r];
  p.bubble = p.timeline.busy.empty() ? 0 : bubble / static_cast<double>(p.timeline.busy.size());
  p.compute_s = p.timeline.makespan;
  if (p.schedule.period > 0) {
    // An asynchronous schedule's timeline holds kUnrolledSteps steps without a flush: a step in
    // the steady state is what they take beyond one flushed step (1F1B's fill and drain), shared.
    const pipeline::Schedule one = pipeline::add_send_recv(pipeline::make_schedule("1f1b", {l.pp, l.microbatches, 1}));
    const double flushed = pipeline::simulate(one, costs).makespan;
    p.compute_s = (p.timeline.makespan - flushed) / (pipeline::kUnrolledSteps - 1);
    busy /= pipeline::kUnrolledSteps;
    p.bubble = p.compute_s > 0 ? std::max(0.0, 1 - busy / static_cast<double>(p.timeline.busy.size()) / p.compute_s) : 0;
  }
  if (shared) {
    // Time-sharing: all ranks' work (the simulated pipeline's, for every dp x tp replica, each
    // rank with its threads) over the cores.
    // Ranks that outnumber the cores also lose some of it taking turns (the machine file's
    // measured efficiency at two ranks a core).
    const double eff = demand > 1 && hw.has_machine ? hw.machine.shared_core_efficiency : 1.0;
    p.compute_s = std::max(p.compute_s, busy * l.dp * l.tp * l.threads / hw.cores / eff);
  }
  p.tp_comm_s = worst_tp;

  // Data parallelism: the gradient buckets of the last micro-batch's backward.
  if (l.dp > 1) {
    const comm::OpKind op = l.zero >= 2 ? comm::OpKind::reduce_scatter : comm::OpKind::all_reduce;
    const double bucket = static_cast<double>(std::max<int64_t>(4, l.bucket_bytes));
    const double n_full = std::floor(stage_grad_bytes / bucket), rest = stage_grad_bytes - n_full * bucket;
    const double all = n_full * collective_s(hw, op, bucket, l.dp, demand) + collective_s(hw, op, rest, l.dp, demand);
    const double last = collective_s(hw, op, rest > 0 ? rest : bucket, l.dp, demand);
    // Hidden behind backward where the device has room for it; a CPU whose cores the ranks fill
    // does the copies and sums on the same cores.
    p.dp_comm_s = shared && demand >= 1 ? all : std::max(last, all - worst_b);
    if (l.zero >= 1) p.dp_comm_s += collective_s(hw, comm::OpKind::all_gather, stage_grad_bytes, l.dp, demand);
  }
  // Optimizer: read the parameter and its gradient, read and write the state, write the
  // parameter (its slice under ZeRO); the gradient norm reads the gradients; zeroing writes them.
  {
    const double shard = stage_elems / (l.zero >= 1 ? l.dp : 1);
    const double grads = stage_elems / (l.zero >= 2 ? l.dp : 1);
    const double update = 4 * shard * (3 + 2.0 * l.optimizer_state), other = 4 * 2 * grads;
    // From memory when the state does not fit in the rank's share of the cache.
    const bool cold = shared && hw.has_machine && hw.machine.llc_bytes > 0 &&
                      update + other > static_cast<double>(hw.machine.llc_bytes) / std::max(1, std::min(world, hw.cores));
    const double bw_update = bandwidth(hw, threads, "adamw", cold), bw = bandwidth(hw, threads, "add", cold);
    p.optimizer_s = (bw_update > 0 ? update / bw_update : 0) + (bw > 0 ? other / bw : 0) +
                    static_cast<double>(stage_tensors) * 3 * call_overhead(hw);
    if (shared) p.optimizer_s *= std::max(1.0, demand);
  }
  if (l.schedule == "pipedream") {
    // An update after every micro-batch, each after its own gradient all-reduce (inside the
    // pipeline: an approximation that puts them beside it rather than simulating them in it).
    p.optimizer_s *= l.microbatches;
    p.dp_comm_s *= l.microbatches;
  }
  p.step_s = p.compute_s + p.dp_comm_s + p.optimizer_s;
  const double pp_comm = costs.transfer * 2 * l.microbatches;
  p.comm_share = p.step_s > 0 ? std::min(1.0, (p.tp_comm_s + p.dp_comm_s + pp_comm) / p.step_s) : 0;
  p.flops_per_step = spec.flops_per_sample(T) * static_cast<double>(l.batch);
  p.samples_per_s = p.step_s > 0 ? static_cast<double>(l.batch) / p.step_s : 0;
  p.tokens_per_s = p.samples_per_s * static_cast<double>(T);
  const double peak_all = hw.peak_flops * (shared ? std::min<double>(hw.cores, world * l.threads) : world);
  p.mfu = p.step_s > 0 && peak_all > 0 ? p.flops_per_step / p.step_s / peak_all : 0;
  p.memory = predict_memory(spec, [&] {
    Layout m = l;
    m.stages = p.stages;
    return m;
  }());
  for (const RankMemory& m : p.memory) p.peak_bytes = std::max(p.peak_bytes, m.total());
  return p;
}

}  // namespace meshtrain::plan
