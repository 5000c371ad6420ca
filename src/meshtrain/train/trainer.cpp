// The training loop. First the step every rank runs (RankTrainer::train_step: zero the
// gradients, the batch, forward and backward through the executor, the gradient sync, the
// optimizer) and the loop around it (RankTrainer::run, whose hooks are in rank_hooks.cpp);
// then building a rank's part of the model, the global gradient norm, and train(), which checks
// the options, opens the data and runs a RankTrainer on every rank.
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
#include <numeric>
#include <stdexcept>
#include <tuple>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/comm/world.h"
#include "meshtrain/io/npy.h"
#include "meshtrain/kernels/adamw.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/parallel/branch/cnn_branch.h"
#include "meshtrain/parallel/data/data_parallel.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/spatial/cnn_spatial.h"
#include "meshtrain/parallel/tensor/cnn_tp.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/parallel/tensor/tp_layout.h"
#include "meshtrain/parallel/tensor/tp_regions.h"
#include "meshtrain/pipeline/executor.h"
#include "meshtrain/plan/cnn_memory.h"
#include "meshtrain/trace/trace.h"
#include "meshtrain/train/layout.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/ps_trainer.h"
#include "meshtrain/train/rank_trainer.h"
#include "meshtrain/train/stage_runner.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::train {

