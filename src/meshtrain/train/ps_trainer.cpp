// Parameter-server training: the worker loop (pull, forward/backward on this worker's rows,
// push) and the server loop (the optimizer over the shard as the rounds close), for a token
// model (GPT) or an image model (the whole model as one stage). See ps_trainer.h and
// parallel/data/param_server.h.
#include "meshtrain/train/ps_trainer.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <span>
#include <thread>
#include <map>

#include "meshtrain/comm/world.h"
#include "meshtrain/kernels/adamw.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/parallel/data/param_server.h"
#include "meshtrain/pipeline/executor.h"
#include "meshtrain/train/layout.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/stage_runner.h"

namespace meshtrain::train {

namespace {

using Clock = std::chrono::steady_clock;

std::invalid_argument bad(const std::string& msg) { return std::invalid_argument(msg); }

void check_ps(const TrainOptions& o) {
  if (o.ps_servers < 1) throw bad("train_parameter_server needs --ps-servers of at least 1");
  if (o.staleness < -1)
    throw bad("--staleness must be 0 (synchronous), a positive bound, or inf (unbounded, asynchronous; also -1)");
  if (o.zero > 0) throw bad("ZeRO and the parameter server are two ways to shard; choose one (drop --zero or --ps-servers)");
  if (o.tp > 1 || o.pp > 1)
    throw bad("the parameter server runs whole-model workers; use --tp 1 --pp 1 with --ps-servers");
  if (o.checkpoint_every > 0 || o.resume || o.save_initial)
    throw bad("the parameter server does not write or read checkpoints yet; drop --checkpoint-every, "
              "--resume and --save-initial, or run without --ps-servers");
  if (!(o.slow_worker_factor >= 1)) throw bad("--slow-worker must be at least 1 (the factor worker 0's step is slowed by)");
}

struct Shared {
  const TrainOptions& o;
  const model::GPTConfig* cfg;   // token models
  const model::ModelSpec* spec;  // image models
  const TokenDataset* tokens;    // token models
  const ImageDataset* images;    // image models
  TrainResult& res;
  PSRunLog& log;
};

// ---- a model whose parameters are views of two flat buffers (params() order) ----

struct FlatModel {
  std::unique_ptr<model::GPT> gpt;      // token models
  std::unique_ptr<model::Stage> stage;  // image models: the whole model as one stage
  std::vector<nn::Param*> params;
  std::vector<int64_t> offsets;
  Tensor values, grads;  // (numel)

