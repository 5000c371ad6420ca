// `meshtrain plan (--model NAME | --config FILE) (--cluster FILE.json | --machine FILE.json)
// --global-batch B [--seq T] [--top K] [--svg best.svg] [--optimizer adamw|sgd|lamb]
// [--overwrite]`: the fastest layouts of a model on a cluster, predicted without running anything.
//
// Reads the cluster file (plan/cluster.h), or a machine file `meshtrain calibrate` wrote as one
// node of that machine (--machine, or --cluster given a machine file), enumerates the layouts
// its devices can run (plan/search.h: dp x tp x pp, micro-batches, schedule, ZeRO,
// recomputation), predicts each with the cost and memory models (plan/cost.h), drops those
// that do not fit in memory and prints the K fastest: layout, step time, tokens/s (images/s),
// MFU, peak memory per rank, pipeline bubble, communication share. --svg draws the best
// layout's predicted step as a swimlane (pipeline/svg.h). A progress line goes to stderr when
// the search takes more than a second.
//
// --goodput [--noise-scale B_NOISE | --noise-from METRICS.jsonl] [--max-batch N] ranks global
// batches instead (plan/goodput.h): --global-batch B0, 2 B0, 4 B0, ... up to --max-batch
// (default 16 B0), each predicted at its fastest layout that fits (or at --layout), its
// samples/s times Pollux's efficiency against B0 (train::stat_efficiency, the function the
// trainer reports with) for the noise scale given or the last `grad_noise_scale` of a run's
// metrics file; the highest goodput is marked.
//
// Bad input exits 2 with one sentence (UsageError): a bad cluster or machine file (the reader
// names the field; a file of neither kind is named with the kinds plan reads), both or neither
// of --cluster and --machine, a model that fits no layout (what would make it fit:
// plan::advise), --top below 1, a missing --global-batch, paths the output policy refuses
// (train/outputs.h); with --goodput: no noise scale or both sources, a noise scale not above 0,
// a metrics file without grad_noise_scale, a --max-batch below 2 B0, a --layout no candidate
// batch can take; the goodput flags without --goodput.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/pipeline/svg.h"
#include "meshtrain/plan/cluster.h"
#include "meshtrain/plan/goodput.h"
#include "meshtrain/plan/search.h"
#include "meshtrain/train/noise_scale.h"
#include "meshtrain/train/outputs.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::cli {

