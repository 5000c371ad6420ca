#include "meshtrain/train/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "meshtrain/comm/world.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor_parallel.h"
#include "meshtrain/parallel/tp_layout.h"
#include "meshtrain/pipeline/executor.h"
#include "meshtrain/pipeline/passes.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/trace/trace.h"
#include "meshtrain/train/ps_trainer.h"
#include "meshtrain/train/layout.h"
#include "meshtrain/train/stage_runner.h"
#include "meshtrain/train/swimlane.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::train {

namespace {

using Clock = std::chrono::steady_clock;

std::invalid_argument bad(const std::string& msg) { return std::invalid_argument(msg); }

// ---- one rank ----

struct Shared {
  const TrainOptions& o;
  const model::GPTConfig& cfg;
  const TokenDataset& data;
  TrainResult& res;
  trace::Recorder* recorder;  // null without --trace
  const CheckpointData* resume = nullptr;  // --resume: the verified checkpoint to continue from
};

class RankTrainer {
 public:
  RankTrainer(comm::Communicator& world, Shared& sh)
      : sh_(sh), o_(sh.o), mesh_(world, {o_.dp, o_.tp, o_.pp}), lead_(world.rank() == 0) {
    // This rank's chunks of the model: stages built by composition, split by the layout's layer
    // factory (model/stage.h); pp == 1 is one stage holding the whole model.
    const parallel::TPOptions tpo{.sequence_parallel = o_.sequence_parallel, .pad_vocab = o_.pad_vocab};
    if (o_.tp > 1) parallel::validate_tp(sh.cfg, o_.tp, tpo, 0);
    auto layout = parallel::gpt_layout(o_.tp > 1 ? mesh_.tp_ptr() : nullptr, tpo);
    const pipeline::Schedule schedule = make_pipeline_schedule(o_);
    if (o_.pp > 1 && o_.pp_balance == "profile") {
      // Measured on rank 0, one micro-batch of this run's shape; every rank balances the same.
      std::vector<double> v(sh.cfg.n_layer + 2, 0.0);
      if (world.rank() == 0) {
        profiled_ = profile_costs(sh.cfg, o_.batch / o_.dp / o_.microbatches, o_.seq, o_.threads, o_.seed);
        v[0] = profiled_->embedding, v[1] = profiled_->head;
        std::copy(profiled_->blocks.begin(), profiled_->blocks.end(), v.begin() + 2);
      }
      world.broadcast(v, {.root = 0});
      profiled_ = StageCosts{{v.begin() + 2, v.end()}, v[0], v[1]};
    }
    spans_ = stage_layers(o_, sh.cfg, profiled_ ? &*profiled_ : nullptr);
    const auto& spans = spans_;
    const int stages = schedule.shape.stages(), pp_rank = mesh_.coord().pp;
    for (int c = 0; c < schedule.shape.chunks; ++c) {
      const int st = schedule.shape.stage_of(pp_rank, c);
      model::StageSpec spec{spans[st].first, spans[st].end, st == 0, st == stages - 1};
      stages_.push_back(std::make_unique<model::GPTStage>(sh.cfg, o_.seed, spec, layout));
    }
    std::vector<nn::Param*> params = stage_params();
    if (o_.dp > 1 || o_.zero > 0) {
      parallel::DataParallelOptions dpo;
      dpo.zero = o_.zero;
      if (o_.bucket_bytes > 0) dpo.bucket_bytes = o_.bucket_bytes;
      ddp_ = std::make_unique<parallel::DataParallel>(units(), mesh_.dp_ptr(), dpo);
      params = ddp_->optimizer_params();
    }
    std::vector<pipeline::StageRunner*> runners;
    for (auto& stage : stages_) {
      std::function<void(bool)> sync;
      if (ddp_) sync = [d = ddp_.get()](bool last) { d->set_sync(last); };
      runners_.push_back(std::make_unique<GPTStageRunner>(*stage, hooks(), sync,
                                                          o_.sequence_parallel ? o_.tp : 1, o_.recompute));
      runners.push_back(runners_.back().get());
      if (sh.cfg.has_skip()) {  // a skip connection whose ends sit on two stages: a portal
        auto stage_of_block = [&](int64_t b) {
          for (int st = 0; st < stages; ++st)
            if (b >= spans[st].first && b < spans[st].end) return st;
          return -1;
        };
        const int from = stage_of_block(sh.cfg.skip_from), to = stage_of_block(sh.cfg.skip_to);
        const int here = schedule.shape.stage_of(pp_rank, static_cast<int>(runners_.size()) - 1);
        if (from != to) runners_.back()->set_portal_stages(here == from ? to : -1, here == to ? from : -1);
      }
    }
    exec_ = std::make_unique<pipeline::Executor>(schedule, pp_rank, o_.pp > 1 ? &mesh_.pp_group() : nullptr,
                                                 runners, o_.threads);
    if (o_.pp > 1) {
      // The tied token table: the first stage's copy and the last stage's sum their gradients
      // over this group (one pair per (dp, tp) position).
      const bool holds_wte = pp_rank == 0 || pp_rank == o_.pp - 1;
      emb_ = world.split(holds_wte ? mesh_.coord().dp * o_.tp + mesh_.coord().tp : comm::kNoColor, pp_rank,
                         "embedding");
    }
    adam_ = std::make_unique<AdamW>(params, o_.adam, o_.threads);
    if (trace::Recorder* rec = sh.recorder) {
      // Communication spans on the rank's comm track, as the communicator runs them.
      const int rank = world.rank();
      for (comm::Communicator* g : {&mesh_.dp_group(), &mesh_.tp_group()}) {
        if (g->size() == 1) continue;
        const bool dp = g == &mesh_.dp_group();
        std::string group = dp ? "dp " : "tp ", category = dp ? "comm" : "tp-comm";
        g->set_op_observer([rec, rank, group, category](const char* op, uint64_t seq, auto t0, auto t1) {
          rec->add({rank, trace::Track::comm, group + op + " #" + std::to_string(seq), category,
                    rec->to_us(t0), rec->to_us(t1)});
        });
      }
    }
  }

