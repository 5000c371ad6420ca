#include "meshtrain/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <thread>

#include "meshtrain/model/gpt.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/metrics.h"

namespace meshtrain::train {

namespace {

using Clock = std::chrono::steady_clock;

std::invalid_argument bad(const std::string& msg) { return std::invalid_argument(msg); }

// ---- option checks ----

void check_layout(const TrainOptions& o) {
  if (o.dp < 1 || o.tp < 1 || o.pp < 1)
    throw bad("--dp, --tp and --pp must each be at least 1");
  if (o.microbatches < 1) throw bad("--microbatches must be at least 1");
  static const char* schedules[] = {"gpipe", "1f1b", "interleaved", "zb"};
  if (std::find_if(std::begin(schedules), std::end(schedules),
                   [&](const char* s) { return o.schedule == s; }) == std::end(schedules))
    throw bad("--schedule must be gpipe, 1f1b, interleaved or zb, not '" + o.schedule + "'");
  if (o.zero < 0 || o.zero > 3) throw bad("--zero must be 0, 1, 2 or 3");
  if (o.backend != "threads" && o.backend != "mpi")
    throw bad("--backend must be threads or mpi, not '" + o.backend + "'");
  // The parallel drivers land with their issues; until then say so instead of pretending.
  if (o.dp > 1) throw bad("data parallelism (--dp > 1) is not available in this build yet; run with --dp 1");
  if (o.tp > 1) throw bad("tensor parallelism (--tp > 1) is not available in this build yet; run with --tp 1");
  if (o.pp > 1) throw bad("pipeline parallelism (--pp > 1) is not available in this build yet; run with --pp 1");
  if (o.zero > 0) throw bad("ZeRO (--zero > 0) needs data parallelism, which is not available in this build yet; run with --zero 0");
  if (o.backend == "mpi") throw bad("the mpi backend is not wired into training yet; run with --backend threads");
}

// ---- evaluation ----

float evaluate(model::GPT& gpt, const TokenDataset& data, const TrainOptions& o, int threads) {
  const int64_t B = o.batch, T = o.seq;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  double sum = 0;
  for (int64_t j = 0; j < o.eval_batches; ++j) {
    data.batch(Split::val, DataOrder::random, o.seed, j, B, T, 0, B, tok.data(), tgt.data());
    nn::Context ctx(threads, /*training=*/false);
    sum += gpt.forward(ctx, tok.data(), tgt.data(), B, T);
  }
  return static_cast<float>(sum / static_cast<double>(o.eval_batches));
}

// ---- checkpoints ----

nlohmann::json run_config(const model::GPTConfig& cfg, const TrainOptions& o) {
  return {{"model", cfg.to_json()},
          {"batch", o.batch},
          {"seq", o.seq},
          {"seed", o.seed},
          {"data_order", to_string(o.data_order)},
          {"steps", o.steps}};
}

void save(const std::string& dir, int64_t step, model::GPT& gpt, const AdamW& adam,
          const model::GPTConfig& cfg, const TrainOptions& o, int keep) {
  CheckpointRefs refs;
  refs.step = step;
  refs.config = run_config(cfg, o);
  refs.state = {{"updates", adam.updates()}, {"data_position", step}};
  for (nn::Param* p : gpt.params()) refs.model.emplace_back(p->name, &p->value);
  auto opt_state = adam.state_tensors();
  for (auto& [n, t] : opt_state) refs.optimizer.emplace_back(n, &t);
  save_checkpoint(dir, refs, keep);
}

int64_t restore(const std::string& dir, model::GPT& gpt, AdamW& adam, const model::GPTConfig& cfg,
                const TrainOptions& o) {
  CheckpointData ck = load_checkpoint(dir);
  nlohmann::json want = run_config(cfg, o);
  for (const char* key : {"model", "batch", "seq", "seed", "data_order"})
    if (ck.config.value(key, nlohmann::json()) != want[key])
      throw bad("cannot resume from " + dir + ": it was saved with " + key + " = " +
                ck.config.value(key, nlohmann::json()).dump() + ", this run has " +
                want[key].dump() + "; use the same value or another --checkpoint-dir");
  std::map<std::string, Tensor*> by_name;
  for (nn::Param* p : gpt.params()) by_name[p->name] = &p->value;
  size_t found = 0;
  for (auto& [name, t] : ck.model) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;
    if (it->second->shape() != t.shape())
      throw bad("checkpoint tensor " + name + " has shape " + shape_str(t.shape()) +
                ", the model expects " + shape_str(it->second->shape()));
    it->second->copy_from(t);
    ++found;
  }
  if (found != by_name.size())
    throw bad("checkpoint in " + dir + " lacks " + std::to_string(by_name.size() - found) +
              " of the model's tensors");
  adam.load_state_tensors(ck.optimizer);
  adam.set_updates(ck.state.value("updates", ck.step));
  return ck.step;
}

// ---- progress output ----

void print_step(const StepRecord& r, int64_t steps) {
  std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | mfu %4.1f%%\n",
              static_cast<long long>(r.step + 1), static_cast<long long>(steps), r.loss, r.lr,
              r.grad_norm, r.step_ms, r.tokens_per_s, 100.0 * r.mfu);
  std::fflush(stdout);
}

}  // namespace

