// Parameter-server training: the worker loop (pull, forward/backward on this worker's rows,
// push) and the server loop (the optimizer over the shard as the rounds close). See ps_trainer.h and
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

#include "meshtrain/comm/world.h"
#include "meshtrain/kernels/adamw.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/parallel/data/param_server.h"
#include "meshtrain/train/metrics.h"

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

// ---- a model whose parameters are views of two flat buffers (params() order) ----

struct FlatModel {
  std::unique_ptr<model::GPT> gpt;
  std::vector<nn::Param*> params;
  std::vector<int64_t> offsets;
  Tensor values, grads;  // (numel)

  FlatModel(const model::GPTConfig& cfg, uint64_t seed) : gpt(std::make_unique<model::GPT>(cfg, seed)) {
    params = gpt->params();
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

struct Shared {
  const TrainOptions& o;
  const model::GPTConfig& cfg;
  const TokenDataset& data;
  TrainResult& res;
  PSRunLog& log;
};

parallel::PSLayout layout_for(const TrainOptions& o, const FlatModel& m) {
  return parallel::PSLayout::make(o.dp, o.ps_servers, m.values.numel());
}

// ---- server rank ----

void run_server(comm::Communicator& world, std::shared_ptr<comm::Communicator> servers, Shared& sh, int j) {
  const TrainOptions& o = sh.o;
  // Layout-invariant initialisation: the full model's values hold the shard's true values.
  auto init = std::make_unique<FlatModel>(sh.cfg, o.seed);
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
  WorkerLoop(comm::Communicator& world, Shared& sh, int w)
      : sh_(sh), o_(sh.o), w_(w), lead_(w == 0), model_(sh.cfg, o_.seed), client_(world, layout_for(o_, model_), w) {}
  void run();

 private:
  float evaluate();
  void report(const std::vector<parallel::PSRound>& rounds);

  Shared& sh_;
  const TrainOptions& o_;
  int w_;
  bool lead_;
  FlatModel model_;
  parallel::PSWorker client_;
  std::unique_ptr<MetricsWriter> metrics_;
  double last_t_ = 0, peak_gflops_ = 0;
  int64_t pushes_ = 0;  // applied by server 0 so far
};

float WorkerLoop::evaluate() {
  // Worker 0 alone, over the whole validation batch in slices of a worker's rows.
  const int64_t B = o_.batch, T = o_.seq, rows = B / o_.dp;
  std::vector<int32_t> tok(rows * T), tgt(rows * T);
  double sum = 0;
  for (int64_t j = 0; j < o_.eval_batches; ++j) {
    for (int64_t r0 = 0; r0 < B; r0 += rows) {
      sh_.data.batch(Split::val, DataOrder::random, o_.seed, j, B, T, r0, r0 + rows, tok.data(), tgt.data());
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
    r.mfu = sh_.cfg.flops_per_token(T) * r.tokens_per_s / (peak_gflops_ * 1e9);
    r.peak_rss_mb = peak_rss_mb();
    nlohmann::json line = step_json(r);
    line["staleness"] = pr.staleness;
    line["pushes"] = pr.pushes;
    metrics_->write(line);
    if (!o_.quiet && o_.log_every > 0 && (r.step + 1) % o_.log_every == 0) {
      std::printf("round %5lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | staleness %lld\n",
                  static_cast<long long>(r.step + 1), r.loss, r.lr, r.grad_norm, r.step_ms, r.tokens_per_s,
                  static_cast<long long>(pr.staleness));
      std::fflush(stdout);
    }
    sh_.res.steps.push_back(r);
  }
}

void WorkerLoop::run() {
  const int64_t B = o_.batch, T = o_.seq, M = o_.microbatches;
  const int64_t rows = B / o_.dp / M, row0 = w_ * (B / o_.dp);
  if (lead_) {
    metrics_ = std::make_unique<MetricsWriter>(o_.metrics);
    peak_gflops_ = measured_gemm_gflops(o_.threads, o_.precision) * o_.dp;
    if (!o_.quiet) {
      char slowed[64];
      std::snprintf(slowed, sizeof slowed, " | worker 0 slowed %.2gx", o_.slow_worker_factor);
      std::printf("model %s: %lld parameters | batch %lld x %lld | parameter server: %d workers (ranks 0-%d) + "
                  "%d server(s) (ranks %d-%d) | staleness %s | %d thread(s) per rank%s\n",
                  sh_.cfg.name.c_str(), static_cast<long long>(sh_.cfg.num_params()), static_cast<long long>(B),
                  static_cast<long long>(T), o_.dp, o_.dp - 1, o_.ps_servers, o_.dp, o_.dp + o_.ps_servers - 1,
                  o_.staleness < 0 ? "unbounded" : std::to_string(o_.staleness).c_str(), o_.threads,
                  o_.slow_worker_factor > 1 ? slowed : "");
      std::fflush(stdout);
    }
  }
  std::vector<int32_t> tok(rows * T), tgt(rows * T);
  const auto t_start = Clock::now();
  int64_t clock = 0;
  for (;; ++clock) {
    if (!client_.pull(clock, model_.vspan())) break;
    const auto t0 = Clock::now();
    model_.grads.zero();
    double loss = 0;
    for (int64_t mb = 0; mb < M; ++mb) {
      const int64_t r0 = row0 + mb * rows;
      sh_.data.batch(Split::train, o_.data_order, o_.seed, clock, B, T, r0, r0 + rows, tok.data(), tgt.data());
      nn::Context ctx(o_.threads, /*training=*/true, o_.precision);
      loss += model_.gpt->forward(ctx, tok.data(), tgt.data(), rows, T) / static_cast<double>(M);
      model_.gpt->backward(ctx, 1.0f / static_cast<float>(M));
    }
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
  res.final_val_loss = evaluate();
  if (!res.steps.empty()) res.steps.back().val_loss = res.final_val_loss;
  if (!o_.quiet) {
    const double samples = static_cast<double>(pushes_ * (B / o_.dp));
    std::printf("done: %lld rounds, %.0f samples (worker 0 pushed %lld times) in %.2f s = %.1f samples/s | "
                "final validation loss %.4f\n",
                static_cast<long long>(res.steps.size()), samples, static_cast<long long>(clock), wall,
                samples / wall, *res.final_val_loss);
    std::fflush(stdout);
  }
}

}  // namespace

TrainResult train_parameter_server(const TrainOptions& o, const model::GPTConfig& cfg, const TokenDataset& data,
                                   PSRunLog* log) {
  check_ps(o);
  TrainResult res;
  res.config = cfg;
  PSRunLog local_log;
  PSRunLog& lg = log ? *log : local_log;
  const int world = o.dp + o.ps_servers;
  if (o.backend == "mpi" && comm::mpi_world()->size() != world)
    throw bad("mpirun started " + std::to_string(comm::mpi_world()->size()) + " processes but " +
              std::to_string(o.dp) + " workers and " + std::to_string(o.ps_servers) + " servers need " +
              std::to_string(world) + "; make --dp plus --ps-servers equal -np");
  Shared sh{o, cfg, data, res, lg};
  comm::Backend backend = o.backend == "mpi" ? comm::Backend::mpi : comm::Backend::threads;
  comm::run_world(backend, backend == comm::Backend::mpi ? 0 : world, [&](comm::Communicator& w) {
    const bool server = w.rank() >= o.dp;
    // Synchronous rounds close in the same order everywhere: servers sum their partial squares
    // for the global clipping norm over a servers-only group.
    std::shared_ptr<comm::Communicator> servers;
    if (o.staleness == 0 && o.ps_servers > 1) servers = w.split(server ? 0 : comm::kNoColor, w.rank(), "ps_servers");
    if (server) {
      run_server(w, servers, sh, w.rank() - o.dp);
    } else {
      WorkerLoop loop(w, sh, w.rank());
      loop.run();
    }
  });
  return res;
}

}  // namespace meshtrain::train