  void run();

 private:
  // Data-parallel units in forward order: per stage, its ends (embedding, ln_f) and its blocks.
  std::vector<parallel::Unit> units() {
    std::vector<parallel::Unit> u;
    for (auto& stage : stages_) {
      std::vector<nn::Param*> root;
      for (nn::Param* p : stage->params())
        if (p->name.rfind("h.", 0) != 0) root.push_back(p);
      if (!root.empty()) u.push_back({stage.get(), root});
      for (auto& b : stage->h) u.push_back({b.get(), b->params()});
    }
    return u;
  }
  std::vector<nn::Param*> stage_params() {
    std::vector<nn::Param*> out;
    for (auto& stage : stages_) stage->collect_params(out);
    return out;
  }
  std::vector<nn::Param*> model_params() { return ddp_ ? ddp_->params() : stage_params(); }
  // The last stage's copy of the tied token table (pp > 1), which the norm counts once.
  const nn::Param* wte_copy() {
    return o_.pp > 1 && stages_.back()->last() ? &stages_.back()->wte : nullptr;
  }
  double pp_sum(double v) {
    if (o_.pp == 1) return v;
    std::array<double, 1> a{v};
    mesh_.pp_group().all_reduce(a);
    return a[0];
  }
  // Runs micro-batch losses through the pipeline: the mean over them, on every rank.
  double pipeline_loss(int64_t n) {
    double sum = 0;
    if (stages_.back()->last())
      for (float l : runners_.back()->losses()) sum += l / static_cast<double>(n);
    return pp_sum(sum);
  }
  void record(const pipeline::StepStats& st);
  nn::Hooks* hooks() { return ddp_ ? ddp_->hooks() : nullptr; }
  double dp_mean(double v) {
    if (o_.dp == 1) return v;
    std::array<double, 1> a{v};
    mesh_.dp_group().all_reduce(a, {.op = comm::ReduceOp::avg});
    return a[0];
  }
  float evaluate();
  void save(int64_t step);
  void gather_stages(const std::vector<nn::Param*>& params, std::vector<Tensor>& values,
                     std::vector<Tensor>& m, std::vector<Tensor>& v);
  std::vector<std::string> gathered_names_;
  std::vector<pipeline::LayerSpan> spans_;  // blocks of every stage (the same on every rank)
  std::optional<StageCosts> profiled_;      // --pp-balance profile: the measured costs  // rank 0: names of the tensors gather_stages appended
  int64_t restore();
  [[noreturn]] void diverged(int64_t step, const char* what, double value) const;
  StateBytes state_bytes();
  void print_header();