  FlatModel(const Shared& sh, uint64_t seed) {
    if (sh.images) {
      // Single-rank layers (no factories), layout-invariant initialisation by name: the
      // parameters the all-reduce trainer's one rank starts from.
      stage = sh.spec->make_stage(model::StageSpec{0, -1, true, true}, seed, model::StageFactories{});
      std::string init_source;
      if (const auto* w = initial_weights(sh.o, *sh.spec, &init_source)) model::load_initial(*stage, *w, init_source);
      stage->collect_params(params);
    } else {
      gpt = std::make_unique<model::GPT>(*sh.cfg, seed);
      params = gpt->params();
    }
    int64_t n = 0;
    for (nn::Param* p : params) offsets.push_back(n), n += p->numel();
    values = Tensor::empty({n});
    grads = Tensor({n});
    for (size_t i = 0; i < params.size(); ++i) {
      std::memcpy(values.data() + offsets[i], params[i]->value.data(), params[i]->value.bytes());
      params[i]->value = Tensor::view(values, offsets[i], params[i]->local_shape());
      params[i]->grad = Tensor::view(grads, offsets[i], params[i]->local_shape());
    }
  }
  std::span<float> vspan() { return {values.data(), static_cast<size_t>(values.numel())}; }
  std::span<float> gspan() { return {grads.data(), static_cast<size_t>(grads.numel())}; }
};

parallel::PSLayout layout_for(const TrainOptions& o, const FlatModel& m) {
  return parallel::PSLayout::make(o.dp, o.ps_servers, m.values.numel());
}

// ---- server rank ----

void run_server(comm::Communicator& world, std::shared_ptr<comm::Communicator> servers, Shared& sh, int j) {
  const TrainOptions& o = sh.o;
  // Layout-invariant initialisation: the full model's values hold the shard's true values.
  auto init = std::make_unique<FlatModel>(sh, o.seed);
  const parallel::PSLayout L = layout_for(o, *init);
  const int64_t lo = L.off[j], hi = L.off[j] + L.n[j];
  Tensor values = Tensor::empty({L.n[j]}), grad({L.n[j]});
  // Segment parameters: this shard's part of each parameter (the ZeRO pattern), so the optimizer
  // applies each one's weight-decay flag; origin[k]: the parameter segment k is part of.
  std::vector<std::unique_ptr<nn::Param>> segs;
  std::vector<size_t> origin;
  const size_t n_params = init->params.size();
  {
    std::memcpy(values.data(), init->values.data() + lo, values.bytes());
    for (size_t i = 0; i < init->params.size(); ++i) {
      const int64_t s = std::max(lo, init->offsets[i]);
      const int64_t e = std::min(hi, init->offsets[i] + init->params[i]->numel());
      if (s >= e) continue;
      auto seg = std::make_unique<nn::Param>();
      seg->name = init->params[i]->name + "@" + std::to_string(s - init->offsets[i]);
      seg->global_shape = {e - s};
      seg->decay = init->params[i]->decay;
      seg->value = Tensor::view(values, s - lo, {e - s});
      seg->grad = Tensor::view(grad, s - lo, {e - s});
      segs.push_back(std::move(seg));
      origin.push_back(i);
    }
  }
  init.reset();
  std::vector<nn::Param*> ptrs;
  for (auto& s : segs) ptrs.push_back(s.get());
  OptimizerConfig ac = o.optim;
  parallel::PSServerOptions so;
  so.staleness = o.staleness;
  so.budget = o.steps * o.dp;
  if (o.staleness != 0) so.push_clip = ac.grad_clip, ac.grad_clip = 0;  // clipped per push instead
  std::vector<parallel::PSRead> holds;
  if (j == 0) so.on_hold = [&holds](const parallel::PSRead& h) { holds.push_back(h); };
  std::unique_ptr<Optimizer> opt = make_optimizer(ptrs, ac, o.threads);
  // LAMB's per-tensor norms: a parameter may be cut between servers, so each server adds its
  // segments' sums into a vector over all parameters and the servers sum it (in the same round
  // order as the gradient norm's sum below).
  opt->set_param_sq_reduce([&](std::span<double> sq, size_t k) {
    if (!servers) return;
    std::vector<double> whole(n_params * k, 0.0);
    for (size_t i = 0; i < origin.size(); ++i)
      for (size_t j = 0; j < k; ++j) whole[origin[i] * k + j] += sq[i * k + j];
    servers->all_reduce(whole);
    for (size_t i = 0; i < origin.size(); ++i)
      for (size_t j = 0; j < k; ++j) sq[i * k + j] = whole[origin[i] * k + j];
  });
  auto norm_reduce = [&](double local) {
    if (!servers) return local;
    std::array<double, 1> v{local};
    servers->all_reduce(v);  // synchronous rounds close in the same order on every server
    return v[0];
  };
  parallel::ParameterServer ps(
      world, L, j, {values.data(), static_cast<size_t>(L.n[j])}, {grad.data(), static_cast<size_t>(L.n[j])}, so,
      [&](int64_t round) {
        parallel::PSUpdate u;
        u.grad_norm = opt->step(round, norm_reduce);
        u.lr = lr_at(o.optim, round);
        return u;
      });
  ps.serve();
  if (j == 0) {
    sh.log.reads = ps.reads();
    sh.log.holds = std::move(holds);
    sh.log.pushes = ps.pushes();
    sh.log.samples = 0;
    for (int64_t p : ps.pushes()) sh.log.samples += p * (o.batch / o.dp);
  }
}

// ---- worker rank ----

class WorkerLoop {
 public:
  // `workers`: the workers-only group (staleness 0 with an image model; else null): batch
  // norm's statistics (unless --batch-norm local) and the batch's accuracy are summed over it.
  WorkerLoop(comm::Communicator& world, std::shared_ptr<comm::Communicator> workers, Shared& sh, int w);
  void run();

