// `meshtrain model show MODEL`: the layer table a user checks before training a graph (a model
// file or a named image model): each layer's output shape, parameters and forward FLOPs, each
// pipeline unit's saved activations per sample (measured on the built unit), totals; and under
// a layout how each layer is split and what communication the layout inserts.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/graph.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/parallel/branch/cnn_branch.h"
#include "meshtrain/parallel/spatial/cnn_spatial.h"
#include "meshtrain/parallel/tensor/cnn_tp.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/pipeline/partition.h"
#include "meshtrain/plan/cost.h"
#include "meshtrain/train/layout.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::cli {
namespace {

struct ShowOptions {
  std::string model;
  int tp = 1, spatial = 1, branch = 1, pp = 1;
  int64_t batch = 0;
};

std::string shape_text(const Shape& s) {
  std::string t = "(N";
  for (int64_t d : s) t += ", " + std::to_string(d);
  return t + ")";
}

std::string bytes_text(double b) {
  char buf[32];
  if (b >= 1 << 20) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1 << 20));
  else if (b >= 1 << 10) std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string op_text(const model::GraphLayer& l) {
  std::string t = model::op_name(l.op);
  const bool pool = l.op == model::Op::maxpool2d || l.op == model::Op::avgpool2d;
  if (l.op == model::Op::conv2d || pool) {
    t += " " + std::to_string(l.kernel) + "x" + std::to_string(l.kernel);
    if (l.stride != 1 && !(pool && l.stride == l.kernel)) t += " s" + std::to_string(l.stride);
    if (l.padding) t += " p" + std::to_string(l.padding);
  }
  if (l.op == model::Op::gelu && !l.tanh) t += " (erf)";
  if (l.op == model::Op::dropout) {
    char p[32];
    std::snprintf(p, sizeof p, " p=%g", l.p);
    t += p;
  }
  return t;
}

// What --tp N does to layer i, and the bytes per sample one rank sends for it (forward and
// backward; parallel/tensor/cnn_tp.h's table): a convolution pair splits filters then channels, an
// unpaired convolution splits filters and gathers its output where that pays
// (model::filter_split_pays; otherwise it is replicated); a linear pair splits columns then
// rows; per-channel layers between a pair act on their rank's channels; everything else is
// replicated.
std::pair<std::string, double> tp_split(const model::Graph& g, const model::ChannelSplits& s,
                                        const std::vector<Shape>& shapes, const Shape& image, size_t i, int p) {
  const model::GraphLayer& l = g.layers[i];
  const double share = (p - 1.0) / p;
  auto numel = [](const Shape& x) { return static_cast<double>(shape_numel(x)); };
  const Shape& in = l.from[0] < 0 ? image : shapes[static_cast<size_t>(l.from[0])];
  if (l.op == model::Op::conv2d) {
    const double dx = l.from[0] >= 0 ? 2 * share * numel(in) * 4 : 0;  // backward: dx's all-reduce
    if (s.in_split[i]) return {"channels/" + std::to_string(p) + ", all-reduce y", 2 * share * numel(shapes[i]) * 4};
    if (s.out_split[i]) return {"filters/" + std::to_string(p) + (dx > 0 ? ", all-reduce dx" : ""), dx};
    if (!model::filter_split_pays(in[0], l.out_channels, l.kernel, l.stride, l.from[0] >= 0, p))
      return {"replicated (a filter split would move more than it saves)", 0};
    return {"filters/" + std::to_string(p) + ", all-gather y" + (dx > 0 ? ", all-reduce dx" : ""),
            share * numel(shapes[i]) * 4 + dx};
  }
  if (l.op == model::Op::linear) {
    // Megatron's pair: column (its input's gradient all-reduced), then row (its output all-reduced).
    if (s.out_split[i]) return {"columns/" + std::to_string(p) + ", all-reduce dx", 2 * share * numel(in) * 4};
    if (s.in_split[i]) return {"rows/" + std::to_string(p) + ", all-reduce y", 2 * share * numel(shapes[i]) * 4};
    return {"replicated (whole on every rank)", 0};
  }
  if (s.in_split[i]) return {(shapes[i].size() == 1 ? "features/" : "channels/") + std::to_string(p), 0};
  return {"replicated", 0};
}