  Shared& sh_;
  const TrainOptions& o_;
  double analytic_mb_ = 0;
  parallel::DeviceMesh mesh_;
  bool lead_;
  std::vector<std::unique_ptr<model::GPTStage>> stages_;  // this rank's chunks, in chunk order
  std::unique_ptr<parallel::DataParallel> ddp_;
  std::vector<std::unique_ptr<GPTStageRunner>> runners_;
  std::unique_ptr<pipeline::Executor> exec_;
  std::shared_ptr<comm::Communicator> emb_;  // pp > 1: first and last stage, for the tied wte
  std::unique_ptr<AdamW> adam_;
  std::optional<int64_t> saved_step_;  // the newest checkpoint this run saved or resumed from
};

// ---- evaluation: every dp rank takes its rows of each validation batch ----

float RankTrainer::evaluate() {
  const int64_t B = o_.batch, T = o_.seq, rows = B / o_.dp, r0 = mesh_.coord().dp * rows;
  const int64_t n = o_.eval_batches;
  std::vector<int32_t> tok(n * rows * T), tgt(n * rows * T);
  for (int64_t j = 0; j < n; ++j)
    sh_.data.batch(Split::val, DataOrder::random, o_.seed, j, B, T, r0, r0 + rows, tok.data() + j * rows * T,
                   tgt.data() + j * rows * T);
  for (auto& r : runners_) r->set_batches(tok.data(), tgt.data(), rows, T, 1.f);
  exec_->forward_only(static_cast<int>(n));
  double sum = 0;  // batch losses in order, as one rank adds them
  if (stages_.back()->last())
    for (float l : runners_.back()->losses()) sum += l;
  return static_cast<float>(dp_mean(pp_sum(sum) / static_cast<double>(n)));
}

// ---- checkpoints: full logical tensors, gathered over dp, written by rank 0 ----

nlohmann::json run_config(const model::GPTConfig& cfg, const TrainOptions& o) {
  return {{"model", cfg.to_json()}, {"batch", o.batch},  {"seq", o.seq},
          {"seed", o.seed},         {"data_order", to_string(o.data_order)},
          {"steps", o.steps},       {"layout", {{"dp", o.dp}, {"tp", o.tp}, {"pp", o.pp}, {"zero", o.zero}}}};
}

void RankTrainer::save(int64_t step) {
  std::vector<nn::Param*> params = model_params();
  std::vector<Tensor> values;
  auto copy_values = [&] {
    for (nn::Param* p : params) values.push_back(p->value.clone());
  };
  if (ddp_) ddp_->with_full_params(copy_values);
  else copy_values();
  std::vector<Tensor> m = adam_->exp_avg(), v = adam_->exp_avg_sq();
  if (ddp_) m = ddp_->gather_segments(m), v = ddp_->gather_segments(v);
  if (o_.tp > 1) {
    // Tensor-parallel shards into full logical tensors (collective over tp).
    for (size_t i = 0; i < params.size(); ++i) {
      values[i] = parallel::full_tensor(*params[i], values[i], mesh_.tp_group());
      m[i] = parallel::full_tensor(*params[i], m[i], mesh_.tp_group());
      v[i] = parallel::full_tensor(*params[i], v[i], mesh_.tp_group());
    }
  }
  if (o_.pp > 1) gather_stages(params, values, m, v);
  if (!lead_) {
    saved_step_ = step;
    return;
  }
  CheckpointRefs refs;
  refs.step = step;
  refs.config = run_config(sh_.cfg, o_);
  refs.state = {{"updates", adam_->updates()}, {"data_position", step}};
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& name = i < params.size() ? params[i]->name : gathered_names_[i - params.size()];
    refs.model.emplace_back(name, &values[i]);
    refs.optimizer.emplace_back("exp_avg." + name, &m[i]);
    refs.optimizer.emplace_back("exp_avg_sq." + name, &v[i]);
  }
  save_checkpoint(o_.checkpoint_dir, refs, o_.keep_checkpoints);
  saved_step_ = step;
}

// Pipeline: the full tensors of the other stages travel to rank 0 (pp rank 0 of the dp 0 / tp 0
// position; the other positions hold copies). Each pp rank sends value, exp_avg and exp_avg_sq
// of its parameters in params() order, leaving out the last stage's copy of the tied wte; rank
// 0 knows every rank's names and shapes from the partition and appends them after its own.
void RankTrainer::gather_stages(const std::vector<nn::Param*>& params, std::vector<Tensor>& values,
                                std::vector<Tensor>& m, std::vector<Tensor>& v) {
  if (mesh_.coord().dp != 0 || mesh_.coord().tp != 0) return;
  comm::Communicator& pp = mesh_.pp_group();
  const int tag = 1 << 22;  // below the pipeline executor's range
  auto span = [](Tensor& t) { return std::span<float>(t.data(), static_cast<size_t>(t.numel())); };
  if (pp.rank() != 0) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i] == wte_copy()) continue;
      for (Tensor* t : {&values[i], &m[i], &v[i]}) pp.send(span(*t), 0, {.tag = tag});
    }
    return;
  }
  gathered_names_.clear();
  const pipeline::ScheduleShape shape{o_.pp, o_.microbatches, o_.chunks};
  const auto& spans = spans_;
  for (int r = 1; r < o_.pp; ++r)
    for (int c = 0; c < shape.chunks; ++c) {
      const int st = shape.stage_of(r, c);
      const bool last = st == shape.stages() - 1;
      model::StageSpec spec{spans[st].first, spans[st].end, st == 0, last};
      for (auto& [name, shape_of] : model::stage_param_shapes(sh_.cfg, spec)) {
        if (last && name == "wte.weight") continue;
        for (std::vector<Tensor>* list : {&values, &m, &v}) {
          list->push_back(Tensor::empty(shape_of));
          pp.recv(span(list->back()), r, {.tag = tag});
        }
        gathered_names_.push_back(name);
      }
    }
}