namespace detail {

// ---- the step ----

// One training step, the same on every rank: zero the gradients, take this rank's rows of the
// batch, run forward and backward through the executor, finish the gradient sync, update.
// What the run measures and writes about the step happens around it (run, below; the hooks in
// rank_hooks.cpp); inside it only `record` (the trace) and the pipeline figures for the metrics
// line, whose collectives every rank makes at this point.
StepResult RankTrainer::train_step(int64_t step) {
  StepResult out;
  // 1. Zero the gradients: parameter gradients accumulate (+=) over the micro-batches. (The
  //    asynchronous pipeline's gradients are set aside and zeroed by each step's first backward.)
  if (stashes_.empty() && (!versions_ || pending_step_ < 0)) zero_grads();  // pipedream: zeroed by each update
  // 2. This rank's rows of the step's batch, micro-batch by micro-batch.
  fill_batch(step);
  // 3. Forward and backward of every micro-batch, in the pipeline schedule's order. Under dp a
  //    bucket's all-reduce starts as soon as backward has finished its gradients.
  exec_->set_weights_epoch(step);
  pipedream_step_ = step;
  if (two_bw_reference_) {  // the gradient at the weights before the last update
    std::vector<nn::Param*> params = stage_params();
    for (size_t i = 0; i < reference_prev_.size(); ++i) {
      std::swap(params[i]->value, reference_prev_[i]);
      params[i]->drop_bf16();
    }
  }
  out.stats = exec_->run_step();
  if (two_bw_reference_) {  // back to the current weights; they are the next step's gradient point
    std::vector<nn::Param*> params = stage_params();
    for (size_t i = 0; i < reference_prev_.size(); ++i) {
      std::swap(params[i]->value, reference_prev_[i]);
      params[i]->drop_bf16();
      std::copy_n(params[i]->value.data(), params[i]->value.numel(), reference_prev_[i].data());
    }
  }
  if (!stashes_.empty()) {  // pipedream: the updates ran after each backward
    out.loss = dp_mean(pipeline_loss(o_.microbatches));
    record(out.stats);
    if (images()) out.accuracy = batch_accuracy();
    if (o_.pp > 1) out.pipeline = gather_pipeline_figures(out.stats);
    if (!std::isfinite(out.loss)) diverged(step, "loss", out.loss);
    out.grad_norm = pipedream_norm_;
    return out;
  }
  if (versions_) {
    pending_step_ = step;
    out.loss = dp_mean(pipeline_loss(o_.microbatches));
    record(out.stats);
    if (images()) out.accuracy = batch_accuracy();
    if (o_.pp > 1) out.pipeline = gather_pipeline_figures(out.stats);
    if (!std::isfinite(out.loss)) diverged(step, "loss", out.loss);
    update_two_bw(out);
    return out;
  }
  record(out.stats);                                   // --trace: the executor's actions
  const double loss = pipeline_loss(o_.microbatches);  // the mean over the micro-batches
  if (images()) out.accuracy = batch_accuracy();
  if (o_.pp > 1) out.pipeline = gather_pipeline_figures(out.stats);  // for the metrics line
  // 4. Finish the gradient sync (dp, and the tied token table's two copies).
  finish_grad_sync();
  // 5. Update. A non-finite loss or gradient norm stops the run before anything of the step is
  //    applied. Both values are the same on every rank (the loss is averaged over dp and equal
  //    over tp, the norm is global), so every rank stops here together, with no collective left
  //    open.
  out.loss = dp_mean(loss);
  if (!std::isfinite(out.loss)) diverged(step, "loss", out.loss);
  double sq = 0;  // the global squared gradient norm, before clipping
  {
    trace::Recorder::Span s(sh_.recorder, mesh_.rank(), trace::Track::compute, "optimizer", "optimizer");
    sq = global_grad_sq();
    out.grad_norm = optimizer_->step_with_grad_sq(step, sq);  // applies nothing on a non-finite norm
    if (ddp_) ddp_->finish_optimizer_step();
  }
  if (!std::isfinite(out.grad_norm)) diverged(step, "gradient norm", out.grad_norm);
  if (noise_) measure_noise(out, sq);  // --dp: the gradient noise scale
  return out;
}

// The gradient noise scale (train/noise_scale.h). Each rank's buckets summed the squares of its
// local gradients before the all-reduce, counting what global_grad_sq counts (a tp-replicated
// gradient on tp rank 0 only, an owned one on its owner); one all-reduce over the world adds
// them over tp and pp (one dp rank's whole-model |G_small|^2) and over dp, whose mean is taken.
// |G_big|^2 is the clipping norm's square, before clipping.
void RankTrainer::measure_noise(StepResult& out, double sq_big) {
  std::array<double, 1> small{ddp_->take_local_grad_sq()};
  mesh_.world().all_reduce(small);
  const double b_big = static_cast<double>(o_.batch), b_small = b_big / static_cast<double>(o_.dp);
  out.noise = noise_estimate(small[0] / static_cast<double>(o_.dp), sq_big, b_small, b_big);
  noise_->update(*out.noise);
  out.noise_scale = noise_->scale();
}

// PipeDream-2BW's update at the end of a step: the previous step's gradient (ready since this
// step's first backward; none after a flush) applied to the current weights, which the stash
// keeps first for the micro-batches still in flight.
void RankTrainer::update_two_bw(StepResult& out) {
  const std::optional<int64_t> ready = versions_->ready_step();
  versions_->keep_current();
  if (!ready) return;  // the first step after a flush: no gradient is ready (grad_norm 0)
  trace::Recorder::Span s(sh_.recorder, mesh_.rank(), trace::Track::compute, "optimizer", "optimizer");
  versions_->swap_ready();
  sync_tied_grad();
  out.grad_norm = optimizer_->step_with_grad_sq(*ready, global_grad_sq());
  if (ddp_) ddp_->finish_optimizer_step();
  versions_->swap_ready();
  versions_->clear_ready();
  if (!std::isfinite(out.grad_norm)) diverged(*ready, "gradient norm", out.grad_norm);
}

// A flush (before an evaluation, a checkpoint, and at the end): the backwards in flight, then
// the last step's gradient applied, so the weights are those of the recurrence after that step
// and nothing is owed. At pp 1 (the reference) the next gradient is taken at the current weights.
void RankTrainer::flush_two_bw() {
  if (two_bw_reference_) {
    std::vector<nn::Param*> params = stage_params();
    for (size_t i = 0; i < reference_prev_.size(); ++i)
      std::copy_n(params[i]->value.data(), params[i]->value.numel(), reference_prev_[i].data());
    return;
  }
  if (!versions_ || pending_step_ < 0) return;
  const pipeline::StepStats st = exec_->drain();
  record(st);
  finish_grad_sync();
  const double norm = optimizer_->step_with_grad_sq(pending_step_, global_grad_sq());
  if (ddp_) ddp_->finish_optimizer_step();
  if (!std::isfinite(norm)) diverged(pending_step_, "gradient norm", norm);
  zero_grads();
  versions_->after_flush();
  pending_step_ = -1;
}

// PipeDream's update of chunk c, right after a micro-batch's backward there: the micro-batch's
// gradient (synced over dp), clipped by the stage's own norm (over its tp group: the stages
// update at different moments, so no norm spans the pipeline), applied to the current weights
// once the stash has kept what micro-batches in flight still run on. The learning rate is that
// of the micro-batch's step (k / m); the optimizer counts every update.
void RankTrainer::update_pipedream(size_t c, int64_t k) {
  const int64_t step = k / o_.microbatches;  // the micro-batch's own step (its learning rate)
  trace::Recorder::Span span(sh_.recorder, mesh_.rank(), trace::Track::compute, "optimizer", "optimizer");
  finish_local_grads();
  std::vector<nn::Param*> params;
  stages_[c]->collect_params(params);
  std::array<double, 1> sq{0};
  for (const nn::Param* p : params)
    if (p->shard.counted_on(mesh_.coord().tp)) sq[0] += kernels::sum_squares(p->grad.data(), p->grad.numel(), o_.threads);
  if (o_.tp > 1) mesh_.tp_group().all_reduce(sq);
  stashes_[c]->begin_update();
  const double norm = stage_optimizers_[c]->step_with_grad_sq(step, sq[0]);
  if (ddp_) ddp_->finish_optimizer_step();
  stashes_[c]->end_update();
  if (ddp_) ddp_->begin_step();
  else stages_[c]->zero_grad();
  if (o_.exact_sums > 0)
    for (nn::Param* p : params) std::fill(p->grad_exact.begin(), p->grad_exact.end(), 0.0);
  if (!std::isfinite(norm)) diverged(step, "gradient norm", norm);
  pipedream_norm_ = norm;
}

void RankTrainer::flush_pipeline() {
  flush_two_bw();
  if (stashes_.empty()) return;
  if (o_.pp > 1 && exec_->in_flight()) {  // each backward updates its stage
    for (auto& r : runners_) r->set_step(pipedream_step_ + 1);
    record(exec_->drain());
  }
  for (auto& s : stashes_) s->flush((pipedream_step_ + 1) * o_.microbatches);
  zero_grads();
}

void RankTrainer::zero_grads() {
  if (ddp_) ddp_->begin_step();
  else
    for (auto& stage : stages_) stage->zero_grad();
  if (o_.exact_sums > 0)
    for (nn::Param* p : model_params()) std::fill(p->grad_exact.begin(), p->grad_exact.end(), 0.0);
}

// The gradients the optimizer reads: under dp the buckets' sync finished (the engine's all-reduce
// or reduce-scatter); on one rank with --exact-sums the float64 totals rounded once; then the tied
// token table of the first and last stage summed over the two (under ZeRO-2/3 their equal slices).
void RankTrainer::finish_grad_sync() {
  if (o_.exact_sums > 0) sync_replicas();  // Chimera: the float64 totals, before they are rounded
  finish_local_grads();
  if (o_.exact_sums == 0) sync_replicas();
  sync_tied_grad();
}

// Chimera: each model stage's two copies (this rank's chunk and its pair's other chunk) sum
// their gradients, in model-stage order on both ranks, so the pair computes the same sums.
void RankTrainer::sync_replicas() {
  if (!replica_) return;
  std::vector<size_t> order(stages_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const pipeline::ScheduleShape& shape = exec_->schedule().shape;
  auto ms = [&](size_t c) { return shape.model_stage(shape.stage_of(mesh_.coord().pp, static_cast<int>(c))); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms(a) < ms(b); });
  if (ms(order[0]) == ms(order[1])) return;  // unreachable: pp is even
  for (size_t c : order) {
    std::vector<nn::Param*> params;
    stages_[c]->collect_params(params);
    for (nn::Param* p : params) {
      if (o_.exact_sums > 0) replica_->all_reduce(std::span<double>(p->grad_exact));
      else replica_->all_reduce(std::span<float>(p->grad.data(), static_cast<size_t>(p->grad.numel())));
    }
  }
}

void RankTrainer::finish_local_grads() {
  if (ddp_) {
    trace::Recorder::Span s(sh_.recorder, mesh_.rank(), trace::Track::compute, "wait for gradients", "wait");
    ddp_->finish_grad_sync();
  } else if (o_.exact_sums > 0) {
    for (nn::Param* p : model_params())
      std::transform(p->grad_exact.begin(), p->grad_exact.end(), p->grad.data(),
                     [](double g) { return static_cast<float>(g); });
  }
}

void RankTrainer::sync_tied_grad() {
  if (replica_) {  // Chimera: ranks 0 and pp-1 hold both ends of the tied token table
    nn::Param *first = nullptr, *copy = nullptr;
    for (auto& stage : stages_)
      if (nn::Param* t = stage->tied_param()) (stage->first() ? first : copy) = t;
    if (!first || !copy) return;
    float* a = first->grad.data();
    float* b = copy->grad.data();
    for (int64_t i = 0; i < first->grad.numel(); ++i) a[i] += b[i], b[i] = a[i];
    return;
  }
  if (emb_) {
    nn::Param& wte = *(stages_[0]->tied_param() ? stages_[0] : stages_.back())->tied_param();
    emb_->all_reduce(ddp_ ? ddp_->synced_grad(&wte)
                          : std::span<float>(wte.grad.data(), static_cast<size_t>(wte.grad.numel())));
  }
}

// ---- the loop ----

// Every rank runs the same loop of steps; rank 0 (`lead_`) writes the metrics file, prints and
// saves the checkpoint's index. The hooks around the step are in rank_hooks.cpp, in the order
// called here.
void RankTrainer::run() {
  // Tensor parallelism's activations on the wire (tp_regions.h), for this rank thread.
  const parallel::TPWireScope tp_wire(o_.comm_dtype == kernels::Precision::bf16);
  const int64_t start = begin_run();  // --resume, the header, the metrics file
  pipedream_step_ = start - 1;
  flush_pipeline();                   // asynchronous pipelines: start from the (restored) weights
  int stopped = 0;                    // the signal a stop was agreed on (train/stop.h)
  for (int64_t step = start; step < o_.steps && !stopped; ++step) {
    inject_fault(step);                        // --fail-rank, --fail-at-step
    const StepMeter meter = start_meter();     // the clock, tensor memory, traffic counters
    const StepResult out = train_step(step);
    StepRecord r = measure(step, out, meter);  // lr, time, throughput, MFU, memory, traffic
    if (o_.eval_every > 0 && ((step + 1) % o_.eval_every == 0 || step + 1 == o_.steps))
      std::tie(r.val_loss, r.val_accuracy) = evaluate();
    nlohmann::json line = lead_ ? metrics_line(r, out) : nlohmann::json();
    stopped = checkpoint_or_stop(step, line);  // a stop agreed by every rank; the step's checkpoint
    if (lead_) report_step(r, line);           // the metrics file, the progress line, the heartbeat
  }
  flush_pipeline();            // asynchronous pipelines: nothing left in flight, every gradient applied
  finish_run(start, stopped);  // the final evaluation, the result, the summary
}

// ---- building a rank ----

RankTrainer::RankTrainer(comm::Communicator& world, Shared& sh)
    : sh_(sh), o_(sh.o), mesh_(world, {o_.dp, o_.tp, o_.pp}), lead_(world.rank() == 0) {
  // This rank's chunks of the model: stages built by composition, split by the layout's layer
  // factory (model/stage.h); pp == 1 is one stage holding the whole model.
  const parallel::TPOptions tpo{.sequence_parallel = o_.sequence_parallel, .pad_vocab = o_.pad_vocab};
  const bool gpt = sh.spec.gpt() != nullptr;
  if (gpt && o_.tp > 1) parallel::validate_tp(sh.cfg, o_.tp, tpo, 0);
  model::StageFactories factories;
  if (gpt) factories.transformer = parallel::gpt_layout(o_.tp > 1 ? mesh_.tp_ptr() : nullptr, tpo);
  if (!gpt && o_.tp > 1) {  // the intra-layer axis of an image model (model/cnn_layout.h)
    switch (o_.intra) {
      case IntraSplit::tensor: factories.conv = parallel::cnn_tp_layout(mesh_.tp_ptr()); break;
      case IntraSplit::spatial: factories.conv = parallel::cnn_spatial_layout(mesh_.tp_ptr(), *sh.spec.cnn()); break;
      case IntraSplit::branch: {
        // Without --branch-balance: the branches' measured cost, timed on rank 0 and broadcast,
        // so every rank places them alike.
        std::map<std::string, std::vector<double>> measured;
        if (o_.branch_balance.empty()) {
          const std::map<std::string, size_t> blocks = model::cnn_branch_blocks(*sh.spec.cnn());
          std::vector<double> flat;
          if (world.rank() == 0) {
            // At most 32 rows: the costs are compared with each other, and the others wait in
            // the broadcast (within the communicator's deadline) while rank 0 measures. The
            // planner's cached measurement (plan/cnn_memory.h), so the run places the branches
            // as the prediction it printed did: timed twice, the two could differ and put a
            // branch on the other rank (inception-small's peak memory then 12% off).
            measured = plan::branch_costs(*sh.spec.cnn(), o_.batch / o_.dp / o_.microbatches, std::max(1, o_.threads));
            for (const auto& [name, c] : measured) flat.insert(flat.end(), c.begin(), c.end());
          } else {
            for (const auto& [name, n] : blocks) flat.resize(flat.size() + n, 0.0);
          }
          world.broadcast(flat, {.root = 0});
          size_t at = 0;
          for (const auto& [name, n] : blocks) {
            measured[name].assign(flat.begin() + static_cast<long>(at), flat.begin() + static_cast<long>(at + n));
            at += n;
          }
        }
        factories.conv = parallel::cnn_branch_layout(mesh_.tp_ptr(), o_.branch_balance, std::move(measured));
        break;
      }
    }
  }
  const pipeline::Schedule schedule = make_pipeline_schedule(o_);
  if (gpt && o_.pp > 1 && o_.pp_balance == "profile") {
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
  spans_ = gpt ? stage_layers(o_, sh.cfg, profiled_ ? &*profiled_ : nullptr) : stage_units(o_, *sh.spec.cnn());
  const auto& spans = spans_;
  const int stages = schedule.shape.stages(), pp_rank = mesh_.coord().pp;
  const bool chimera = schedule.shape.bidirectional;  // each rank: a model stage of each pipeline
  const int model_stages = chimera ? o_.pp : stages;
  // An image graph cut inside a residual block: the skip crosses the cut in a portal (refused,
  // on every rank alike, where the stages would need more portals than the executor carries).
  model::SkipPortals portals;
  if (!gpt && stages > 1) {
    const model::CNNConfig& cnn = *sh.spec.cnn();
    std::vector<int64_t> first_unit;
    for (const pipeline::LayerSpan& sp : spans) first_unit.push_back(sp.first);
    portals = model::skip_portals(*cnn.graph, model::infer_shapes(*cnn.graph, {cnn.channels, cnn.height, cnn.width}),
                                  first_unit);
  }
  if (chimera) {  // a skip tensor would cross between the two pipelines' copies; not carried
    const bool crosses = gpt ? sh.cfg.has_skip() : std::any_of(portals.to.begin(), portals.to.end(), [](int t) { return t >= 0; });
    if (crosses)
      throw bad("--schedule chimera cannot carry a skip connection across pipeline stages yet; cut the model where none "
                "crosses (--pp-cuts), or use --schedule 1f1b");
  }
  for (int c = 0; c < schedule.shape.chunks; ++c) {
    const int ms = schedule.shape.model_stage(schedule.shape.stage_of(pp_rank, c));
    model::StageSpec spec{spans[ms].first, spans[ms].end, ms == 0, ms == model_stages - 1};
    stages_.push_back(sh.spec.make_stage(spec, o_.seed, factories));
    std::string init_source;
    if (const auto* w = initial_weights(o_, sh.spec, &init_source)) model::load_initial(*stages_.back(), *w, init_source);
    // Synchronised batch norm: statistics of the whole batch, summed over the dp group (the
    // ranks of one micro-batch), so dp N computes what one rank does.
    if (o_.dp > 1 && !o_.batch_norm_local)
      stages_.back()->set_batch_stats_reduce([dp = mesh_.dp_ptr()](std::span<double> v) { dp->all_reduce(v); });
  }
  if (factories.conv) layout_line_ = factories.conv->describe();  // after the stages placed their layers
  std::vector<nn::Param*> params = stage_params();
  if (o_.dp > 1 || o_.zero > 0) {
    parallel::DataParallelOptions dpo;
    dpo.zero = o_.zero;
    if (o_.bucket_bytes > 0) dpo.bucket_bytes = o_.bucket_bytes;
    dpo.bf16_wire = o_.comm_dtype == kernels::Precision::bf16;
    dpo.exact_sums = o_.exact_sums > 0;
    dpo.allreduce = comm::parse_algorithm(o_.allreduce).value_or(comm::Algorithm::automatic);
    // The tied token table of the first and last stage: a bucket of its own, so both stages
    // slice it alike over dp and can sum their slices of its gradient.
    for (auto& stage : stages_)
      if (nn::Param* tied = stage->tied_param()) dpo.own_bucket.push_back(tied);
    ddp_ = std::make_unique<parallel::DataParallel>(units(), mesh_.dp_ptr(), dpo);
    params = ddp_->optimizer_params();
  }
  std::vector<pipeline::StageRunner*> runners;
  for (auto& stage : stages_) {
    std::function<void(bool)> sync;
    if (ddp_) sync = [d = ddp_.get()](bool last) { d->set_sync(last); };
    runners_.push_back(std::make_unique<StageDriver>(*stage, hooks(), sync, o_.recompute));
    runners.push_back(runners_.back().get());
    if (gpt && sh.cfg.has_skip()) {  // a skip connection whose ends sit on two stages: a portal
      auto stage_of_block = [&](int64_t b) {
        for (int st = 0; st < stages; ++st)
          if (b >= spans[st].first && b < spans[st].end) return st;
        return -1;
      };
      const int from = stage_of_block(sh.cfg.skip_from), to = stage_of_block(sh.cfg.skip_to);
      const int here = schedule.shape.stage_of(pp_rank, static_cast<int>(runners_.size()) - 1);
      if (from != to) runners_.back()->set_portal_stages(here == from ? to : -1, here == to ? from : -1);
    } else if (!portals.to.empty() && !chimera) {  // (Chimera refused any portal above)
      const size_t here = static_cast<size_t>(schedule.shape.stage_of(pp_rank, static_cast<int>(runners_.size()) - 1));
      runners_.back()->set_portal_stages(portals.to[here], portals.from[here]);
    }
  }
  exec_ = std::make_unique<pipeline::Executor>(schedule, pp_rank, o_.pp > 1 ? &mesh_.pp_group() : nullptr,
                                               runners, o_.threads, o_.precision);
  if (o_.exact_sums > 0) {  // every gradient a float64 total of slices (TrainOptions::exact_sums)
    exec_->set_grad_slices(o_.exact_sums / o_.dp);
    for (nn::Param* p : model_params()) p->grad_exact.assign(static_cast<size_t>(p->local_numel()), 0.0);
  }
  if (o_.schedule == "pipedream-2bw") {  // train/weight_versions.h
    if (o_.pp > 1) {
      versions_ = std::make_unique<WeightVersions>(
          stage_params(), [this] { finish_local_grads(); }, [this] { zero_grads(); }, ddp_ != nullptr);
      for (auto& r : runners_) r->set_versions(versions_.get());
    } else {
      two_bw_reference_ = true;
      for (nn::Param* p : stage_params()) reference_prev_.push_back(p->value.clone());
    }
  }
  if (o_.schedule == "pipedream") {  // train/weight_stash.h
    const int stages = schedule.shape.stages();
    for (size_t c = 0; c < stages_.size(); ++c) {
      std::vector<nn::Param*> own;
      stages_[c]->collect_params(own);
      const int st = schedule.shape.stage_of(pp_rank, static_cast<int>(c));
      stashes_.push_back(std::make_unique<WeightStash>(own, stages - 1 - st, /*strict=*/o_.pp > 1));
      runners_[c]->set_stash(stashes_.back().get(), [this, c](int64_t k) { update_pipedream(c, k); }, o_.microbatches);
    }
  }
  if (chimera) {
    // The two copies of each model stage (rank r's down stage and rank pp-1-r's up stage) sum
    // their gradients over this pair; the token table's two ends are then both on ranks 0 and
    // pp-1 (sync_tied_grad sums them there, with no group).
    replica_ = world.split(mesh_.coord().dp * o_.tp * o_.pp + mesh_.coord().tp * o_.pp + std::min(pp_rank, o_.pp - 1 - pp_rank),
                           pp_rank, "chimera pair");
  } else if (o_.pp > 1 && gpt) {
    // The tied token table: the first stage's copy and the last stage's sum their gradients
    // over this group (one pair per (dp, tp) position). Models without a tied parameter
    // (the CNNs) need no such group.
    const bool holds_wte = pp_rank == 0 || pp_rank == o_.pp - 1;
    emb_ = world.split(holds_wte ? mesh_.coord().dp * o_.tp + mesh_.coord().tp : comm::kNoColor, pp_rank,
                       "embedding");
  }
  optimizer_ = make_optimizer(params, o_.optim, o_.threads);
  if (!stashes_.empty()) {  // pipedream: an optimizer per stage (the reference holds several on its one rank)
    if (stages_.size() == 1) stage_optimizers_.push_back(optimizer_.get());
    for (size_t c = 0; stages_.size() > 1 && c < stages_.size(); ++c) {
      std::vector<nn::Param*> own;
      stages_[c]->collect_params(own);
      owned_stage_optimizers_.push_back(make_optimizer(own, o_.optim, o_.threads));
      stage_optimizers_.push_back(owned_stage_optimizers_.back().get());
    }
  }
  // The gradient noise scale under dp: each bucket's local squared norm as its all-reduce
  // starts. Left out with exact sums (the float64 totals bypass the float32 buckets) and with
  // a token table tied across pipeline stages (its local gradient is split over two ranks, and
  // the squared norm of the sum would need their dot product).
  if (ddp_ && o_.dp > 1 && o_.exact_sums == 0 && !emb_ && o_.schedule != "pipedream-2bw" &&
      o_.schedule != "pipedream") {
    ddp_->measure_local_grad_sq([wte = wte_copy(), tp = mesh_.coord().tp](const nn::Param* p) {
      return p != wte && p->shard.counted_on(tp);
    });
    noise_.emplace();
  }
  {
    std::map<const nn::Param*, size_t> index;
    for (nn::Param* p : model_params()) index.emplace(p, index.size());
    for (nn::Param* q : optimizer_->params()) origin_index_.push_back(index.at(ddp_ ? ddp_->origin(q) : q));
  }
  optimizer_->set_param_sq_reduce([this](std::span<double> sq, size_t k) { reduce_param_sq(sq, k); });
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
    // The layers' kernel calls (convolutions) on the rank's kernels track.
    exec_->set_kernel_spans([rec, rank](const char* name, auto t0, auto t1) {
      rec->add({rank, trace::Track::kernels, name, "conv", rec->to_us(t0), rec->to_us(t1)});
    });
  }
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

// For the message of a failed metrics write: what stays `latest`, and that its step's line
// comes back on --resume.
std::string RankTrainer::kept_checkpoint() const {
  if (o_.checkpoint_dir.empty()) return "";
  if (!saved_step_) return "; no checkpoint had been saved yet";
  return "; the latest checkpoint stays " + step_folder_name(*saved_step_) + " in " + o_.checkpoint_dir +
         " (it records its step's metrics line, which --resume writes back); free space and continue with --resume";
}

StateBytes RankTrainer::state_bytes() {
  StateBytes s;
  if (ddp_) {
    auto mem = ddp_->memory();
    s.params = mem.param_bytes, s.grads = mem.grad_bytes;
  } else {
    for (nn::Param* p : stage_params()) s.params += p->value.bytes(), s.grads += p->grad.bytes();
  }
  s.optimizer = optimizer_->state_bytes();
  return s;
}

// The squared gradient norm of the whole model, the same on every rank. Each rank adds what it
// holds — the parameters of its stages, or under ZeRO its dp slices of them — counting a
// tp-replicated gradient on tp rank 0 only, an owned one on its owner (ShardSpec::counted_on) and
// the last stage's copy of the tied wte not at all;
// the sums then run over dp (only when the ranks hold disjoint slices), tp and pp.
double RankTrainer::global_grad_sq() {
  const bool sliced = ddp_ && o_.zero >= 1;
  double here = 0;
  for (nn::Param* q : sliced ? ddp_->optimizer_params() : norm_params()) {
    const nn::Param* p = sliced ? ddp_->origin(q) : q;
    if (p == wte_copy() || !p->shard.counted_on(mesh_.coord().tp)) continue;
    here += kernels::sum_squares(q->grad.data(), q->grad.numel(), o_.threads);
  }
  std::array<double, 1> sq{here};
  if (sliced && o_.dp > 1) mesh_.dp_group().all_reduce(sq);
  if (o_.tp > 1) mesh_.tp_group().all_reduce(sq);
  return pp_sum(sq[0]);
}

// Per-parameter sums of squares over the whole logical tensors (LAMB's trust ratios), the same
// on every rank that holds a part of a tensor. The sums are added into one vector indexed by
// the origin parameter's place in model_params() — under ZeRO a rank's segments are pieces of
// the flat buckets, so a parameter may be cut between ranks and a rank may hold pieces of many
// — then summed over the dp group when ZeRO slices the state (without ZeRO every dp rank holds
// the whole tensors already), and over the tp group with a replicated parameter counted on tp
// rank 0 only. Each parameter lives on one pipeline stage (the last stage's copy of the tied
// wte equals the first stage's), so nothing runs over pp. Both collectives are decided by the
// layout alone, so every rank of a group makes them.
void RankTrainer::reduce_param_sq(std::span<double> sq, size_t per_param) {
  const bool sliced = ddp_ && o_.zero >= 1;
  if (!(sliced && o_.dp > 1) && o_.tp == 1) return;
  const std::vector<nn::Param*> origins = model_params();
  std::vector<double> whole(origins.size() * per_param, 0.0);
  for (size_t i = 0; i < origin_index_.size(); ++i)
    for (size_t j = 0; j < per_param; ++j) whole[origin_index_[i] * per_param + j] += sq[i * per_param + j];
  if (sliced && o_.dp > 1) mesh_.dp_group().all_reduce(whole);
  // Owned parameters (--branch-parallel): the tp ranks hold different parameters, so `whole` is
  // indexed differently on each and cannot be summed over tp; nor need it be, with no split
  // parameter there — an owned tensor lies whole on its owner, a replicated one is equal on every
  // rank. Every rank of a tp group decides alike (the ranks of a stage with Inception blocks
  // each own at least one branch; a stage without holds none).
  bool owned = false;
  for (const nn::Param* p : origins) owned |= p->shard.is_owned();
  if (o_.tp > 1 && !owned) {
    if (mesh_.coord().tp != 0)
      for (size_t g = 0; g < origins.size(); ++g)
        if (!origins[g]->shard.is_split())
          for (size_t j = 0; j < per_param; ++j) whole[g * per_param + j] = 0.0;
    mesh_.tp_group().all_reduce(whole);
  }
  for (size_t i = 0; i < origin_index_.size(); ++i)
    for (size_t j = 0; j < per_param; ++j) sq[i * per_param + j] = whole[origin_index_[i] * per_param + j];
}

}  // namespace detail

using namespace detail;

const char* intra_flag(IntraSplit s) {
  switch (s) {
    case IntraSplit::spatial: return "spatial";
    case IntraSplit::branch: return "branch-parallel";
    default: return "tp";
  }
}

std::string mesh_str(const TrainOptions& o) {
  const char* axis = o.intra == IntraSplit::spatial ? "spatial" : o.intra == IntraSplit::branch ? "branch" : "tp";
  return "dp=" + std::to_string(o.dp) + " " + axis + "=" + std::to_string(o.tp) + " pp=" + std::to_string(o.pp);
}

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

std::string trace_svg_path(const std::string& trace) {
  std::string svg = trace;
  if (svg.size() > 5 && svg.compare(svg.size() - 5, 5, ".json") == 0) svg.resize(svg.size() - 5);
  return svg + ".svg";
}

namespace {
// The model the options name: a graph built in code, a named model, a model file or a config.
std::shared_ptr<const model::ModelSpec> model_of(const TrainOptions& o) {
  if (o.graph) return o.graph->tokens() ? model::gpt_spec(model::gpt_config(*o.graph)) : model::cnn_spec(model::cnn_config(o.graph));
  return o.config_file.empty() ? model::model_spec(o.model) : model::model_spec_from_file(o.config_file);
}
}  // namespace

const std::vector<std::pair<std::string, Tensor>>* initial_weights(const TrainOptions& o, const model::ModelSpec& spec,
                                                                   std::string* source) {
  if (o.initial_weights) {
    *source = o.initial_source.empty() ? std::string("--init-from") : o.initial_source;
    return o.initial_weights.get();
  }
  const model::CNNConfig* cnn = spec.cnn();
  if (o.init_from_seed || !cnn || !cnn->graph || !cnn->graph->initial) return nullptr;
  *source = "the weights of " + (o.model.empty() ? cnn->graph->name : o.model);
  return cnn->graph->initial.get();
}

model::GPTConfig resolve_options(TrainOptions& o) {
  const auto spec = model_of(o);
  // Step-0 weights given (--init-from FILE) or carried: every tensor of the model, in its shape.
  std::string init_source;
  if (const auto* w = initial_weights(o, *spec, &init_source)) {
    std::map<std::string, Shape> have;
    for (const auto& [name, t] : *w) have[name] = t.shape();
    auto all = spec->param_shapes();
    for (const auto& b : spec->buffer_shapes()) all.push_back(b);
    for (const auto& [name, shape] : all) {
      auto it = have.find(name);
      if (it == have.end())
        throw std::invalid_argument(init_source + " has no tensor '" + name + "', which " + spec->name() +
                                    " needs; give the weights of the same network (or --init-from seed)");
      if (it->second != shape)
        throw std::invalid_argument(init_source + " holds '" + name + "' as " + shape_str(it->second) + ", and " +
                                    spec->name() + "'s is " + shape_str(shape) + "; give the weights of the same network");
    }
  }
  if (!spec->gpt()) throw bad(spec->name() + " is an image model; resolve_options resolves a token model's options");
  model::GPTConfig cfg = *spec->gpt();
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
  if (o.optim.decay_steps == 0) o.optim.decay_steps = o.steps;
  if (!o.optim.weight_decay) o.optim.weight_decay = default_weight_decay(o.optim.kind);
  return cfg;
}

namespace {
// An image model's options: its batch, a "sequence" of one image, and validate_image_options.
void resolve_image_options(TrainOptions& o, const model::ModelSpec& spec) {
  if (o.seq != -1 && o.seq != 1)
    throw bad("--seq is the sequence length of token models; " + spec.name() + " reads whole images: drop --seq");
  if (o.batch == -1) o.batch = spec.default_batch();
  o.seq = 1;
  if (comm::launched_by_mpirun()) o.backend = "mpi";
  const Machine machine = Machine::probe();
  validate_image_options(o, spec, machine);
  if (o.threads == 0) {
    const int64_t local_ranks = o.backend == "mpi" ? 1 : int64_t{o.dp} * o.tp * o.pp + o.ps_servers;
    o.threads = static_cast<int>(std::max<int64_t>(1, machine.cores / local_ranks));
  }
  if (o.optim.decay_steps == 0) o.optim.decay_steps = o.steps;
  if (!o.optim.weight_decay) o.optim.weight_decay = default_weight_decay(o.optim.kind);
}

// The images of --data: the name fashion-mnist, a directory of IDX files or an .npz, never a text
// or token file.
ImageDataset open_images(const TrainOptions& o, const model::ModelSpec& spec) {
  std::error_code ec;
  if (o.data != ImageDataset::kFashionMnist && std::filesystem::is_regular_file(o.data, ec) &&
      !io::looks_like_numpy(o.data))
    throw bad(spec.name() + " is an image model: --data " + o.data + " is a file that is not NumPy's; give --data " +
              ImageDataset::kFashionMnist + " (the Debian package dataset-fashion-mnist), a directory "
              "holding the four IDX files, or an .npz holding x_train, y_train, x_test and y_test");
  ImageDataset d = ImageDataset::open(o.data, o.data_layout);
  d.fit_to(spec, "--data");
  return d;
}
}  // namespace

TrainResult train(TrainOptions o) {
  TrainResult res;
  res.start_rss_mb = current_rss_mb();
  const std::shared_ptr<const model::ModelSpec> spec = model_of(o);
  res.model = spec->name();
  if (!o.pp_cuts.empty()) o.pp_balance = stage_counts_at(*spec, o);  // by name, as counts
  std::optional<TokenDataset> tokens;
  std::optional<ImageDataset> images;
  if (spec->gpt()) {
    if (o.augment || o.batch_norm_local || o.data_layout != ImageLayout::automatic)
      throw bad(std::string(o.augment ? "--augment" : o.batch_norm_local ? "--batch-norm local" : "--data-layout") +
                " applies to image models; " + spec->name() + " reads tokens: drop it");
    res.config = resolve_options(o);
    if (std::filesystem::is_directory(o.data))
      throw bad(res.config.name + " is a token model: --data " + o.data +
                " is a directory (image models read a directory of IDX files); give a text file or a uint16 .bin "
                "token file");
    if (o.data == ImageDataset::kFashionMnist)
      throw bad(res.config.name + " is a token model: --data " + o.data +
                " names images; give a text file or a uint16 .bin token file");
    tokens.emplace(TokenDataset::open(o.data, o.val_fraction, o.seq));
    validate_dataset(o, res.config, *tokens);  // vocabulary and split lengths (train/validate.h)
    if (o.ps_servers > 0) {
      if (o.on_checked) o.on_checked(o);
      return train_parameter_server(o, res.config, *tokens);  // train/ps_trainer.h
    }
  } else {
    resolve_image_options(o, *spec);
    images.emplace(open_images(o, *spec));
    if (o.ps_servers > 0) {
      if (o.on_checked) o.on_checked(o);
      return train_parameter_server(o, *spec, *images);  // train/ps_trainer.h
    }
  }
  if (o.backend == "mpi" && comm::mpi_world()->size() != o.dp * o.tp * o.pp)
    throw bad("mpirun started " + std::to_string(comm::mpi_world()->size()) +
              " processes but the layout " + mesh_str(o) +
              " needs " + std::to_string(o.dp * o.tp * o.pp) + "; make dp * tp * pp equal -np");
  const bool lead = o.backend != "mpi" || comm::mpi_world()->rank() == 0;
  // Checkpoints are settled before any rank starts: what to resume from (verified, and
  // matching this run), or that a new run will not overwrite another run's step folders.
  std::optional<CheckpointIndex> resume = prepare_checkpoints(o, *spec, lead);
  if (o.on_checked) o.on_checked(o);
  std::unique_ptr<trace::Recorder> recorder;
  if (!o.trace.empty()) recorder = std::make_unique<trace::Recorder>();
  Shared sh{o,   res.config, *spec, tokens ? &*tokens : nullptr, images ? &*images : nullptr,
            res, recorder.get(), resume ? &*resume : nullptr};
  const int world = o.dp * o.tp * o.pp;
  comm::Backend backend = o.backend == "mpi" ? comm::Backend::mpi : comm::Backend::threads;
  comm::ThreadsOptions threads_opts;
  threads_opts.threads_per_rank = o.threads;  // ranks of one thread that outnumber the cores are bound to them
  comm::run_world(backend, backend == comm::Backend::mpi ? 0 : world, [&](comm::Communicator& w) {
    // --ranks-per-host: emulated hosts on threads, an override of mpirun's under mpi (before the
    // mesh splits the world: the groups inherit their ranks' hosts).
    if (o.ranks_per_host > 0) w.set_hosts(comm::hosts_in_blocks(w.size(), o.ranks_per_host), w.host_link());
    RankTrainer rank(w, sh);
    rank.run();
  }, threads_opts);
  if (recorder) write_trace(*recorder, o);
  return res;
}

}  // namespace meshtrain::train