// Each layer's parameter elements: the model's parameters by the longest layer name that
// prefixes theirs (h.0.attn.c_attn.weight: h.0.attn).
std::vector<double> params_by_layer(const model::Graph& g, const model::ModelSpec& spec) {
  std::vector<double> out(g.layers.size(), 0);
  for (const auto& [name, shape] : spec.param_shapes()) {
    size_t best = g.layers.size(), len = 0;
    for (size_t i = 0; i < g.layers.size(); ++i)
      if (g.layers[i].name.size() > len && name.rfind(g.layers[i].name + ".", 0) == 0) best = i, len = g.layers[i].name.size();
    if (best < g.layers.size()) out[best] += static_cast<double>(shape_numel(shape));
  }
  return out;
}

// What --tp N does to a transformer's layer (Megatron's layout, parallel/tensor/tensor_parallel.h),
// and the bytes one rank sends for it a sample of T tokens of width C, forward and backward: each
// all-reduce of n elements is a ring's, 2 (p - 1) / p n of them sent. The embedding's lookup sums
// its vocabulary shards (y); attention all-reduces its c_proj's output (y) and its c_attn's input
// gradient (dx); the MLP's c_fc its input gradient, its c_proj its output; the tied head's
// cross-entropy all-reduces each token's maximum (float) and its sum of exponentials and target
// logit (two doubles), and its input gradient (dx).
std::pair<std::string, double> tp_token_split(const model::GraphLayer& l, int p, int64_t T, int64_t C) {
  const std::string n = std::to_string(p);
  const double ring = 2.0 * (p - 1) / p, tc = static_cast<double>(T * C) * 4;
  switch (l.op) {
    case model::Op::embedding: return {"vocabulary rows/" + n + ", all-reduce y", ring * tc};
    case model::Op::causal_self_attention:
      return {"heads/" + n + ": c_attn columns, c_proj rows, all-reduce y and dx", 2 * ring * tc};
    case model::Op::linear:
      if (l.tied >= 0)
        return {"vocabulary/" + n + " (the embedding's rows), cross-entropy over the shards, all-reduce dx",
                ring * (tc + static_cast<double>(T) * (4 + 2 * 8))};
      return {l.name.ends_with(".c_fc") ? "columns/" + n + ", all-reduce dx" : "rows/" + n + ", all-reduce y", ring * tc};
    case model::Op::gelu: return {"features/" + n, 0};
    default: return {"replicated", 0};
  }
}