// Sets this rank's part of the model and optimizer from the checkpoint train() chose and
// checked (configuration and tensor set) before the ranks started.
int64_t RankTrainer::restore() {
  const std::string& dir = o_.checkpoint_dir;
  const CheckpointData& ck = *sh_.resume;
  std::map<std::string, const Tensor*> model, opt;
  for (auto& [n, t] : ck.model) model[n] = &t;
  for (auto& [n, t] : ck.optimizer) opt[n] = &t;
  auto find = [&](std::map<std::string, const Tensor*>& in, const std::string& name, const Shape& shape) {
    auto it = in.find(name);
    if (it == in.end()) throw bad("checkpoint in " + dir + " lacks tensor " + name);
    if (it->second->shape() != shape)
      throw bad("checkpoint tensor " + name + " has shape " + shape_str(it->second->shape()) +
                ", the model expects " + shape_str(shape));
    return *it->second;
  };
  std::vector<nn::Param*> params = model_params();
  std::vector<Tensor> values, m, v;
  for (nn::Param* p : params) {
    values.push_back(find(model, p->name, p->global_shape));
    m.push_back(find(opt, "exp_avg." + p->name, p->global_shape));
    v.push_back(find(opt, "exp_avg_sq." + p->name, p->global_shape));
    if (o_.tp > 1) {
      values.back() = parallel::local_shard(*p, values.back());
      m.back() = parallel::local_shard(*p, m.back());
      v.back() = parallel::local_shard(*p, v.back());
    }
  }
  if (ddp_) {
    ddp_->load_full_params(values);
    m = ddp_->slice_segments(m), v = ddp_->slice_segments(v);
  } else {
    for (size_t i = 0; i < params.size(); ++i) params[i]->value.copy_from(values[i]);
  }
  adam_->load_moments(m, v);
  adam_->set_updates(ck.state.value("updates", ck.step));
  saved_step_ = ck.step;
  return ck.step;
}

void RankTrainer::diverged(int64_t step, const char* what, double value) const {
  std::string msg = "training stopped at step " + std::to_string(step + 1) + ": the " + what + " is " +
                    (std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf") +
                    " (the run diverged); nothing of this step was applied to the weights";
  if (!o_.checkpoint_dir.empty()) {
    if (saved_step_)
      msg += " and the latest checkpoint stays " + step_folder_name(*saved_step_) + " in " + o_.checkpoint_dir;
    else
      msg += " and no checkpoint had been saved yet";
  }
  msg += "; lower --lr (or lengthen --warmup)";
  if (saved_step_) msg += " and continue with --resume";
  throw TrainingDiverged(msg);
}

StateBytes RankTrainer::state_bytes() {
  StateBytes s;
  if (ddp_) {
    auto mem = ddp_->memory();
    s.params = mem.param_bytes, s.grads = mem.grad_bytes;
  } else {
    for (nn::Param* p : stage_params()) s.params += p->value.bytes(), s.grads += p->grad.bytes();
  }
  s.optimizer = adam_->state_bytes();
  return s;
}

// The executor's actions on the rank's timeline: compute on the compute track, waits for
// pipeline transfers on the communication track; labelled with the micro-batch.
void RankTrainer::record(const pipeline::StepStats& st) {
  trace::Recorder* rec = sh_.recorder;
  if (!rec) return;
  const double base = rec->to_us(st.start);
  for (const pipeline::ActionTiming& t : st.timeline) {
    const pipeline::Action& a = t.action;
    std::string name, category;
    switch (a.kind) {
      case pipeline::Kind::F: name = "forward ", category = "forward"; break;
      case pipeline::Kind::B: name = "backward ", category = "backward"; break;
      case pipeline::Kind::I: name = "input gradient ", category = "input-grad"; break;
      case pipeline::Kind::W: name = "weight gradient ", category = "weight-grad"; break;
      case pipeline::Kind::RECV_F: name = "recv activation ", category = "pp-comm"; break;
      case pipeline::Kind::RECV_B: name = "recv gradient ", category = "pp-comm"; break;
      default: continue;  // sends are posted, not waited for, here
    }
    name += std::to_string(a.microbatch);
    if (o_.pp > 1) name += " (stage " + std::to_string(a.stage) + ")";
    const bool comm = category == "pp-comm";
    rec->add({mesh_.rank(), comm ? trace::Track::comm : trace::Track::compute, name, category,
              base + t.start_us, base + t.end_us});
  }
}

// ---- progress output ----

void print_step(const StepRecord& r, int64_t steps) {
  std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | mfu %4.1f%%\n",
              static_cast<long long>(r.step + 1), static_cast<long long>(steps), r.loss, r.lr,
              r.grad_norm, r.step_ms, r.tokens_per_s, 100.0 * r.mfu);
  std::fflush(stdout);
}