 private:
  float evaluate();
  std::pair<float, float> evaluate_images();  // validation loss and accuracy
  double token_step(int64_t clock);
  double image_step(int64_t clock);
  void report(const std::vector<parallel::PSRound>& rounds);
  bool images() const { return sh_.images != nullptr; }

  Shared& sh_;
  const TrainOptions& o_;
  int w_;
  bool lead_;
  FlatModel model_;
  parallel::PSWorker client_;
  std::shared_ptr<comm::Communicator> workers_;
  // Image models: the stage as the executor drives it (the all-reduce trainer's pp 1 path).
  std::unique_ptr<StageDriver> driver_;
  std::unique_ptr<pipeline::Executor> exec_;
  ImageRows image_rows_;            // a step's images, labels and micro-batch rows (image models)
  std::vector<int32_t> tok_, lab_;  // a step's token ids and targets (token models)
  std::map<int64_t, float> accuracy_;  // worker 0, staleness 0: the batch's accuracy by step
  std::unique_ptr<MetricsWriter> metrics_;
  double last_t_ = 0, peak_gflops_ = 0;
  int64_t pushes_ = 0;  // applied by server 0 so far
};

WorkerLoop::WorkerLoop(comm::Communicator& world, std::shared_ptr<comm::Communicator> workers, Shared& sh, int w)
    : sh_(sh),
      o_(sh.o),
      w_(w),
      lead_(w == 0),
      model_(sh, o_.seed),
      client_(world, layout_for(o_, model_), w),
      workers_(std::move(workers)) {
  if (!images()) return;
  // Synchronised batch norm over the workers (staleness 0: they compute step c together), so
  // W workers compute the statistics one rank does, as dp ranks do over their group.
  if (workers_ && o_.dp > 1 && !o_.batch_norm_local)
    model_.stage->set_batch_stats_reduce([g = workers_](std::span<double> v) { g->all_reduce(v); });
  driver_ = std::make_unique<StageDriver>(*model_.stage, nullptr, nullptr, /*recompute=*/false);
  exec_ = std::make_unique<pipeline::Executor>(make_pipeline_schedule(o_), 0, nullptr,
                                               std::vector<pipeline::StageRunner*>{driver_.get()}, o_.threads,
                                               o_.precision);
}

// Image models: worker 0 alone, every validation batch in slices of a worker's rows (as the dp
// ranks take them), the loss and accuracy over every counted image.
std::pair<float, float> WorkerLoop::evaluate_images() {
  const ImageDataset& d = *sh_.images;
  const int64_t B = o_.batch, rows = B / o_.dp;
  const int64_t n = std::min(o_.eval_batches, d.num_eval_batches(Split::val, B));
  const int64_t per = d.channels() * d.height() * d.width();
  std::vector<float> img(rows * per);
  std::vector<int32_t> lab(rows);
  std::array<double, 3> a{0, 0, 0};  // loss sum, correct, counted
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t r0 = 0; r0 < B; r0 += rows) {
      d.eval_batch(Split::val, j, B, r0, r0 + rows, img.data(), lab.data());
      driver_->set_batches({.images = img.data(), .sample_floats = per, .targets = lab.data(), .rows = rows, .T = 1},
                           1.f);
      exec_->forward_only(1);
      for (const model::StageResult& r : driver_->results())
        a[0] += static_cast<double>(r.loss) * static_cast<double>(r.counted), a[1] += static_cast<double>(r.correct),
            a[2] += static_cast<double>(r.counted);
    }
  }
  return {static_cast<float>(a[0] / std::max(1.0, a[2])), static_cast<float>(a[1] / std::max(1.0, a[2]))};
}