// A token model's table: each layer's block (its pipeline unit), the stage train puts it on,
// its output, parameters and forward FLOPs.
void show_tokens(const ShowOptions& o, const model::Graph& g, const model::ModelSpec& spec) {
  if (o.spatial > 1 || o.branch > 1)
    throw UsageError(std::string(o.spatial > 1 ? "--spatial" : "--branch-parallel") + " splits image models; " + g.name +
                     " reads tokens: give --tp or --pp");
  const model::GPTConfig& cfg = *spec.gpt();
  try {
    if (o.tp > 1) parallel::validate_tp(cfg, o.tp, parallel::TPOptions{}, cfg.seq);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (o.pp > cfg.n_layer)
    throw UsageError(g.name + " has " + std::to_string(cfg.n_layer) + " blocks to cut between pipeline stages, fewer "
                     "than the " + std::to_string(o.pp) + " asked for; lower --pp");
  const std::vector<Shape> shapes = model::infer_shapes(g, {cfg.seq});
  // Block of each layer: -1 the embeddings, n_layer ln_f and the head; a long skip's sum is its
  // block's input.
  std::vector<int64_t> block(g.layers.size(), -1);
  int64_t b = -1;
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const std::string& name = g.layers[i].name;
    if (name == "ln_f") b = cfg.n_layer;
    else if (name.starts_with("h.") && name.ends_with(".ln_1")) b = std::stoll(name.substr(2));
    block[i] = b;
  }
  for (size_t i = 1; i + 1 < g.layers.size(); ++i)  // a sum after a block's last sum: the skip
    if (g.layers[i].op == model::Op::add && g.layers[i - 1].op == model::Op::add && block[i + 1] < cfg.n_layer)
      block[i] = block[i + 1];
  std::vector<int> stage_of(static_cast<size_t>(cfg.n_layer) + 2, 0);  // by block + 1
  if (o.pp > 1) {
    train::TrainOptions t;
    t.pp = o.pp;
    t.seq = cfg.seq;
    const auto spans = train::stage_layers(t, cfg);
    for (size_t st = 0; st < spans.size(); ++st)
      for (int64_t u = spans[st].first; u < spans[st].end; ++u) stage_of[static_cast<size_t>(u + 1)] = static_cast<int>(st);
    stage_of.back() = o.pp - 1;
  }
  const std::vector<double> layer_params = params_by_layer(g, spec);
  std::printf("%s: tokens (%lld) of a vocabulary of %lld; %zu layers in %lld blocks\n", g.name.c_str(),
              static_cast<long long>(cfg.seq), static_cast<long long>(cfg.vocab_size), g.layers.size(),
              static_cast<long long>(cfg.n_layer));
  const std::string layout_head = o.tp > 1 ? "--tp " + std::to_string(o.tp) + ": split, inserted collectives" : "";
  std::printf("%-5s %-5s %-24s %-22s %-18s %11s %10s  %s\n", "block", o.pp > 1 ? "stage" : "", "layer", "op", "output",
              "parameters", "fwd MFLOP", layout_head.c_str());
  double params = 0, flops = 0, tp_bytes = 0;
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const model::GraphLayer& l = g.layers[i];
    const bool first = i == 0 || block[i] != block[i - 1];
    std::string col;
    if (o.tp > 1) {
      auto [what, bytes] = tp_token_split(l, o.tp, cfg.seq, cfg.n_embd);
      tp_bytes += bytes;
      col = what + (bytes > 0 ? " (" + bytes_text(bytes) + ")" : "");
    }
    const double f = model::forward_flops(g, shapes, {cfg.seq}, i);
    flops += f, params += layer_params[i];
    const std::string unit = block[i] < 0 ? "emb" : block[i] == cfg.n_layer ? "head" : std::to_string(block[i]);
    std::printf("%-5s %-5s %-24s %-22s %-18s %11.0f %10.3f  %s\n", first ? unit.c_str() : "",
                first && o.pp > 1 ? std::to_string(stage_of[static_cast<size_t>(block[i] + 1)]).c_str() : "",
                l.name.c_str(), model::op_name(l.op), shape_text(shapes[i]).c_str(), layer_params[i], f / 1e6,
                col.c_str());
  }
  std::printf("%-5s %-5s %-24s %-22s %-18s %11.0f %10.3f\n", "", "", "total", "", "", params, flops / 1e6);
  std::printf("forward + backward: %.3f MFLOP a sample (3 x forward); activations saved for backward: %.2f MiB a "
              "sample (the planner's count)\n",
              3 * flops / 1e6, cfg.activation_bytes(1, cfg.seq) / (1 << 20));
  if (o.tp > 1) {
    const int64_t rows = o.batch > 0 ? o.batch : cfg.batch;
    std::printf("--tp %d: one rank sends %.0f bytes (%s) a micro-batch of %lld samples of %lld tokens, forward and "
                "backward (%s a sample: the column's sum), and the gradient norm's all-reduce (one double) a step; "
                "without --sequence-parallel\n",
                o.tp, tp_bytes * static_cast<double>(rows), bytes_text(tp_bytes * static_cast<double>(rows)).c_str(),
                static_cast<long long>(rows), static_cast<long long>(cfg.seq), bytes_text(tp_bytes).c_str());
  }
  if (o.pp > 1) std::printf("--pp %d: blocks cut between stages by their FLOPs, as train cuts them\n", o.pp);
}