void RankTrainer::print_header() {
  const auto& cfg = sh_.cfg;
  std::printf("model %s: %lld parameters | batch %lld x %lld | %s | %d thread(s) per rank | data %s (%lld train tokens)\n",
              cfg.name.c_str(), static_cast<long long>(cfg.num_params()),
              static_cast<long long>(o_.batch), static_cast<long long>(o_.seq),
              parallel::MeshShape{o_.dp, o_.tp, o_.pp}.str().c_str(), o_.threads, o_.data.c_str(),
              static_cast<long long>(sh_.data.num_tokens(Split::train)));
  {
    // Training memory against the analytic sum: parameters, gradients, two Adam moments (all
    // float32) and the activations one micro-batch saves (model/config.h).
    StateBytes s = sh_.res.state_bytes;
    const double MiB = 1024.0 * 1024.0;
    const double act = cfg.activation_bytes(o_.batch / o_.dp / o_.microbatches, o_.seq);
    const double total = static_cast<double>(s.params + s.grads + s.optimizer) + act;
    std::printf("memory per rank (analytic): params %.1f + grads %.1f + adam %.1f + activations %.1f = %.1f MiB\n",
                s.params / MiB, s.grads / MiB, s.optimizer / MiB, act / MiB, total / MiB);
    analytic_mb_ = total / MiB;
  }
  if (o_.tp > 1) {
    // Tensor parallelism: this rank holds the replicated parameters whole and 1/tp of the split.
    int64_t rep = 0, split = 0, split_global = 0, padding = 0;
    for (nn::Param* p : stage_params()) {
      if (p->shard.is_split()) {
        split += p->value.bytes(), split_global += shape_numel(p->global_shape) * 4;
        if (p->shard.padded)  // rows added so that every rank holds ceil(rows / tp)
          padding = p->value.dim(p->shard.dim) * o_.tp - p->global_shape[p->shard.dim];
      } else {
        rep += p->value.bytes();
      }
    }
    std::printf("parameters per rank (tp %d): replicated %lld + split %lld = %lld bytes "
                "(split part of the full model %lld / %d = %lld",
                o_.tp, static_cast<long long>(rep), static_cast<long long>(split),
                static_cast<long long>(rep + split), static_cast<long long>(split_global), o_.tp,
                static_cast<long long>(split_global / o_.tp));
    if (padding)
      std::printf("; the vocabulary is padded by %lld rows to split %lld per rank, the padding on the last rank(s)",
                  static_cast<long long>(padding), static_cast<long long>(cfg.vocab_size / o_.tp + 1));
    std::printf(")\n");
  }
  if (o_.pp > 1) {
    const pipeline::Schedule& sc = exec_->schedule();
    std::printf("pipeline: %d stages on pp %d (%d chunk(s) per rank), schedule %s, %d micro-batches | %s\n",
                sc.shape.stages(), o_.pp, sc.shape.chunks, sc.name.c_str(), o_.microbatches,
                pipeline::to_string(spans_).c_str());
    if (profiled_) {
      double blocks = 0;
      for (double b : profiled_->blocks) blocks += b;
      std::printf("pipeline balance measured (forward + backward of one micro-batch): embedding %.2f ms, "
                  "mean block %.2f ms, head %.2f ms\n",
                  1e3 * profiled_->embedding, 1e3 * blocks / static_cast<double>(profiled_->blocks.size()),
                  1e3 * profiled_->head);
    }
  }
  if (o_.dp > 1 || o_.zero > 0) {
    // ZeRO's per-rank state against the analytic formula (float32 Adam: 4 + 4 + 8 bytes per
    // parameter, each term divided by dp from its stage on).
    StateBytes s = sh_.res.state_bytes;
    const double n = static_cast<double>(cfg.num_params()), d = o_.dp, MiB = 1024.0 * 1024.0;
    double ap = 4 * n / (o_.zero >= 3 ? d : 1), ag = 4 * n / (o_.zero >= 2 ? d : 1),
           ao = 8 * n / (o_.zero >= 1 ? d : 1);
    std::printf("state per rank (zero %d, dp %d): params %.2f MiB, grads %.2f MiB, optimizer %.2f MiB"
                " | analytic %.2f, %.2f, %.2f MiB\n",
                o_.zero, o_.dp, s.params / MiB, s.grads / MiB, s.optimizer / MiB, ap / MiB, ag / MiB, ao / MiB);
  }
  std::fflush(stdout);
}

// ---- the loop ----