model::GPTConfig resolve_options(TrainOptions& o) {
  model::GPTConfig cfg =
      o.config_file.empty() ? model::gpt_config(o.model) : model::gpt_config_from_file(o.config_file);
  if (o.batch < 0) o.batch = cfg.batch;
  if (o.seq < 0) o.seq = cfg.seq;
  if (o.batch < 1) throw bad("--batch must be at least 1 (got " + std::to_string(o.batch) + ")");
  if (o.seq < 1 || o.seq > cfg.block_size)
    throw bad("--seq must be between 1 and the model's " + std::to_string(cfg.block_size) +
              " positions (got " + std::to_string(o.seq) + ")");
  if (o.steps < 1) throw bad("--steps must be at least 1");
  if (o.data.empty()) throw bad("--data is required: a text file or a uint16 token file (.bin)");
  check_layout(o);
  if (o.batch % o.microbatches != 0)
    throw bad("--batch " + std::to_string(o.batch) + " is not divisible by --microbatches " +
              std::to_string(o.microbatches));
  if (!(o.adam.lr > 0)) throw bad("--lr must be positive");
  if (o.eval_batches < 1) throw bad("--eval-batches must be at least 1");
  if (o.checkpoint_every < 0) throw bad("--checkpoint-every must be 0 (never) or positive");
  if ((o.checkpoint_every > 0 || o.resume || o.save_initial) && o.checkpoint_dir.empty())
    throw bad("--checkpoint-every, --resume and --save-initial need --checkpoint-dir DIR");
  if (o.threads == 0) {
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    o.threads = std::max(1, cores / (o.dp * o.tp * o.pp));
  }
  if (o.adam.decay_steps == 0) o.adam.decay_steps = o.steps;
  return cfg;
}