void show(const ShowOptions& o) {
  std::shared_ptr<const model::ModelSpec> spec;
  try {
    spec = model::model_spec(o.model);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if ((o.tp > 1) + (o.spatial > 1) + (o.branch > 1) > 1)
    throw UsageError("--tp, --spatial and --branch-parallel each split the layers over the same intra-layer ranks; "
                     "give one of them");
  if (spec->gpt()) {
    std::shared_ptr<const model::Graph> g = model::named_graph(o.model);
    if (!g && o.model.ends_with(".json")) {
      try {
        auto read = model::read_graph_file(o.model);
        if (read.tokens()) g = std::make_shared<const model::Graph>(std::move(read));
      } catch (const std::invalid_argument&) {
      }
    }
    if (!g)
      throw UsageError(o.model + " is a GPT config (n_layer, n_embd, ...), not a layer graph; `model show` prints the "
                       "layers of model files and named models (plan --config " + o.model + " predicts its layouts)");
    return show_tokens(o, *g, *spec);
  }
  const model::CNNConfig* cfg = spec->cnn();
  try {
    if (o.tp > 1) parallel::validate_cnn_tp(*cfg, o.tp);
    if (o.spatial > 1) parallel::validate_cnn_spatial(*cfg, o.spatial);
    if (o.branch > 1) parallel::validate_cnn_branch(*cfg, o.branch, "flops");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const model::Graph& g = *cfg->graph;
  const Shape image{cfg->channels, cfg->height, cfg->width};
  const std::vector<Shape> shapes = model::infer_shapes(g, image);
  const std::vector<int> starts = model::unit_starts(g);
  const model::ChannelSplits splits = model::channel_splits(g);
  // Each unit's saved activations per sample: the planner's measurement of the built unit
  // (what its forward keeps at 2 samples less at 1).
  std::vector<double> saved;
  {
    const model::StageSpec whole{0, -1, true, true};
    const auto at1 = spec->op_costs(whole, model::CostQuery(1));
    const auto at2 = spec->op_costs(whole, model::CostQuery(2));
    // One op per layer (model/cnn_cost.h); a unit's saved bytes sit on its last op.
    for (size_t k = 0; k < at1.size(); ++k)
      if (at1[k].unit_end) saved.push_back(at2[k].saved_bytes - at1[k].saved_bytes);
  }
  // Pipeline stages: the one balancer, which train and plan run (by the units' FLOPs).
  std::vector<int> stage_of(starts.size(), 0);
  std::vector<int64_t> first_unit;  // of each stage
  model::SkipPortals portals;
  if (o.pp > 1) {
    const int64_t units = static_cast<int64_t>(starts.size()) - 1;
    if (units < o.pp)
      throw UsageError(g.name + " has " + std::to_string(units) + " units to cut between pipeline stages, fewer than "
                       "the " + std::to_string(o.pp) + " asked for; lower --pp");
    plan::Layout l;
    l.pp = o.pp;
    const auto spans = plan::balance_stages(*spec, l);
    for (size_t st = 0; st < spans.size(); ++st) {
      first_unit.push_back(spans[st].first);
      for (int64_t u = spans[st].first; u < spans[st].end; ++u) stage_of[static_cast<size_t>(u)] = static_cast<int>(st);
    }
    try {
      portals = model::skip_portals(g, shapes, first_unit);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }

  double params = 0, flops = 0, tp_bytes = 0;
  const std::vector<double> layer_params = params_by_layer(g, *spec);
  std::printf("%s: images (%lld, %lld, %lld), %lld classes; %zu layers in %zu pipeline units\n", g.name.c_str(),
              static_cast<long long>(image[0]), static_cast<long long>(image[1]), static_cast<long long>(image[2]),
              static_cast<long long>(g.classes), g.layers.size(), starts.size() - 1);
  std::string layout_head = o.tp > 1        ? "--tp " + std::to_string(o.tp) + ": split, inserted collectives (sent/sample)"
                            : o.spatial > 1 ? "--spatial " + std::to_string(o.spatial) + ": row bands"
                                            : "";
  std::printf("%-4s %-5s %-28s %-16s %-18s %11s %10s %12s  %s\n", "unit", o.pp > 1 ? "stage" : "", "layer", "op",
              "output", "parameters", "fwd MFLOP", "saved/sample", layout_head.c_str());
  size_t unit = 0;
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const model::GraphLayer& l = g.layers[i];
    const bool first_of_unit = static_cast<int>(i) == starts[unit];
    const double f = model::forward_flops(g, shapes, image, i);
    flops += f, params += layer_params[i];
    std::string col;
    if (o.tp > 1) {
      auto [what, bytes] = tp_split(g, splits, shapes, image, i, o.tp);
      tp_bytes += bytes;
      col = what + (bytes > 0 ? " (" + bytes_text(bytes) + ")" : "");
    } else if (o.spatial > 1) {
      const bool window =
          (l.op == model::Op::conv2d || l.op == model::Op::maxpool2d || l.op == model::Op::avgpool2d) && l.kernel > 1;
      col = shapes[i].size() == 3 ? "bands of ~" + std::to_string((shapes[i][1] + o.spatial - 1) / o.spatial) + " rows" +
                                        (window ? ", halo " + std::to_string(l.kernel / 2) + " row(s) each side" : "")
            : l.op == model::Op::flatten ? "gathers the whole map first"
                                         : "replicated";
    }
    std::printf("%-4s %-5s %-28s %-16s %-18s %11.0f %10.3f %12s  %s\n",
                first_of_unit ? std::to_string(unit).c_str() : "",
                first_of_unit && o.pp > 1 ? std::to_string(stage_of[unit]).c_str() : "", l.name.c_str(),
                op_text(l).c_str(), shape_text(shapes[i]).c_str(), layer_params[i], f / 1e6,
                first_of_unit ? bytes_text(saved[unit]).c_str() : "", col.c_str());
    if (static_cast<int>(i) + 1 == starts[unit + 1]) ++unit;
  }
  double saved_total = 0;
  for (double s : saved) saved_total += s;
  std::printf("%-4s %-5s %-28s %-16s %-18s %11.0f %10.3f %12s\n", "", "", "total", "", "", params, flops / 1e6,
              bytes_text(saved_total).c_str());
  std::printf("forward + backward: %.3f MFLOP a sample (3 x forward)\n", 3 * flops / 1e6);
  std::printf("state dict (what PyTorch's module.state_dict() lists; checkpoint convert --to-single writes it):\n");
  for (const model::TorchEntry& e : model::torch_state_dict(*spec))
    std::printf("  %-40s %s%s\n", e.name.c_str(), e.counter ? "() int64" : shape_str(e.shape).c_str(),
                e.transposed ? " (out, in)" : "");
  const int64_t rows = o.batch > 0 ? o.batch : cfg->batch;
  if (o.tp > 1)
    std::printf("--tp %d: one rank sends %.0f bytes (%s) a micro-batch of %lld samples, forward and backward "
                "(%s a sample: the column's sum)\n",
                o.tp, tp_bytes * static_cast<double>(rows), bytes_text(tp_bytes * static_cast<double>(rows)).c_str(),
                static_cast<long long>(rows), bytes_text(tp_bytes).c_str());
  if (o.spatial > 1)
    std::printf("--spatial %d: rank 0 sends %s a micro-batch of %lld samples (halos, their gradients, batch-norm "
                "statistics, partial gradients, pooled sums, the map's gather)\n",
                o.spatial, bytes_text(static_cast<double>(parallel::cnn_spatial_bytes_per_microbatch(*cfg, o.spatial, 0, rows))).c_str(),
                static_cast<long long>(rows));
  if (o.branch > 1) {
    for (const auto& [block, n] : model::cnn_branch_blocks(*cfg))
      std::printf("--branch-parallel %d: block %s, %zu branches placed by FLOPs\n", o.branch, block.c_str(), n);
    std::printf("--branch-parallel %d: rank 0 sends %s a micro-batch of %lld samples\n", o.branch,
                bytes_text(static_cast<double>(parallel::cnn_branch_bytes_per_microbatch(*cfg, o.branch, "flops", rows))).c_str(),
                static_cast<long long>(rows));
  }
  if (o.pp > 1) {
    std::printf("--pp %d: stages cut between units by their FLOPs, as train cuts them\n", o.pp);
    // A residual block cut between stages: its skip goes straight to the stage that reads it.
    for (size_t st = 0; st < portals.to.size(); ++st) {
      if (portals.to[st] < 0) continue;
      const int k = portals.sent[st];
      const std::string from = k < 0 ? "input" : g.layers[static_cast<size_t>(k)].name;
      const int cut = starts[static_cast<size_t>(first_unit[st + 1])];
      std::printf("--pp %d: skip '%s' %s crosses the cut before '%s' as a portal, stage %zu to stage %d\n", o.pp,
                  from.c_str(), shape_text(k < 0 ? image : shapes[static_cast<size_t>(k)]).c_str(),
                  g.layers[static_cast<size_t>(cut)].name.c_str(), st, portals.to[st]);
    }
  }
}

}  // namespace

void add_model_command(CLI::App& app) {
  CLI::App* m = app.add_subcommand("model", "Look at a model: its layers, shapes, parameters and how a layout splits them");
  m->require_subcommand(1);
  auto o = std::make_shared<ShowOptions>();
  CLI::App* s = m->add_subcommand("show", "The layer table of a model file or named image model (docs/models.md)");
  s->add_option("model", o->model, "A model file (a JSON layer graph) or a named image model")->required();
  s->add_option("--tp", o->tp, "Show the filter/channel split over N ranks and its collectives")->check(CLI::Range(1, 1024));
  s->add_option("--spatial", o->spatial, "Show row bands over N ranks")->check(CLI::Range(1, 1024));
  s->add_option("--branch-parallel", o->branch, "Show blocks of parallel branches over N ranks")->check(CLI::Range(1, 1024));
  s->add_option("--pp", o->pp, "Show the pipeline stage of each unit")->check(CLI::Range(1, 1024));
  s->add_option("--batch", o->batch, "Samples a micro-batch for the byte totals (default: the model's batch)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->callback([o] { show(*o); });
}

}  // namespace meshtrain::cli