void RankTrainer::run() {
  TrainResult& res = sh_.res;
  const int64_t B = o_.batch, T = o_.seq, M = o_.microbatches;
  const int64_t rows = B / o_.dp / M;  // rows of one micro-batch on this rank
  const int64_t rank_row0 = mesh_.coord().dp * (B / o_.dp);
  const bool talk = lead_ && !o_.quiet;

  int64_t start = 0;
  if (sh_.resume) {
    start = restore();
    if (talk)
      std::printf("resumed from %s at step %lld\n",
                  (o_.checkpoint_dir + "/" + step_folder_name(start)).c_str(), static_cast<long long>(start));
  }
  if (o_.save_initial && start == 0) save(0);
  if (lead_) res.start_step = start, res.state_bytes = state_bytes();

  const double flops_per_step = sh_.cfg.flops_per_token(T) * static_cast<double>(B * T);
  const double peak_gflops = measured_gemm_gflops(o_.threads) * mesh_.world().size();
  if (talk) print_header();
  std::unique_ptr<MetricsWriter> metrics;
  // --resume: train() kept the file's lines up to `start`; continue it.
  if (lead_) metrics = std::make_unique<MetricsWriter>(o_.metrics, /*append=*/o_.resume);
  std::vector<int32_t> tok(M * rows * T), tgt(M * rows * T);  // the step's micro-batches
  auto reduce_sq = [this](double local) {
    if (o_.pp > 1) {
      // Every parameter once: split ones summed over tp, replicated ones from tp rank 0, the
      // stages summed over pp, the tied wte counted on the first stage only.
      std::vector<nn::Param*> counted;
      for (nn::Param* p : stage_params())
        if (p != wte_copy()) counted.push_back(p);
      return pp_sum(parallel::tp_grad_sq(counted, mesh_.tp_group()));
    }
    // Tensor parallelism: split gradients summed over tp, replicated ones counted once.
    if (o_.tp > 1) return parallel::tp_grad_sq(stage_params(), mesh_.tp_group());
    return ddp_ ? ddp_->reduce_grad_sq(local) : local;
  };
  auto t_start = Clock::now();

  for (int64_t step = start; step < o_.steps; ++step) {
    auto t0 = Clock::now();
    comm::CommStats c0 = mesh_.dp_group().stats(), tp0 = mesh_.tp_group().stats();
    if (ddp_) ddp_->begin_step();
    else
      for (auto& stage : stages_) stage->zero_grad();
    for (int64_t mb = 0; mb < M; ++mb) {
      const int64_t r0 = rank_row0 + mb * rows;
      sh_.data.batch(Split::train, o_.data_order, o_.seed, step, B, T, r0, r0 + rows, tok.data() + mb * rows * T,
                     tgt.data() + mb * rows * T);
    }
    for (auto& r : runners_) r->set_batches(tok.data(), tgt.data(), rows, T, 1.0f / static_cast<float>(M));
    const pipeline::StepStats pst = exec_->run_step();
    record(pst);
    const double loss = pipeline_loss(M);
    std::vector<double> pp_bubble;
    std::vector<int64_t> pp_peak, pp_in_flight;  // per pp rank
    if (o_.pp > 1) {  // every pp rank's figures, for rank 0's metrics line
      // The bubble of rank r: the idle share of the pipeline's step, (step - compute_r) / step,
      // where the step is the longest rank's (all start together after the last step's
      // collectives), as the simulator's makespan is.
      std::vector<double> times(2 * o_.pp);
      mesh_.pp_group().all_gather(std::array<double, 2>{pst.step_us, pst.compute_us}, times);
      double step_us = 0;
      for (int r = 0; r < o_.pp; ++r) step_us = std::max(step_us, times[2 * r]);
      for (int r = 0; r < o_.pp; ++r)
        pp_bubble.push_back(step_us > 0 ? (step_us - times[2 * r + 1]) / step_us : 0.0);
      pp_peak.resize(o_.pp), pp_in_flight.resize(o_.pp);
      mesh_.pp_group().all_gather(std::array<int64_t, 1>{pst.peak_saved_bytes}, pp_peak);
      mesh_.pp_group().all_gather(std::array<int64_t, 1>{pst.max_in_flight}, pp_in_flight);
    }
    if (ddp_) {
      trace::Recorder::Span s(sh_.recorder, mesh_.rank(), trace::Track::compute, "wait for gradients", "wait");
      ddp_->finish_grad_sync();
    }
    if (emb_) {  // the tied token table: first stage + last stage
      nn::Param& wte = stages_[0]->first() ? stages_[0]->wte : stages_.back()->wte;
      emb_->all_reduce(std::span<float>(wte.grad.data(), static_cast<size_t>(wte.grad.numel())));
    }
    const int rank = mesh_.rank();
    auto* rec = sh_.recorder;
    StepRecord r;
    r.step = step;
    // A non-finite loss or gradient norm stops the run before anything of the step is applied.
    // Both values are the same on every rank (the loss is averaged over dp and equal over tp,
    // the norm is global), so every rank stops here together, with no collective left open.
    const double mean_loss = dp_mean(loss);
    if (!std::isfinite(mean_loss)) diverged(step, "loss", mean_loss);
    r.loss = static_cast<float>(mean_loss);
    {
      trace::Recorder::Span s(rec, rank, trace::Track::compute, "optimizer", "optimizer");
      r.grad_norm = adam_->step(step, reduce_sq);  // applies nothing on a non-finite norm
      if (ddp_) ddp_->finish_optimizer_step();
    }
    if (!std::isfinite(r.grad_norm)) diverged(step, "gradient norm", r.grad_norm);
    r.lr = lr_at(o_.adam, step);
    r.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    r.tokens_per_s = static_cast<double>(B * T) / (r.step_ms / 1e3);
    r.mfu = flops_per_step / (r.step_ms / 1e3) / (peak_gflops * 1e9);
    r.peak_rss_mb = peak_rss_mb();
    comm::CommStats c1 = mesh_.dp_group().stats();
    r.comm_bytes_sent = c1.bytes_sent - c0.bytes_sent;
    r.comm_bytes_received = c1.bytes_received - c0.bytes_received;
    r.comm_wait_ms = (c1.wait_seconds - c0.wait_seconds) * 1e3;
    comm::CommStats tp1 = mesh_.tp_group().stats();
    const uint64_t tp_bytes = tp1.bytes_sent - tp0.bytes_sent;
    const bool last = step + 1 == o_.steps;
    if (o_.eval_every > 0 && ((step + 1) % o_.eval_every == 0 || last)) r.val_loss = evaluate();
    if (o_.checkpoint_every > 0 && ((step + 1) % o_.checkpoint_every == 0 || last)) save(step + 1);
    if (!lead_) continue;

    nlohmann::json line = step_json(r);
    if (o_.dp > 1) {
      line["comm_bytes_sent"] = r.comm_bytes_sent;
      line["comm_bytes_received"] = r.comm_bytes_received;
      line["comm_wait_ms"] = r.comm_wait_ms;
    }
    if (o_.tp > 1) line["tp_bytes_sent"] = tp_bytes;
    if (o_.pp > 1) {  // one entry per pipeline rank (of rank 0's dp/tp position)
      line["bubble"] = pp_bubble;
      line["peak_saved_activation_bytes"] = pp_peak;
      line["microbatches_in_flight"] = pp_in_flight;
    }
    else {
      line["peak_saved_activation_bytes"] = std::vector<int64_t>{pst.peak_saved_bytes};
    }
    if (r.val_loss) line["val_loss"] = *r.val_loss;
    metrics->write(line);
    if (talk && o_.log_every > 0 && ((step + 1) % o_.log_every == 0 || last)) print_step(r, o_.steps);
    if (talk && r.val_loss)
      std::printf("step %5lld | validation loss %.4f\n", static_cast<long long>(step + 1), *r.val_loss);
    res.steps.push_back(r);
  }
  float final_val = (!res.steps.empty() && res.steps.back().val_loss) ? *res.steps.back().val_loss : 0.f;
  bool have_val = lead_ ? (!res.steps.empty() && res.steps.back().val_loss) : false;
  // Every rank must agree whether to evaluate (a collective under dp).
  if (o_.eval_every <= 0 || start >= o_.steps) final_val = evaluate(), have_val = true;
  if (!lead_) return;
  res.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (have_val) res.final_val_loss = final_val;
  if (talk) {
    const double rss = peak_rss_mb();
    std::printf("done: %lld steps in %.1f s | final validation loss %.4f | peak RSS %.0f MiB "
                "(%.2fx the analytic %.0f MiB%s)\n",
                static_cast<long long>(res.steps.size()), res.wall_s, final_val, rss,
                rss / analytic_mb_, analytic_mb_, mesh_.world().size() > 1 ? " per rank; RSS counts the whole process" : "");
    std::fflush(stdout);
  }
}