float WorkerLoop::evaluate() {
  // Worker 0 alone, over the whole validation batch in slices of a worker's rows.
  const int64_t B = o_.batch, T = o_.seq, rows = B / o_.dp;
  std::vector<int32_t> tok(rows * T), tgt(rows * T);
  double sum = 0;
  for (int64_t j = 0; j < o_.eval_batches; ++j) {
    for (int64_t r0 = 0; r0 < B; r0 += rows) {
      sh_.tokens->batch(Split::val, DataOrder::random, o_.seed, j, B, T, r0, r0 + rows, tok.data(), tgt.data());
      nn::Context ctx(o_.threads, /*training=*/false, o_.precision);
      sum += model_.gpt->forward(ctx, tok.data(), tgt.data(), rows, T) / static_cast<double>(o_.dp);
    }
  }
  return static_cast<float>(sum / static_cast<double>(o_.eval_batches));
}

void WorkerLoop::report(const std::vector<parallel::PSRound>& rounds) {
  const int64_t T = o_.seq, rows = o_.batch / o_.dp;
  for (const parallel::PSRound& pr : rounds) {
    StepRecord r;
    r.step = pr.round;
    r.loss = static_cast<float>(pr.loss);
    r.lr = static_cast<float>(pr.lr);
    r.grad_norm = pr.grad_norm;
    pushes_ += pr.pushes;
    sh_.log.round_pushes.push_back(pr.pushes);
    r.step_ms = (pr.t_s - last_t_) * 1e3;
    last_t_ = pr.t_s;
    r.tokens_per_s = static_cast<double>(pr.pushes * rows * T) / std::max(1e-9, r.step_ms / 1e3);
    const double flops_per_token = images() ? sh_.spec->flops_per_sample(1) : sh_.cfg->flops_per_token(T);
    r.mfu = flops_per_token * r.tokens_per_s / (peak_gflops_ * 1e9);
    r.peak_rss_mb = peak_rss_mb();
    // Staleness 0: round r is step r's W pushes, whose accuracy the workers summed.
    if (auto it = accuracy_.find(pr.round); it != accuracy_.end() && o_.staleness == 0) {
      r.accuracy = it->second;
      accuracy_.erase(it);
    }
    nlohmann::json line = step_json(r);
    if (images()) line["images_per_s"] = r.tokens_per_s;  // T is 1: samples per second
    if (r.accuracy) line["accuracy"] = *r.accuracy;
    line["staleness"] = pr.staleness;
    line["pushes"] = pr.pushes;
    metrics_->write(line);
    if (o_.on_step) o_.on_step(line);
    if (!o_.quiet && o_.log_every > 0 && (r.step + 1) % o_.log_every == 0) {
      std::printf("round %5lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f %s | staleness %lld\n",
                  static_cast<long long>(r.step + 1), r.loss, r.lr, r.grad_norm, r.step_ms, r.tokens_per_s,
                  images() ? "img/s" : "tok/s",
                  static_cast<long long>(pr.staleness));
      std::fflush(stdout);
    }
    sh_.res.steps.push_back(r);
  }
}

// Token models: this worker's B / W rows, cut into its micro-batches.
double WorkerLoop::token_step(int64_t clock) {
  const int64_t B = o_.batch, T = o_.seq, M = o_.microbatches;
  const int64_t rows = B / o_.dp / M, row0 = w_ * (B / o_.dp);
  tok_.resize(rows * T), lab_.resize(rows * T);
  double loss = 0;
  for (int64_t mb = 0; mb < M; ++mb) {
    const int64_t r0 = row0 + mb * rows;
    sh_.tokens->batch(Split::train, o_.data_order, o_.seed, clock, B, T, r0, r0 + rows, tok_.data(), lab_.data());
    nn::Context ctx(o_.threads, /*training=*/true, o_.precision);
    loss += model_.gpt->forward(ctx, tok_.data(), lab_.data(), rows, T) / static_cast<double>(M);
    model_.gpt->backward(ctx, 1.0f / static_cast<float>(M));
  }
  return loss;
}

