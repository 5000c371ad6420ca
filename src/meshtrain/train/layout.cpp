#include "meshtrain/train/layout.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <stdexcept>

#include "meshtrain/model/spec.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/parallel/data/data_parallel.h"

#include "meshtrain/pipeline/passes.h"
#include "meshtrain/plan/cost.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::train {

bool pipedream_reference(const TrainOptions& o) { return o.schedule == "pipedream" && o.pp == 1 && o.chunks > 1; }

pipeline::Schedule make_pipeline_schedule(const TrainOptions& o) {
  if (pipedream_reference(o)) {  // the stages of a pp P run on one rank, each micro-batch through all in turn
    const pipeline::ScheduleShape shape{1, o.microbatches, o.chunks};
    return pipeline::add_send_recv(pipeline::Schedule{"naive", shape, false, pipeline::naive_schedule(shape)});
  }
  const std::string name = o.pp == 1 ? "naive" : o.schedule == "zb" ? "zb-h1" : o.schedule;
  try {
    return pipeline::add_send_recv(pipeline::make_schedule(name, {o.pp, o.microbatches, o.pp == 1 ? 1 : o.chunks}));
  } catch (const std::invalid_argument& e) {  // say which flags made the shape
    throw std::invalid_argument("--schedule " + o.schedule + " with --pp " + std::to_string(o.pp) + ", --microbatches " +
                                std::to_string(o.microbatches) + " and --chunks " + std::to_string(o.chunks) + ": " +
                                e.what());
  }
}

plan::Layout plan_layout(const TrainOptions& o, const std::vector<pipeline::LayerSpan>& spans) {
  plan::Layout l;
  l.dp = o.dp, l.tp = o.tp, l.pp = o.pp, l.microbatches = o.microbatches, l.schedule = o.schedule;
  l.chunks = o.pp == 1 ? 1 : o.chunks;
  l.zero = o.zero, l.recompute = o.recompute, l.sequence_parallel = o.sequence_parallel;
  l.batch = o.batch, l.seq = std::max<int64_t>(1, o.seq), l.threads = std::max(1, o.threads);
  l.bf16 = o.precision == kernels::Precision::bf16;
  l.optimizer_state = static_cast<int>(state_prefixes(o.optim).size());
  l.bucket_bytes = o.bucket_bytes > 0 ? o.bucket_bytes : parallel::kDefaultBucketBytes;
  l.stages = spans;
  l.split = o.intra == IntraSplit::spatial  ? plan::Layout::Split::spatial
            : o.intra == IntraSplit::branch ? plan::Layout::Split::branch
                                            : plan::Layout::Split::tensor;
  l.branch_balance = o.branch_balance;
  l.pad_vocab = o.pad_vocab;
  return l;
}