TrainResult train(TrainOptions o) {
  TrainResult res;
  res.config = resolve_options(o);
  const model::GPTConfig& cfg = res.config;
  const int64_t B = o.batch, T = o.seq, M = o.microbatches, rows = B / M;
  TokenDataset data = TokenDataset::open(o.data, o.val_fraction, T);
  if (data.vocab_size() > cfg.vocab_size)
    throw bad("the data file " + o.data + " has token ids up to " +
              std::to_string(data.vocab_size() - 1) + " but the model's vocabulary is " +
              std::to_string(cfg.vocab_size) + "; use a model with a larger vocab_size");

  model::GPT gpt(cfg, o.seed);
  AdamW adam(gpt.params(), o.adam, o.threads);
  if (o.resume) {
    if (latest_checkpoint(o.checkpoint_dir)) {
      res.start_step = restore(o.checkpoint_dir, gpt, adam, cfg, o);
      if (!o.quiet) std::printf("resumed from %s at step %lld\n", o.checkpoint_dir.c_str(),
                                static_cast<long long>(res.start_step));
    } else if (!o.quiet) {
      std::printf("no checkpoint in %s yet; starting from step 0\n", o.checkpoint_dir.c_str());
    }
  }
  if (o.save_initial && res.start_step == 0) save(o.checkpoint_dir, 0, gpt, adam, cfg, o, 0);

  const double flops_per_step = cfg.flops_per_token(T) * static_cast<double>(B * T);
  const double peak_gflops = measured_gemm_gflops(o.threads);
  if (!o.quiet)
    std::printf("model %s: %lld parameters | batch %lld x %lld | %d thread(s) | data %s (%lld train tokens)\n",
                cfg.name.c_str(), static_cast<long long>(cfg.num_params()),
                static_cast<long long>(B), static_cast<long long>(T), o.threads, o.data.c_str(),
                static_cast<long long>(data.num_tokens(Split::train)));
  MetricsWriter metrics(o.metrics, /*append=*/res.start_step > 0);
  std::vector<int32_t> tok(rows * T), tgt(rows * T);
  auto t_start = Clock::now();

  for (int64_t step = res.start_step; step < o.steps; ++step) {
    auto t0 = Clock::now();
    gpt.zero_grad();
    double loss = 0;
    for (int64_t mb = 0; mb < M; ++mb) {
      data.batch(Split::train, o.data_order, o.seed, step, B, T, mb * rows, (mb + 1) * rows,
                 tok.data(), tgt.data());
      nn::Context ctx(o.threads);
      loss += gpt.forward(ctx, tok.data(), tgt.data(), rows, T) / static_cast<double>(M);
      gpt.backward(ctx, 1.0f / static_cast<float>(M));
    }
    StepRecord r;
    r.step = step;
    r.loss = static_cast<float>(loss);
    r.lr = lr_at(o.adam, step);
    r.grad_norm = adam.step(step);
    r.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    r.tokens_per_s = static_cast<double>(B * T) / (r.step_ms / 1e3);
    r.mfu = flops_per_step / (r.step_ms / 1e3) / (peak_gflops * 1e9);
    r.peak_rss_mb = peak_rss_mb();
    bool last = step + 1 == o.steps;
    if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || last))
      r.val_loss = evaluate(gpt, data, o, o.threads);

    nlohmann::json line = {{"step", step + 1},        {"loss", r.loss},
                           {"lr", r.lr},              {"grad_norm", r.grad_norm},
                           {"tokens_per_s", r.tokens_per_s}, {"step_ms", r.step_ms},
                           {"mfu", r.mfu},            {"peak_rss_mb", r.peak_rss_mb}};
    if (r.val_loss) line["val_loss"] = *r.val_loss;
    metrics.write(line);
    if (!o.quiet && o.log_every > 0 && ((step + 1) % o.log_every == 0 || last)) print_step(r, o.steps);
    if (!o.quiet && r.val_loss)
      std::printf("step %5lld | validation loss %.4f\n", static_cast<long long>(step + 1), *r.val_loss);
    res.steps.push_back(r);
    if (o.checkpoint_every > 0 && ((step + 1) % o.checkpoint_every == 0 || last))
      save(o.checkpoint_dir, step + 1, gpt, adam, cfg, o, o.keep_checkpoints);
  }
  res.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (!res.steps.empty() && res.steps.back().val_loss) {
    res.final_val_loss = res.steps.back().val_loss;
  } else {
    res.final_val_loss = evaluate(gpt, data, o, o.threads);
  }
  if (!o.quiet) {
    std::printf("done: %lld steps in %.1f s | final validation loss %.4f | peak RSS %.0f MiB\n",
                static_cast<long long>(res.steps.size()), res.wall_s, *res.final_val_loss,
                peak_rss_mb());
    std::fflush(stdout);
  }
  return res;
}

}  // namespace meshtrain::train