// Image models: a worker takes the rows a dp rank takes (train/stage_runner.h: image_rows), so
// with the statistics summed over the workers each micro-batch's batch norm is one rank's
// micro-batch k; dropout's masks are keyed by (step, the sample's place in the global batch).
double WorkerLoop::image_step(int64_t clock) {
  const int64_t M = o_.microbatches;
  driver_->set_batches(image_rows(*sh_.images, o_, clock, w_, image_rows_), 1.0f / static_cast<float>(M));
  exec_->set_weights_epoch(clock);
  exec_->run_step();
  double loss = 0;  // the mean over the micro-batches, as the all-reduce trainer adds it
  std::array<double, 2> acc{0, 0};  // correct, counted
  for (const model::StageResult& r : driver_->results())
    loss += r.loss / static_cast<double>(M), acc[0] += static_cast<double>(r.correct),
        acc[1] += static_cast<double>(r.counted);
  if (workers_) {
    if (o_.dp > 1) workers_->all_reduce(acc);
    if (lead_) accuracy_[clock] = static_cast<float>(acc[0] / std::max(1.0, acc[1]));
  }
  return loss;
}

void WorkerLoop::run() {
  const int64_t B = o_.batch, T = o_.seq;
  if (lead_) {
    metrics_ = std::make_unique<MetricsWriter>(o_.metrics);
    peak_gflops_ = measured_gemm_gflops(o_.threads, o_.precision) * o_.dp;
    if (!o_.quiet) {
      char slowed[64];
      std::snprintf(slowed, sizeof slowed, " | worker 0 slowed %.2gx", o_.slow_worker_factor);
      std::string shape = std::to_string(B);
      if (images()) {
        shape += " images";
      } else {
        shape += " x ";
        shape += std::to_string(T);
      }
      std::printf("model %s: %lld parameters | batch %s | parameter server: %d workers (ranks 0-%d) + "
                  "%d server(s) (ranks %d-%d) | staleness %s | %d thread(s) per rank%s\n",
                  images() ? sh_.spec->name().c_str() : sh_.cfg->name.c_str(),
                  static_cast<long long>(model_.values.numel()), shape.c_str(), o_.dp, o_.dp - 1, o_.ps_servers,
                  o_.dp, o_.dp + o_.ps_servers - 1,
                  o_.staleness < 0 ? "unbounded" : std::to_string(o_.staleness).c_str(), o_.threads,
                  o_.slow_worker_factor > 1 ? slowed : "");
      std::fflush(stdout);
    }
  }
  const auto t_start = Clock::now();
  int64_t clock = 0;
  for (;; ++clock) {
    if (!client_.pull(clock, model_.vspan())) break;
    const auto t0 = Clock::now();
    model_.grads.zero();
    const double loss = images() ? image_step(clock) : token_step(clock);
    const double sq = kernels::sum_squares(model_.grads.data(), model_.grads.numel(), o_.threads);
    // A non-finite loss or gradient is never pushed: this worker stops the run, and the
    // failure it raises ends every other rank's wait (the world aborts with this reason), so
    // no server applies anything of this step.
    if (!std::isfinite(loss) || !std::isfinite(sq)) {
      const double v = std::isfinite(loss) ? std::sqrt(sq) : loss;
      throw TrainingDiverged("training stopped at step " + std::to_string(clock + 1) + ": worker " +
                             std::to_string(w_) + "'s " + (std::isfinite(loss) ? "gradient norm" : "loss") + " is " +
                             (std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") +
                             " (the run diverged); it was not pushed, so nothing of it reached the weights; "
                             "lower --lr (or lengthen --warmup)");
    }
    if (w_ == 0 && o_.slow_worker_factor > 1) {
      // Test flag: a slower machine. Sleeping leaves the core to the other ranks.
      std::this_thread::sleep_for((Clock::now() - t0) * (o_.slow_worker_factor - 1));
    }
    client_.push(clock, model_.gspan(), loss, sq);
    if (lead_) report(client_.take_rounds());
  }
  client_.finish(lead_ ? model_.vspan() : std::span<float>());
  if (!lead_) return;
  report(client_.take_rounds());
  metrics_->close();
  const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
  TrainResult& res = sh_.res;
  res.wall_s = wall;
  sh_.log.wall_s = wall;
  if (images()) {
    const auto [val, acc] = evaluate_images();
    res.final_val_loss = val, res.final_val_accuracy = acc;
  } else {
    res.final_val_loss = evaluate();
  }
  if (!res.steps.empty()) {
    res.steps.back().val_loss = res.final_val_loss;
    res.steps.back().val_accuracy = res.final_val_accuracy;
  }
  if (!o_.quiet) {
    const double samples = static_cast<double>(pushes_ * (B / o_.dp));
    std::string acc;  // as the all-reduce trainer's summary says it
    if (res.final_val_accuracy) {
      acc = " | test accuracy ";
      acc += std::to_string(100.0 * *res.final_val_accuracy).substr(0, 5);
      acc += "%";
    }
    std::printf("done: %lld rounds, %.0f samples (worker 0 pushed %lld times) in %.2f s = %.1f samples/s | "
                "final validation loss %.4f%s\n",
                static_cast<long long>(res.steps.size()), samples, static_cast<long long>(clock), wall,
                samples / wall, *res.final_val_loss, acc.c_str());
    std::fflush(stdout);
  }
}

}  // namespace