StageCosts profile_costs(const model::GPTConfig& cfg, int64_t rows, int64_t T, int threads, uint64_t seed) {
  using Clock = std::chrono::steady_clock;
  model::GPTStage whole(cfg, seed, model::StageSpec::whole());
  std::vector<int32_t> tok(rows * T), tgt(rows * T);
  for (int64_t i = 0; i < rows * T; ++i) tok[i] = static_cast<int32_t>((i * 7919) % cfg.vocab_size),
                                        tgt[i] = static_cast<int32_t>((i * 104729 + 1) % cfg.vocab_size);
  // The hooks stamp every block's and the stage's start and end, forward and backward.
  std::map<std::pair<const nn::Module*, int>, Clock::time_point> at;  // (module, 0..3) -> time
  nn::Hooks hooks;
  hooks.pre_forward = [&](const nn::Module* m) { at[{m, 0}] = Clock::now(); };
  hooks.post_forward = [&](const nn::Module* m) { at[{m, 1}] = Clock::now(); };
  hooks.pre_backward = [&](const nn::Module* m) { at[{m, 2}] = Clock::now(); };
  hooks.post_backward = [&](const nn::Module* m) { at[{m, 3}] = Clock::now(); };
  auto s = [&](const nn::Module* m, int a, const nn::Module* n, int b) {
    return std::chrono::duration<double>(at[{n, b}] - at[{m, a}]).count();
  };
  const nn::Module* first = whole.h.front().get();
  const nn::Module* last = whole.h.back().get();
  // Each part's forward and backward time: the least over the timed passes (noise from other
  // work on the machine only adds time).
  const int timed = 3;
  const size_t n = whole.h.size();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> bf(n, inf), bb(n, inf);
  double ef = inf, eb = inf, hf = inf, hb = inf;
  for (int pass = 0; pass <= timed; ++pass) {
    nn::Context ctx(threads);
    ctx.hooks = &hooks;
    float loss = 0;
    whole.forward(ctx, Tensor(), tok.data(), tgt.data(), rows, T, &loss);
    whole.backward(ctx, Tensor(), 1.f);
    if (pass == 0) continue;  // warm-up: first allocations
    ef = std::min(ef, s(&whole, 0, first, 0)), eb = std::min(eb, s(first, 3, &whole, 3));
    hf = std::min(hf, s(last, 1, &whole, 1)), hb = std::min(hb, s(&whole, 2, last, 2));
    for (size_t i = 0; i < n; ++i) {
      const nn::Module* b = whole.h[i].get();
      bf[i] = std::min(bf[i], s(b, 0, b, 1)), bb[i] = std::min(bb[i], s(b, 2, b, 3));
    }
  }
  StageCosts c;
  c.embedding = ef + eb, c.head = hf + hb;
  for (size_t i = 0; i < n; ++i) c.blocks.push_back(bf[i] + bb[i]);
  whole.zero_grad();
  return c;
}

namespace {
// The planner's balancer (plan::balance_stages) is the one that cuts: what `plan` predicts a
// layout with is the split train runs.
plan::Layout by_flops(const TrainOptions& o, int64_t seq) {
  plan::Layout l;
  l.pp = o.pp, l.chunks = o.pp == 1 ? 1 : o.chunks, l.seq = seq;
  return l;
}
}  // namespace

std::vector<pipeline::LayerSpan> stage_layers(const TrainOptions& o, const model::GPTConfig& cfg,
                                              const StageCosts* measured) {
  if (pipedream_reference(o)) {  // cut as a pp P run is
    TrainOptions cut = o;
    cut.pp = o.chunks, cut.chunks = 1;
    return stage_layers(cut, cfg, measured);
  }
  const int chunks = o.pp == 1 ? 1 : o.chunks;
  const int stages = o.pp * chunks;
  const bool by_cost = o.pp_balance.empty() || o.pp_balance == "flops" || o.pp_balance == "profile";
  if (!by_cost) return pipeline::layers_from_counts(o.pp_balance, stages, cfg.n_layer);
  if (chunks > 1) {
    if (cfg.n_layer % stages != 0)
      throw std::invalid_argument("--schedule interleaved with --pp " + std::to_string(o.pp) + " and --chunks " +
                                  std::to_string(chunks) + " needs the model's " + std::to_string(cfg.n_layer) +
                                  " blocks to divide into " + std::to_string(stages) +
                                  " equal stages; change --pp or --chunks");
    return pipeline::equal_layers(cfg.n_layer, stages);
  }
  if (measured) return pipeline::balance_layers(measured->blocks, stages, measured->embedding, measured->head);
  if (cfg.n_layer < stages)
    throw std::invalid_argument("the model has " + std::to_string(cfg.n_layer) + " blocks, fewer than the " +
                                std::to_string(stages) + " pipeline stages; every stage needs at least one block, "
                                "so use --pp (x chunks) of at most " + std::to_string(cfg.n_layer));
  return plan::balance_stages(*model::gpt_spec(cfg), by_flops(o, o.seq > 0 ? o.seq : cfg.seq));
}