namespace {

struct PlanArgs {
  std::string model, config, cluster, machine, svg, optimizer = "adamw";
  int64_t batch = 0, seq = 0;
  int top = 10;
  bool overwrite = false;
  bool oversubscribe = false;
  std::string layout;   // --layout: predict this one layout instead of searching
  bool ops = false;     // --ops (with --layout): every op's predicted time
  int64_t devices = 0;  // --devices: use this many of the cluster's devices (whole nodes)
  // --goodput: rank global batches by predicted goodput (plan/goodput.h)
  bool goodput = false;
  double noise_scale = -1;  // --noise-scale (samples); -1: not given
  std::string noise_from;   // --noise-from: a metrics file's last grad_noise_scale
  int64_t max_batch = 0;    // --max-batch (0: 16 x --global-batch)
};

// Global batches --goodput compares by default: the base and 2x, 4x, 8x, 16x it.
inline constexpr int64_t kGoodputSpan = 16;

// "dp=4 tp=8 pp=12 m=128 1f1b zero=1 recompute" (Layout::describe's words) -> a Layout.
plan::Layout parse_layout(const std::string& text) {
  plan::Layout l;
  std::istringstream in(text);
  std::string w;
  auto number = [&](const std::string& word, const std::string& value) {
    try {
      size_t used = 0;
      const int v = std::stoi(value, &used);
      if (used == value.size() && v >= 0) return v;
    } catch (const std::exception&) {
    }
    throw UsageError("--layout: '" + word + "' needs a whole number after '='");
  };
  while (in >> w) {
    const auto eq = w.find('=');
    if (eq != std::string::npos) {
      const std::string k = w.substr(0, eq), v = w.substr(eq + 1);
      if (k == "dp") l.dp = number(w, v);
      else if (k == "tp") l.tp = number(w, v);
      else if (k == "pp") l.pp = number(w, v);
      else if (k == "m") l.microbatches = number(w, v);
      else if (k == "zero") l.zero = number(w, v);
      else if (k == "v") l.chunks = number(w, v);
      else throw UsageError("--layout: unknown '" + k + "=' in '" + text + "' (dp=, tp=, pp=, m=, zero=, v=)");
    } else if (w == "gpipe" || w == "1f1b" || w == "interleaved" || w == "zb" || w == "naive" || w == "pipedream-2bw" ||
               w == "pipedream" || w == "chimera") {
      l.schedule = w;
      if (w == "interleaved" && l.chunks == 1) l.chunks = 2;
    } else if (w == "recompute") {
      l.recompute = true;
    } else if (w == "sp") {
      l.sequence_parallel = true;
    } else {
      throw UsageError("--layout: unknown word '" + w + "' in '" + text +
                       "' (dp=N tp=N pp=N m=N zero=N v=N, a schedule, recompute, sp)");
    }
  }
  return l;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// 0.00123 -> "1.23 ms"
std::string seconds_text(double s) {
  if (s >= 1) return fmt("%.3g s", s);
  if (s >= 1e-3) return fmt("%.3g ms", s * 1e3);
  return fmt("%.3g us", s * 1e6);
}

// 1234567 -> "1.23M"
std::string rate_text(double x) {
  if (x >= 1e9) return fmt("%.3gG", x / 1e9);
  if (x >= 1e6) return fmt("%.3gM", x / 1e6);
  if (x >= 1e3) return fmt("%.3gk", x / 1e3);
  return fmt("%.3g", x);
}

std::string train_flags(const plan::Layout& l, const model::ModelSpec& spec, const PlanArgs& a, bool cpu) {
  std::string s = "--batch " + std::to_string(l.batch);
  if (spec.gpt()) s += " --seq " + std::to_string(l.seq);
  s += " --dp " + std::to_string(l.dp) + " --tp " + std::to_string(l.tp) + " --pp " + std::to_string(l.pp);
  s += " --microbatches " + std::to_string(l.microbatches);
  if (l.pp > 1) s += " --schedule " + l.schedule + (l.chunks > 1 ? " --chunks " + std::to_string(l.chunks) : "");
  if (l.zero > 0) s += " --zero " + std::to_string(l.zero);
  if (l.recompute) s += " --recompute";
  if (spec.gpt() && l.tp > 1 && spec.gpt()->vocab_size % l.tp != 0) s += " --pad-vocab";
  s += " --optimizer " + a.optimizer;
  if (cpu) s += " --threads " + std::to_string(l.threads);
  return s;
}

// A ranked layout as the Python module's meshtrain.plan() returns it (InProcessHooks::on_plan_rows):
// the table's columns as numbers, the layout's fields and its train flags.
nlohmann::ordered_json plan_row(size_t rank, const plan::Prediction& p, const model::ModelSpec& spec, const PlanArgs& a, bool cpu) {
  const plan::Layout& l = p.layout;
  const char* split = l.split == plan::Layout::Split::spatial ? "spatial"
                      : l.split == plan::Layout::Split::branch ? "branch"
                                                               : "tensor";
  return {{"rank", rank},
          {"layout", l.describe()},
          {"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"split", split},
          {"microbatches", l.microbatches},
          {"schedule", l.schedule},
          {"chunks", l.chunks},
          {"zero", l.zero},
          {"recompute", l.recompute},
          {"sequence_parallel", l.sequence_parallel},
          {"batch", l.batch},
          {"seq", l.seq},
          {"threads", l.threads},
          {"step_s", p.step_s},
          {"tokens_per_s", p.tokens_per_s},
          {"samples_per_s", p.samples_per_s},
          {"mfu", p.mfu},
          {"peak_bytes", p.peak_bytes},
          {"bubble", p.bubble},
          {"comm_share", p.comm_share},
          {"compute_s", p.compute_s},
          {"tp_comm_s", p.tp_comm_s},
          {"dp_comm_s", p.dp_comm_s},
          {"optimizer_s", p.optimizer_s},
          {"train_flags", train_flags(l, spec, a, cpu)}};
}

// The best layout's predicted step: the simulated pipeline, then the exposed data-parallel
// communication and the optimizer step on every rank.
void draw(const plan::Prediction& p, const std::string& path, const std::string& what) {
  pipeline::Swimlane lane = pipeline::swimlane_of(p.schedule, p.timeline, what + ": " + p.layout.describe() +
                                                                              ", step " + seconds_text(p.step_s) +
                                                                              " (predicted)");
  double t = p.timeline.makespan;
  for (int r = 0; r < p.layout.pp; ++r) {
    if (p.dp_comm_s > 0) lane.blocks.push_back({r, t, t + p.dp_comm_s, "comm", "dp", "data-parallel gradients (exposed)"});
    if (p.optimizer_s > 0)
      lane.blocks.push_back({r, t + p.dp_comm_s, t + p.dp_comm_s + p.optimizer_s, "optimizer", "opt", "optimizer step"});
  }
  lane.axis_caption = "time (s, predicted by the cost model; one rank of each pipeline stage)";
  lane.boundaries = {0, p.step_s};
  pipeline::write_svg(lane, path);
}

// --layout: the prediction of one layout, as a row of the table, with its memory against the
// device's, and the model's FLOP rate per device.
void predict_one(const PlanArgs& a, const model::ModelSpec& spec, const plan::Cluster& cluster, const plan::SearchOptions& o,
                 const InProcessHooks& hooks) {
  const plan::Hardware& hw = cluster.hardware;
  plan::Layout l = parse_layout(a.layout);
  l.batch = o.batch, l.seq = o.seq, l.optimizer_state = o.optimizer_state;
  if (l.world() > hw.devices())
    throw UsageError("--layout " + a.layout + " needs " + std::to_string(l.world()) + " devices; " + cluster.name +
                     " has " + std::to_string(hw.devices()) + (cluster.cpu() ? " (--oversubscribe for more ranks than cores)" : ""));
  if (cluster.cpu()) l.threads = std::max(1, hw.cores / std::max(1, l.world()));
  plan::Prediction p;
  try {
    p = plan::predict(spec, l, hw);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--layout: ") + e.what());
  }
  const double need = plan::memory_need(p.memory, p.layout, hw);
  if (!a.svg.empty()) draw(p, a.svg, spec.name() + " on " + cluster.name);
  const bool tokens = spec.gpt() != nullptr;
  std::printf("%s on %s (%d devices): global batch %lld%s\n", spec.name().c_str(), cluster.name.c_str(), hw.devices(),
              static_cast<long long>(o.batch), tokens ? (", seq " + std::to_string(o.seq)).c_str() : "");
  std::printf("%-48s %10s %11s %6s %11s %7s %6s %14s\n", "layout", "step", tokens ? "tokens/s" : "images/s", "MFU",
              "mem/rank", "bubble", "comm", "TFLOP/s/device");
  std::printf("%-48s %10s %11s %5.1f%% %11s %6.1f%% %5.1f%% %14.1f\n", p.layout.describe().c_str(),
              seconds_text(p.step_s).c_str(), rate_text(tokens ? p.tokens_per_s : p.samples_per_s).c_str(), 100 * p.mfu,
              train::format_bytes(p.peak_bytes).c_str(), 100 * p.bubble, 100 * p.comm_share,
              p.flops_per_step / p.step_s / l.world() / 1e12);
  std::printf("memory: %s per %s against %s: %s\n", train::format_bytes(need).c_str(), cluster.cpu() ? "node" : "device",
              train::format_bytes(hw.memory_bytes).c_str(), need <= hw.memory_bytes ? "fits" : "does NOT fit");
  std::printf("step: compute %s (tensor-parallel %s), exposed data-parallel %s, optimizer %s\n",
              seconds_text(p.compute_s).c_str(), seconds_text(p.tp_comm_s).c_str(), seconds_text(p.dp_comm_s).c_str(),
              seconds_text(p.optimizer_s).c_str());
  if (a.ops) {
    std::printf("the first stage's ops on its first rank (one micro-batch of %lld samples):\n",
                static_cast<long long>(p.layout.batch / p.layout.dp / p.layout.microbatches));
    std::printf("%-32s %-16s %12s %12s %12s\n", "op", "priced as", "forward", "backward", "collectives");
    double f = 0, b = 0, c = 0;
    for (const plan::Prediction::OpTime& t : p.ops) {
      std::printf("%-32s %-16s %12s %12s %12s\n", t.stage_op.c_str(), t.kernel.c_str(), seconds_text(t.fwd_s).c_str(),
                  seconds_text(t.bwd_s).c_str(), seconds_text(t.comm_s).c_str());
      f += t.fwd_s, b += t.bwd_s, c += t.comm_s;
    }
    std::printf("%-32s %-16s %12s %12s %12s\n", "total", "", seconds_text(f).c_str(), seconds_text(b).c_str(),
                seconds_text(c).c_str());
  }
  if (!a.svg.empty()) std::printf("swimlane: %s\n", a.svg.c_str());
  if (hooks.on_plan_rows) hooks.on_plan_rows({plan_row(1, p, spec, a, cluster.cpu())});
}

// ---- --goodput ----

// The noise scale --goodput ranks with, and where it came from (for the header line).
std::pair<double, std::string> goodput_noise_scale(const PlanArgs& a) {
  if (a.noise_from.empty()) return {a.noise_scale, "given"};
  std::optional<train::MeasuredNoiseScale> m;
  try {
    m = train::last_noise_scale(a.noise_from);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--noise-from: ") + e.what());
  }
  if (!m)
    throw UsageError("--noise-from " + a.noise_from +
                     " has no grad_noise_scale: train writes it at --dp 2 or more (not with --exact-sums, a GPT "
                     "at --pp above 1, or an image model without --batch-norm local) once its averages define a "
                     "scale; give the metrics of such a run or --noise-scale B_NOISE");
  if (!(m->value > 0))
    throw UsageError("--noise-from " + a.noise_from + ": its last grad_noise_scale (step " + std::to_string(m->step) +
                     ") is " + fmt("%g", m->value) + ", not above 0; give --noise-scale B_NOISE");
  std::string from = "last grad_noise_scale of ";
  from += a.noise_from;
  from += ", step ";
  from += std::to_string(m->step);
  return {m->value, from};
}

// One candidate batch's prediction: `layout` at batch b, or the fastest layout that fits at b;
// why not, when neither fits or the layout cannot take b.
std::optional<plan::Prediction> predict_at(const PlanArgs& a, const model::ModelSpec& spec, const plan::Cluster& cluster,
                                           const plan::Cluster& search_cluster, plan::SearchOptions o, int64_t b,
                                           std::string& why) {
  const plan::Hardware& hw = cluster.hardware;
  o.batch = b;
  if (a.layout.empty()) {
    const plan::SearchResult r = plan::search_layouts(spec, search_cluster, o);
    if (r.ranked.empty()) {
      why = plan::advise(spec, search_cluster, o, r);
      return std::nullopt;
    }
    return plan::predict(spec, r.ranked.front().layout, search_cluster.hardware);
  }
  plan::Layout l = parse_layout(a.layout);
  l.batch = b, l.seq = o.seq, l.optimizer_state = o.optimizer_state;
  if (l.world() > hw.devices())
    throw UsageError("--layout " + a.layout + " needs " + std::to_string(l.world()) + " devices; " + cluster.name +
                     " has " + std::to_string(hw.devices()));
  if (cluster.cpu()) l.threads = std::max(1, hw.cores / std::max(1, l.world()));
  try {
    plan::Prediction p = plan::predict(spec, l, hw);
    const double need = plan::memory_need(p.memory, p.layout, hw);
    if (need <= hw.memory_bytes) return p;
    why = "it needs " + train::format_bytes(need) + " of " + train::format_bytes(hw.memory_bytes);
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  return std::nullopt;
}

void run_goodput(const PlanArgs& a, const model::ModelSpec& spec, const plan::Cluster& cluster,
                 const plan::SearchOptions& o, const InProcessHooks& hooks) {
  const auto [noise, source] = goodput_noise_scale(a);
  const int64_t max = a.max_batch > 0 ? a.max_batch : kGoodputSpan * o.batch;
  if (max < 2 * o.batch)
    throw UsageError("--max-batch " + std::to_string(max) + " leaves no batch to compare with --global-batch " +
                     std::to_string(o.batch) + "; give at least " + std::to_string(2 * o.batch));
  plan::Cluster search_cluster = cluster;  // as the search without --goodput: no more ranks than cores
  if (cluster.cpu() && !a.oversubscribe)
    search_cluster.hardware.devices_per_node =
        std::max(1, cluster.hardware.cores / std::max(1, cluster.hardware.nodes));
  std::fprintf(stderr, "meshtrain plan --goodput: %s on %s, noise scale %s (%s)\n", spec.name().c_str(),
               cluster.name.c_str(), fmt("%.4g", noise).c_str(), source.c_str());
  std::vector<plan::Prediction> fit;
  std::vector<std::pair<int64_t, std::string>> left_out;
  for (int64_t b : plan::goodput_batches(o.batch, max)) {
    std::string why;
    if (auto p = predict_at(a, spec, cluster, search_cluster, o, b, why)) fit.push_back(std::move(*p));
    else left_out.emplace_back(b, why);
  }
  if (fit.empty()) {
    const auto& [b, why] = left_out.front();
    throw UsageError(std::string(a.layout.empty() ? "" : "--layout: ") + "no global batch from " +
                     std::to_string(o.batch) + " to " + std::to_string(max) + " can be planned (at " +
                     std::to_string(b) + ": " + why + ")");
  }
  const plan::GoodputRanking r = plan::rank_goodput(std::move(fit), noise, o.batch, train::stat_efficiency);
  const plan::Prediction& best = r.rows[r.best].prediction;
  if (!a.svg.empty()) draw(best, a.svg, spec.name() + " on " + cluster.name);

  const bool tokens = spec.gpt() != nullptr;
  const char* unit = tokens ? "seq/s" : "images/s";
  std::printf("%s on %s: goodput of global batches %lld to %lld%s, %s; noise scale %s %s (%s)\n",
              spec.name().c_str(), cluster.name.c_str(), static_cast<long long>(o.batch), static_cast<long long>(max),
              tokens ? (", seq " + std::to_string(o.seq)).c_str() : "", a.optimizer.c_str(), fmt("%.4g", noise).c_str(),
              tokens ? "sequences" : "images", source.c_str());
  std::printf("efficiency E(B) = (B_noise + %lld) / (B_noise + B) against global batch %lld; goodput = %s x E(B)\n\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.batch), unit);
  std::printf("   %7s  %-48s %10s %11s %10s %11s\n", "batch", "layout", "step", unit, "efficiency", "goodput");
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const plan::GoodputRow& x = r.rows[i];
    std::printf("%s %7lld  %-48s %10s %11.1f %10.4f %11.1f\n", i == r.best ? " *" : "  ",
                static_cast<long long>(x.batch()), x.prediction.layout.describe().c_str(),
                seconds_text(x.prediction.step_s).c_str(), x.prediction.samples_per_s, x.efficiency, x.goodput);
  }
  for (const auto& [b, why] : left_out)
    std::printf("   %7lld  not planned: %s\n", static_cast<long long>(b), why.c_str());
  std::printf("\nbest goodput (*): global batch %lld, %.1f %s of %.1f at efficiency %.4f\n",
              static_cast<long long>(r.rows[r.best].batch()), r.rows[r.best].goodput, unit,
              best.samples_per_s, r.rows[r.best].efficiency);
  std::printf("best as train flags: %s\n", train_flags(best.layout, spec, a, cluster.cpu()).c_str());
  if (!a.svg.empty()) std::printf("swimlane: %s\n", a.svg.c_str());
  if (hooks.on_plan_rows) {  // by batch, as the table; `rank` the place by goodput (1: the marked row)
    std::vector<size_t> order(r.rows.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return r.rows[x].goodput > r.rows[y].goodput; });
    std::vector<size_t> place(order.size());
    for (size_t k = 0; k < order.size(); ++k) place[order[k]] = k + 1;
    std::vector<nlohmann::ordered_json> rows;
    for (size_t i = 0; i < r.rows.size(); ++i) {
      nlohmann::ordered_json row = plan_row(place[i], r.rows[i].prediction, spec, a, cluster.cpu());
      row["noise_scale"] = noise;
      row["stat_efficiency"] = r.rows[i].efficiency;
      row["goodput"] = r.rows[i].goodput;
      row["best"] = i == r.best;
      rows.push_back(std::move(row));
    }
    hooks.on_plan_rows(std::move(rows));
  }
}

void run_plan(const PlanArgs& a, const InProcessHooks& hooks) {
  // ---- the inputs, refused in words ----
  if (!a.cluster.empty() && !a.machine.empty())
    throw UsageError("plan takes one of --cluster FILE and --machine FILE, not both; a cluster file names its machine "
                     "file itself");
  if (a.cluster.empty() && a.machine.empty())
    throw UsageError("plan needs the hardware to plan for: --machine FILE.json (this machine: meshtrain calibrate --out "
                     "FILE.json writes it) or --cluster FILE.json (examples/clusters/; docs/planner.md lists the fields)");
  const std::string hardware_flag = a.machine.empty() ? "--cluster" : "--machine";
  const std::string hardware_file = a.machine.empty() ? a.cluster : a.machine;
  if (a.model.empty() == a.config.empty()) throw UsageError("plan needs one of --model NAME or --config FILE");
  if (a.batch < 1) throw UsageError("plan needs --global-batch B, the samples of one step (at least 1)");
  if (!a.goodput) {
    for (const auto& [given, flag] : {std::pair{a.noise_scale >= 0, "--noise-scale"}, {!a.noise_from.empty(), "--noise-from"},
                                      {a.max_batch > 0, "--max-batch"}})
      if (given)
        throw UsageError(std::string(flag) + " is for ranking global batches by goodput; add --goodput or drop " + flag);
  } else if ((a.noise_scale >= 0) == !a.noise_from.empty()) {
    throw UsageError(a.noise_from.empty()
                         ? "plan --goodput needs the gradient noise scale: --noise-scale B_NOISE (samples) or "
                           "--noise-from METRICS.jsonl (train --dp 2 or more --metrics FILE writes grad_noise_scale)"
                         : "plan --goodput takes one of --noise-scale and --noise-from, not both");
  }
  std::shared_ptr<const model::ModelSpec> spec;
  plan::Cluster cluster;
  try {
    spec = a.model.empty() ? model::model_spec_from_file(a.config) : model::model_spec(a.model);
    cluster = a.machine.empty() ? plan::read_cluster_or_machine_file(a.cluster) : plan::read_machine_as_cluster(a.machine);
    train::PathPlan paths(a.overwrite);
    paths.input_file(hardware_flag, hardware_file);
    paths.input_file("--config", a.config);
    paths.input_file("--noise-from", a.noise_from);
    if (cluster.machine_path != hardware_file) paths.input_file("the cluster's machine file", cluster.machine_path);
    paths.output_file("--svg", a.svg, train::OutputKind::svg);
    paths.check();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  plan::SearchOptions o;
  o.batch = a.batch;
  o.optimizer_state = a.optimizer == "sgd" ? 1 : 2;  // SGD's momentum (0.9 by default); AdamW and LAMB two moments
  if (const model::GPTConfig* g = spec->gpt()) {
    o.seq = a.seq > 0 ? a.seq : g->seq;
    if (o.seq > g->block_size)
      throw UsageError("--seq " + std::to_string(o.seq) + " is more than " + spec->name() + "'s " +
                       std::to_string(g->block_size) + " positions (block_size); give at most that");
  } else if (a.seq > 1) {
    throw UsageError(spec->name() + " is an image model: --seq is the sequence length of token models; drop it");
  }

  if (a.devices > 0) {  // fewer devices than the cluster file holds: whole nodes of it
    plan::Hardware& h = cluster.hardware;
    if (a.devices > h.devices())
      throw UsageError("--devices " + std::to_string(a.devices) + " is more than the " + std::to_string(h.devices()) +
                       " devices of " + hardware_file);
    if (a.devices % h.devices_per_node != 0 && a.devices > h.devices_per_node)
      throw UsageError("--devices " + std::to_string(a.devices) + " is not a whole number of nodes of " +
                       std::to_string(h.devices_per_node) + "; give a multiple of it");
    if (cluster.cpu()) h.cores = h.cores / h.nodes * static_cast<int>(std::max<int64_t>(1, a.devices / h.devices_per_node));
    if (a.devices < h.devices_per_node) h.devices_per_node = static_cast<int>(a.devices), h.nodes = 1;
    else h.nodes = static_cast<int>(a.devices / h.devices_per_node);
  }
  if (a.ops && a.layout.empty())
    throw UsageError("--ops prints the ops of one layout: give it with --layout \"dp=1 tp=1 pp=1 m=1\"");
  if (a.goodput) {
    run_goodput(a, *spec, cluster, o, hooks);
    return;
  }
  if (!a.layout.empty()) {
    predict_one(a, *spec, cluster, o, hooks);
    return;
  }
  // A CPU cluster: ranks beyond the cores add the same work and the hand-overs of ranks taking
  // turns, which the cost model counts but underestimates (docs/benchmarks.md, "The planner");
  // they are tried only when asked for.
  if (cluster.cpu() && !a.oversubscribe)
    cluster.hardware.devices_per_node = std::max(1, cluster.hardware.cores / std::max(1, cluster.hardware.nodes));
  // ---- the search ----
  const plan::Hardware& hw = cluster.hardware;
  std::fprintf(stderr, "meshtrain plan: %s on %s (%d node%s x %d %s%s)\n", spec->name().c_str(), cluster.name.c_str(),
               hw.nodes, hw.nodes == 1 ? "" : "s", hw.devices_per_node, cluster.cpu() ? "ranks" : "devices",
               cluster.cpu() ? (" as threads on " + std::to_string(hw.cores) + " cores").c_str() : "");
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  double last_line = 0;
  const plan::SearchResult r = plan::search_layouts(*spec, cluster, o, [&](int64_t done, int64_t total) {
    const double t = elapsed();
    if (t < 1 || t - last_line < 1) return;
    last_line = t;
    std::fprintf(stderr, "plan: predicted %lld of %lld layouts (%.0f%%, %.0f s)\n", static_cast<long long>(done),
                 static_cast<long long>(total), 100.0 * static_cast<double>(done) / static_cast<double>(total), t);
    std::fflush(stderr);
  });
  const double took = elapsed();
  if (r.ranked.empty()) throw UsageError(plan::advise(*spec, cluster, o, r));

  // ---- the report: the best layout drawn first, so a failed write leaves no half report ----
  plan::Prediction best = plan::predict(*spec, r.ranked.front().layout, hw);
  if (!a.svg.empty()) draw(best, a.svg, spec->name() + " on " + cluster.name);
  const bool tokens = spec->gpt() != nullptr;
  std::printf("%s on %s: global batch %lld%s, %s; %s memory %s\n", spec->name().c_str(), cluster.name.c_str(),
              static_cast<long long>(o.batch), tokens ? (", seq " + std::to_string(o.seq)).c_str() : "",
              a.optimizer.c_str(), cluster.cpu() ? "node" : "device",
              train::format_bytes(hw.memory_bytes).c_str());
  std::printf("tried %lld layouts in %.1f s: %lld refused by the cost model, %lld too big for memory, %lld with "
              "recomputation that fit without it, %zu ranked\n\n",
              static_cast<long long>(r.tried), took, static_cast<long long>(r.refused), static_cast<long long>(r.too_big),
              static_cast<long long>(r.dominated), r.ranked.size());
  std::printf("%3s  %-48s %10s %11s %6s %11s %7s %6s\n", "#", "layout", "step", tokens ? "tokens/s" : "images/s", "MFU",
              "mem/rank", "bubble", "comm");
  const size_t k = std::min(r.ranked.size(), static_cast<size_t>(a.top));
  for (size_t i = 0; i < k; ++i) {
    const plan::Prediction& p = r.ranked[i];
    std::printf("%3zu  %-48s %10s %11s %5.1f%% %11s %6.1f%% %5.1f%%\n", i + 1, p.layout.describe().c_str(),
                seconds_text(p.step_s).c_str(), rate_text(tokens ? p.tokens_per_s : p.samples_per_s).c_str(),
                100 * p.mfu, train::format_bytes(p.peak_bytes).c_str(), 100 * p.bubble, 100 * p.comm_share);
  }
  std::printf("\nbest as train flags: %s\n", train_flags(best.layout, *spec, a, cluster.cpu()).c_str());
  if (!a.svg.empty()) std::printf("swimlane: %s\n", a.svg.c_str());
  if (hooks.on_plan_rows) {
    std::vector<nlohmann::ordered_json> rows;
    for (size_t i = 0; i < k; ++i) rows.push_back(plan_row(i + 1, r.ranked[i], *spec, a, cluster.cpu()));
    hooks.on_plan_rows(std::move(rows));
  }
}

}  // namespace

void add_plan_command(CLI::App& app, std::shared_ptr<const InProcessHooks> hooks) {
  if (!hooks) hooks = std::make_shared<const InProcessHooks>();
  auto a = std::make_shared<PlanArgs>();
  CLI::App* c = app.add_subcommand("plan", "Rank the layouts of a model on a cluster by predicted step time");
  c->add_option("--model", a->model, "A named model (gpt-tiny, gpt-small, gpt2-124m, cnn-small, ...)");
  c->add_option("--config", a->config, "A model config file (JSON), as train reads it")->check(non_empty_path());
  c->add_option("--cluster", a->cluster,
                 "The cluster file (JSON; examples/clusters/, docs/planner.md), or a machine file as one node of it")
      ->check(non_empty_path());
  c->add_option("--machine", a->machine,
                 "A machine file meshtrain calibrate wrote: plan for one node of that machine (all its cores and memory)")
      ->check(non_empty_path());
  c->add_option("--global-batch", a->batch, "Samples per step, all data-parallel ranks together")
      ->check(integer<int64_t>(1));
  c->add_option("--seq", a->seq, "Sequence length (default: the model's)")->check(integer<int64_t>(1));
  c->add_option("--top", a->top, "How many layouts to print")->check(integer<int>(1))->capture_default_str();
  c->add_option("--svg", a->svg, "Draw the best layout's predicted step into this SVG file")->check(non_empty_path());
  c->add_option("--optimizer", a->optimizer, "adamw, sgd or lamb (its state's memory)")
      ->check(CLI::IsMember({"adamw", "sgd", "lamb"}))
      ->capture_default_str();
  c->add_flag("--overwrite", a->overwrite, "Let --svg replace an existing file meshtrain did not write");
  c->add_option("--layout", a->layout,
                 "Predict this one layout instead of searching: \"dp=4 tp=8 pp=12 m=128 1f1b recompute\" "
                 "(also zero=N, v=N chunks, sp)");
  c->add_flag("--ops", a->ops, "With --layout: print every op of the first stage and its predicted forward, backward "
              "and collective time");
  c->add_option("--devices", a->devices, "Plan for this many of the cluster's devices (whole nodes)")
      ->check(integer<int64_t>(1));
  c->add_flag("--oversubscribe", a->oversubscribe,
              "A CPU cluster: also try more ranks than cores (threads taking turns on them)");
  c->add_flag("--goodput", a->goodput,
              "Rank global batches (--global-batch B, 2B, 4B, ... up to --max-batch) by predicted goodput: "
              "samples/s x statistical efficiency for the measured noise scale");
  c->add_option("--noise-scale", a->noise_scale, "--goodput: the gradient noise scale B_noise, in samples")
      ->check(number(0, 1e15, false));
  c->add_option("--noise-from", a->noise_from,
                "--goodput: take the noise scale from this metrics file (its last grad_noise_scale)")
      ->check(non_empty_path());
  c->add_option("--max-batch", a->max_batch, "--goodput: the largest global batch to try (default: 16 x --global-batch)")
      ->check(integer<int64_t>(1));
  c->callback([a, hooks] { run_plan(*a, *hooks); });
}

}  // namespace meshtrain::cli