// Writes the Chrome trace and, beside it, the SVG swimlane; prints the overlap figure.
void write_trace(const trace::Recorder& rec, const TrainOptions& o) {
  rec.write_chrome_json(o.trace);
  std::string svg = o.trace;
  if (svg.size() > 5 && svg.compare(svg.size() - 5, 5, ".json") == 0) svg.resize(svg.size() - 5);
  svg += ".svg";
  const auto events = rec.events();
  bool drawn = false;
  for (const auto& e : events) drawn = drawn || e.category == "forward";
  if (drawn)  // the measured swimlane, from the first step on (train/swimlane.h)
    pipeline::write_svg(measured_swimlane(events, "meshtrain train " + o.model + ": " +
                                                      parallel::MeshShape{o.dp, o.tp, o.pp}.str() +
                                                      (o.pp > 1 ? ", " + o.schedule : std::string()) + ", " +
                                                      std::to_string(o.microbatches) + " micro-batch(es)"),
                        svg);
  if (o.quiet) return;
  auto all = rec.events();
  std::vector<trace::Event> dp, rest, pp;  // dp collectives run async; tp ones inline in compute
  for (auto& e : all) (e.category == "tp-comm" ? rest : e.category == "pp-comm" ? pp : dp).push_back(e);
  std::printf("trace: %s (Perfetto / chrome://tracing) and %s", o.trace.c_str(), svg.c_str());
  const double compute_ms = trace::busy_us(all, 0, trace::Track::compute) / 1e3;
  if (trace::busy_us(dp, 0, trace::Track::comm) > 0)
    std::printf(" | rank 0: dp communication %.1f ms, %.0f%% of it hidden behind backward",
                trace::busy_us(dp, 0, trace::Track::comm) / 1e3,
                100.0 * trace::hidden_share(dp, 0, {"backward"}));
  if (trace::busy_us(pp, 0, trace::Track::comm) > 0)
    std::printf(" | rank 0: %.1f ms waiting for pipeline transfers", trace::busy_us(pp, 0, trace::Track::comm) / 1e3);
  if (trace::busy_us(rest, 0, trace::Track::comm) > 0)
    std::printf(" | rank 0: tp communication %.1f ms = %.0f%% of its %.1f ms of compute-track time",
                trace::busy_us(rest, 0, trace::Track::comm) / 1e3,
                100.0 * trace::busy_us(rest, 0, trace::Track::comm) / 1e3 / std::max(1e-9, compute_ms),
                compute_ms);
  std::printf("\n");
}

void note(const std::string& text) {
  std::fprintf(stderr, "meshtrain: note: %s\n", text.c_str());
  std::fflush(stderr);
}