namespace {

TrainResult run_ps(const TrainOptions& o, const model::GPTConfig* cfg, const model::ModelSpec* spec,
                   const TokenDataset* tokens, const ImageDataset* images, PSRunLog* log) {
  check_ps(o);
  TrainResult res;
  if (cfg) res.config = *cfg;
  res.model = spec ? spec->name() : cfg->name;
  PSRunLog local_log;
  PSRunLog& lg = log ? *log : local_log;
  const int world = o.dp + o.ps_servers;
  if (o.backend == "mpi" && comm::mpi_world()->size() != world)
    throw bad("mpirun started " + std::to_string(comm::mpi_world()->size()) + " processes but " +
              std::to_string(o.dp) + " workers and " + std::to_string(o.ps_servers) + " servers need " +
              std::to_string(world) + "; make --dp plus --ps-servers equal -np");
  Shared sh{o, cfg, spec, tokens, images, res, lg};
  comm::Backend backend = o.backend == "mpi" ? comm::Backend::mpi : comm::Backend::threads;
  comm::run_world(backend, backend == comm::Backend::mpi ? 0 : world, [&](comm::Communicator& w) {
    const bool server = w.rank() >= o.dp;
    // Synchronous rounds close in the same order everywhere: servers sum their partial squares
    // for the global clipping norm over a servers-only group.
    std::shared_ptr<comm::Communicator> servers;
    if (o.staleness == 0 && o.ps_servers > 1) servers = w.split(server ? 0 : comm::kNoColor, w.rank(), "ps_servers");
    // Image models at staleness 0: the workers compute each step together, so they can sum
    // batch norm's statistics and the batch's accuracy over a workers-only group.
    std::shared_ptr<comm::Communicator> workers;
    if (images && o.staleness == 0) workers = w.split(server ? comm::kNoColor : 0, w.rank(), "ps_workers");
    if (server) {
      run_server(w, servers, sh, w.rank() - o.dp);
    } else {
      WorkerLoop loop(w, workers, sh, w.rank());
      loop.run();
    }
  });
  return res;
}

}  // namespace

TrainResult train_parameter_server(const TrainOptions& o, const model::GPTConfig& cfg, const TokenDataset& data,
                                   PSRunLog* log) {
  return run_ps(o, &cfg, nullptr, &data, nullptr, log);
}

TrainResult train_parameter_server(const TrainOptions& o, const model::ModelSpec& spec, const ImageDataset& data,
                                   PSRunLog* log) {
  if (spec.input() != model::InputKind::images)
    throw bad(spec.name() + " reads tokens; train_parameter_server takes an image model with an ImageDataset");
  return run_ps(o, nullptr, &spec, nullptr, &data, log);
}

}  // namespace meshtrain::train