std::vector<pipeline::LayerSpan> stage_units(const TrainOptions& o, const model::CNNConfig& cfg) {
  if (pipedream_reference(o)) {  // cut as a pp P run is
    TrainOptions cut = o;
    cut.pp = o.chunks, cut.chunks = 1;
    return stage_units(cut, cfg);
  }
  const int chunks = o.pp == 1 ? 1 : o.chunks;
  const int stages = o.pp * chunks;
  const int64_t units = model::cnn_num_units(cfg);
  if (!o.pp_balance.empty() && o.pp_balance != "flops") return pipeline::layers_from_counts(o.pp_balance, stages, units);
  if (units < stages)
    throw std::invalid_argument(cfg.name + " has " + std::to_string(units) + " units to cut between pipeline stages, "
                                "fewer than the " + std::to_string(stages) + " stages asked for; lower --pp" +
                                std::string(chunks > 1 ? " or --chunks" : ""));
  if (chunks > 1) {
    if (units % stages != 0)
      throw std::invalid_argument("--schedule interleaved needs " + cfg.name + "'s " + std::to_string(units) +
                                  " units to divide into " + std::to_string(stages) + " equal stages; change --pp or --chunks");
    return pipeline::equal_layers(units, stages);
  }
  return plan::balance_stages(*model::cnn_spec(cfg), by_flops(o, 1));
}

std::string stage_counts_at(const model::ModelSpec& spec, const TrainOptions& o) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("--pp-cuts: " + m); };
  if (!o.pp_balance.empty()) bad("--pp-cuts and --pp-balance both place the stages; give one of them");
  if (o.pp < 2) bad("it names the layers pipeline stages begin at; it needs --pp 2 or more");
  const int64_t stages = int64_t{o.pp} * o.chunks, units = spec.num_units();
  std::vector<std::string> names;
  for (size_t at = 0;;) {
    const size_t comma = o.pp_cuts.find(',', at);
    names.push_back(o.pp_cuts.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (static_cast<int64_t>(names.size()) != stages - 1)
    bad("it names " + std::to_string(names.size()) + " layer(s), but " + std::to_string(stages) +
        " stages begin at " + std::to_string(stages - 1) + " layers after the first stage's: give " +
        std::to_string(stages - 1) + " names, comma-separated");
  // Where a stage may begin, by name: the unit it starts.
  std::vector<std::pair<std::string, int64_t>> begins;
  if (const model::GPTConfig* g = spec.gpt()) {
    for (int64_t b = 1; b < g->n_layer; ++b) {
      begins.push_back({"h." + std::to_string(b), b});
      begins.push_back({"h." + std::to_string(b) + ".ln_1", b});
    }
  } else if (spec.cnn() && spec.cnn()->graph) {
    const model::Graph& graph = *spec.cnn()->graph;
    const std::vector<int> starts = model::unit_starts(graph);
    for (size_t u = 1; u + 1 < starts.size(); ++u)
      begins.push_back({graph.layers[static_cast<size_t>(starts[u])].name, static_cast<int64_t>(u)});
  }
  std::vector<int64_t> first{0};
  for (const std::string& name : names) {
    auto it = std::find_if(begins.begin(), begins.end(), [&](const auto& b) { return b.first == name; });
    if (it == begins.end()) {
      std::string some;
      for (size_t k = 0; k < begins.size() && k < 12; ++k) {
        if (k) some += ", ";
        some += begins[k].first;
      }
      bad("no stage of " + spec.name() + " can begin at '" + name + "'; a stage begins at a " +
          (spec.gpt() ? "block" : "layer that begins a pipeline unit") + ": " + some +
          (begins.size() > 12 ? ", ..." : "") + " (model show lists the units)");
    }
    if (it->second <= first.back())
      bad("'" + name + "' does not come after the stage before it; list the layers in the order they run");
    first.push_back(it->second);
  }
  std::string counts;
  first.push_back(units);
  for (size_t s = 0; s + 1 < first.size(); ++s) {
    if (s) counts += ',';
    counts += std::to_string(first[s + 1] - first[s]);
  }
  return counts;
}

}  // namespace meshtrain::train