// --resume: chooses and loads the checkpoint (train/checkpoint.h: the newest valid step folder),
// checks it belongs to this run, and trims the metrics file to its step. Without --resume, a
// run that will save refuses a directory holding step folders. `lead` prints the notes.
std::optional<CheckpointData> prepare_checkpoints(const TrainOptions& o, const model::GPTConfig& cfg, bool lead) {
  const std::string& dir = o.checkpoint_dir;
  if (!o.resume) {
    if (o.checkpoint_every == 0 && !o.save_initial) return std::nullopt;
    const auto folders = step_folders(dir);
    if (!folders.empty())
      throw CheckpointError("--checkpoint-dir " + dir + " already holds checkpoints (" +
                            std::to_string(folders.size()) + " step folder(s), the newest " +
                            std::filesystem::path(folders.back().second).filename().string() +
                            ") and a new run never overwrites them; use --resume to continue that run, or "
                            "another directory");
    return std::nullopt;
  }
  ResumePoint rp = find_resume_point(dir);
  if (lead)
    for (const std::string& n : rp.notes) note(n);
  std::optional<CheckpointData> ck;
  if (rp.folder) {
    ck = load_checkpoint(*rp.folder);
    const nlohmann::json want = run_config(cfg, o);
    for (const char* key : {"model", "batch", "seq", "seed", "data_order"})
      if (ck->config.value(key, nlohmann::json()) != want[key])
        throw bad("cannot resume from " + *rp.folder + ": it was saved with " + key + " = " +
                  ck->config.value(key, nlohmann::json()).dump() + ", this run has " + want[key].dump() +
                  "; use the same value or another --checkpoint-dir");
    const auto shapes = model::gpt_param_shapes(cfg);
    std::vector<std::pair<std::string, Shape>> moments;
    for (const auto& [name, shape] : shapes) moments.emplace_back("exp_avg." + name, shape);
    for (const auto& [name, shape] : shapes) moments.emplace_back("exp_avg_sq." + name, shape);
    check_tensor_set("checkpoint " + *rp.folder + " (model.safetensors)", shapes, ck->model);
    check_tensor_set("checkpoint " + *rp.folder + " (optimizer.safetensors)", moments, ck->optimizer);
  }
  if (lead && !o.metrics.empty()) {
    const int64_t step = ck ? ck->step : 0;
    const MetricsTrim t = trim_metrics_for_resume(o.metrics, step);
    if (t.dropped > 0)
      note("metrics file " + o.metrics + ": " +
           (step == 0 ? std::string("this run starts from step 0, so its ") + std::to_string(t.dropped) +
                            " line(s) were removed"
                      : "kept its lines of steps 1-" + std::to_string(step) + " and removed " +
                            std::to_string(t.dropped) + " line(s) of later steps (this run writes them again) or cut short") +
           "; the file as it was is kept as " + t.backup);
  }
  return ck;
}

}  // namespace

nlohmann::json step_json(const StepRecord& r) {
  return {{"step", r.step + 1},
          {"loss", r.loss},
          {"lr", r.lr},
          {"grad_norm", r.grad_norm},
          {"tokens_per_s", r.tokens_per_s},
          {"step_ms", r.step_ms},
          {"mfu", r.mfu},
          {"peak_rss_mb", r.peak_rss_mb}};
}

model::GPTConfig resolve_options(TrainOptions& o) {
  model::GPTConfig cfg =
      o.config_file.empty() ? model::gpt_config(o.model) : model::gpt_config_from_file(o.config_file);
  // -1: the model's recommended shape; any other value is checked as given.
  if (o.batch == -1) o.batch = cfg.batch;
  if (o.seq == -1) o.seq = cfg.seq;
  if (comm::launched_by_mpirun()) o.backend = "mpi";
  const Machine machine = Machine::probe();
  validate_options(o, cfg, machine);  // train/validate.h: every flag, before any rank starts
  if (o.threads == 0) {
    int64_t local_ranks = o.backend == "mpi" ? 1 : int64_t{o.dp} * o.tp * o.pp + o.ps_servers;
    o.threads = static_cast<int>(std::max<int64_t>(1, machine.cores / local_ranks));
  }
  if (o.adam.decay_steps == 0) o.adam.decay_steps = o.steps;
  return cfg;
}

TrainResult train(TrainOptions o) {
  TrainResult res;
  res.config = resolve_options(o);
  TokenDataset data = TokenDataset::open(o.data, o.val_fraction, o.seq);
  validate_dataset(o, res.config, data);  // vocabulary and split lengths (train/validate.h)
  if (o.ps_servers > 0) return train_parameter_server(o, res.config, data);  // train/ps_trainer.h
  if (o.backend == "mpi" && comm::mpi_world()->size() != o.dp * o.tp * o.pp)
    throw bad("mpirun started " + std::to_string(comm::mpi_world()->size()) +
              " processes but the layout " + parallel::MeshShape{o.dp, o.tp, o.pp}.str() +
              " needs " + std::to_string(o.dp * o.tp * o.pp) + "; make dp * tp * pp equal -np");
  const bool lead = o.backend != "mpi" || comm::mpi_world()->rank() == 0;
  // Checkpoints are settled before any rank starts: what to resume from (verified, and
  // matching this run), or that a new run will not overwrite another run's step folders.
  std::optional<CheckpointData> resume = prepare_checkpoints(o, res.config, lead);
  std::unique_ptr<trace::Recorder> recorder;
  if (!o.trace.empty()) recorder = std::make_unique<trace::Recorder>();
  Shared sh{o, res.config, data, res, recorder.get(), resume ? &*resume : nullptr};
  const int world = o.dp * o.tp * o.pp;
  comm::Backend backend = o.backend == "mpi" ? comm::Backend::mpi : comm::Backend::threads;
  comm::run_world(backend, backend == comm::Backend::mpi ? 0 : world, [&](comm::Communicator& w) {
    RankTrainer rank(w, sh);
    rank.run();
  });
  if (recorder) write_trace(*recorder, o);
  return res;
}

}  // namespace meshtrain::train
