// Reporting of the rank loop: the start-up header, one progress line per step, the pipeline's
// actions on the trace, the run's summary, and the trace files with their overlap figures.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <span>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/io/file.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/pipeline/svg.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/rank_trainer.h"
#include "meshtrain/train/swimlane.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::train::detail {

namespace {
std::string fmt_mib(double mib) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", mib);
  return buf;
}
}  // namespace

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

void print_step(const StepRecord& r, int64_t steps, const std::string& tail) {
  if (r.accuracy) {  // a classifier: its batch accuracy, and samples are images
    std::printf("step %5lld/%lld | loss %.4f | acc %5.1f%% | lr %.2e | norm %.3f | %7.1f ms | %8.0f img/s | mfu %4.1f%%%s\n",
                static_cast<long long>(r.step + 1), static_cast<long long>(steps), r.loss, 100.0 * *r.accuracy, r.lr,
                r.grad_norm, r.step_ms, r.tokens_per_s, 100.0 * r.mfu, tail.c_str());
    std::fflush(stdout);
    return;
  }
  std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | mfu %4.1f%%%s\n",
              static_cast<long long>(r.step + 1), static_cast<long long>(steps), r.loss, r.lr,
              r.grad_norm, r.step_ms, r.tokens_per_s, 100.0 * r.mfu, tail.c_str());
  std::fflush(stdout);
}

void RankTrainer::print_validation(const StepRecord& r) const {
  if (r.val_accuracy)
    std::printf("step %5lld | validation loss %.4f | test accuracy %.2f%%\n", static_cast<long long>(r.step + 1),
                *r.val_loss, 100.0 * *r.val_accuracy);
  else
    std::printf("step %5lld | validation loss %.4f\n", static_cast<long long>(r.step + 1), *r.val_loss);
}

void RankTrainer::print_header() {
  const auto& cfg = sh_.cfg;
  // The threads backend binds ranks that outnumber the cores (comm::core_binding).
  std::string bound;
  if (o_.backend != "mpi") {
    const std::vector<int> cores = comm::core_binding(mesh_.world().size(), o_.threads);
    if (!cores.empty())
      bound = " (bound to the " + std::to_string(std::set<int>(cores.begin(), cores.end()).size()) + " cores in turn)";
  }
  int64_t n_params = 0;
  for (const auto& [name, shape] : sh_.spec.param_shapes()) n_params += shape_numel(shape);
  if (sh_.images)
    std::printf("model %s: %lld parameters | batch %lld images | %s | %d thread(s) per rank%s | data %s (%lld train, "
                "%lld test images)\n",
                sh_.spec.name().c_str(), static_cast<long long>(n_params), static_cast<long long>(o_.batch),
                mesh_str(o_).c_str(), o_.threads, bound.c_str(), sh_.images->path().c_str(),
                static_cast<long long>(sh_.images->num_images(Split::train)),
                static_cast<long long>(sh_.images->num_images(Split::val)));
  if (sh_.images && !sh_.images->describe().empty()) std::printf("%s\n", sh_.images->describe().c_str());
  if (!sh_.images)
    std::printf("model %s: %lld parameters | batch %lld x %lld | %s | %d thread(s) per rank%s | data %s (%lld train tokens)\n",
                cfg.name.c_str(), static_cast<long long>(cfg.num_params()),
                static_cast<long long>(o_.batch), static_cast<long long>(o_.seq),
                mesh_str(o_).c_str(), o_.threads, bound.c_str(), o_.data.c_str(),
                static_cast<long long>(sh_.tokens->num_tokens(Split::train)));
  if (!layout_line_.empty()) std::printf("layout: %s\n", layout_line_.c_str());
  std::printf("%s\n", describe(o_.optim).c_str());
  if (noise_ && !o_.batch_norm_local && !sh_.spec.buffer_shapes().empty())
    note("the gradient noise scale needs --batch-norm local: with batch norm synchronised over dp a rank's "
         "gradient carries the other ranks' rows, and the estimate of |G|^2 comes out negative on most steps "
         "(resnet-small at dp 2: 295 of 300), so grad_noise_scale is rarely reported (README, the gradient noise scale)");
  if (o_.precision == kernels::Precision::bf16) {
    const std::string isa = kernels::bf16_isa();
    if (isa == "emulated") note("--precision bf16: " + kernels::bf16_fallback_note());
    if (isa == "avx512_core_bf16")
      note("--precision bf16: this CPU has no AMX tiles; oneDNN runs the bf16 products on AVX512-BF16 dot "
           "products instead (about twice float32's rate, where AMX reaches several times it)");
    std::printf("precision bf16: matrix products with bf16 operands and float32 accumulation on %s%s; "
                "master weights, Adam, layer norm, softmax and loss in float32 | bf16 GEMM rate %.1f GFLOP/s "
                "per thread (float32 %.1f; MFU is against the bf16 rate)\n",
                isa.c_str(), isa == "emulated" ? " (see the note above)" : " (oneDNN)",
                measured_gemm_gflops(1, kernels::Precision::bf16), measured_gemm_gflops(1));
  }
  {
    // This rank's tensor memory as the planner's memory model predicts it (plan/cost.h): the
    // figure the end of the run compares with the peak each rank held.
    const double MiB = 1024.0 * 1024.0;
    try {
      const std::vector<plan::RankMemory> mem = plan::predict_memory(sh_.spec, plan_layout(o_, spans_));
      const plan::RankMemory& m = mem.at(static_cast<size_t>(mesh_.coord().pp));
      std::printf("memory of rank 0 (memory model): params %.1f + grads %.1f + optimizer %.1f + activations %.1f "
                  "(%d micro-batch(es) in flight) + backward transients %.1f%s = %.1f MiB of tensors\n",
                  m.params / MiB, m.grads / MiB, m.optimizer / MiB, m.activations / MiB, m.in_flight, m.temp / MiB,
                  m.buffers > 0 ? (" + buffers " + fmt_mib(m.buffers / MiB)).c_str() : "", m.total() / MiB);
      analytic_mb_ = m.total() / MiB;
    } catch (const std::invalid_argument& e) {
      std::printf("memory model: no figure for this layout (%s)\n", e.what());
    }
  }
  if (o_.tp > 1) {
    // Tensor parallelism: this rank holds the replicated parameters whole and 1/tp of the split.
    int64_t rep = 0, split = 0, split_global = 0, padding = 0, owned = 0;
    for (nn::Param* p : stage_params()) {
      if (p->shard.is_owned()) {  // --branch-parallel: this rank's branches, whole
        owned += p->value.bytes();
      } else if (p->shard.is_split()) {
        split += p->value.bytes(), split_global += shape_numel(p->global_shape) * 4;
        if (p->shard.padded)  // rows added so that every rank holds ceil(rows / tp)
          padding = p->value.dim(p->shard.dim) * o_.tp - p->global_shape[p->shard.dim];
      } else {
        rep += p->value.bytes();
      }
    }
    if (owned) {
      std::printf("parameters of rank 0 (branch group of %d): replicated %lld + its branches' %lld = %lld bytes\n",
                  o_.tp, static_cast<long long>(rep), static_cast<long long>(owned), static_cast<long long>(rep + owned));
    } else {
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
  if (const auto& p = sh_.res.predicted) {
    const double MiB = 1024.0 * 1024.0;
    std::printf("predicted (cost model, %s): step %.2f ms (compute %.2f incl. tp %.2f, exposed dp %.2f, optimizer %.2f; "
                "bubble %.0f%%) | peak tensor memory per rank %.1f MiB\n",
                o_.hardware_source.c_str(), 1e3 * p->step_s, 1e3 * p->compute_s, 1e3 * p->tp_comm_s, 1e3 * p->dp_comm_s,
                1e3 * p->optimizer_s, 100 * p->bubble, p->peak_bytes / MiB);
  }
  if (o_.dp > 1 || o_.zero > 0) {
    // ZeRO's per-rank state (the engine's buffers and the optimizer's moments) against the
    // analytic formula: 4 + 4 + 4 x (state tensors: AdamW and LAMB 2, SGD 1 or 0) bytes per
    // parameter the rank holds (its stages' tp-local elements), each term divided by dp from its
    // ZeRO stage on. One line per rank
    // (the first 8).
    const double d = o_.dp, MiB = 1024.0 * 1024.0;
    const auto& ranks = sh_.res.ranks;
    for (size_t r = 0; r < ranks.size() && r < 8; ++r) {
      const StateBytes& s = ranks[r].bytes;
      const double n = static_cast<double>(ranks[r].held_params);
      const double ap = 4 * n / (o_.zero >= 3 ? d : 1), ag = 4 * n / (o_.zero >= 2 ? d : 1),
                   ao = 4.0 * static_cast<double>(state_prefixes(o_.optim).size()) * n / (o_.zero >= 1 ? d : 1);
      const parallel::MeshCoord c = parallel::mesh_coord({o_.dp, o_.tp, o_.pp}, static_cast<int>(r));
      std::printf("state of rank %zu (dp %d, tp %d, pp %d; zero %d, %.0f parameters in its part of the model): params %.2f + grads %.2f "
                  "+ optimizer %.2f MiB | analytic %.2f + %.2f + %.2f MiB\n",
                  r, c.dp, c.tp, c.pp, o_.zero, n, s.params / MiB, s.grads / MiB, s.optimizer / MiB, ap / MiB,
                  ag / MiB, ao / MiB);
    }
    if (ranks.size() > 8) std::printf("(state of the other %zu ranks: see the same formula)\n", ranks.size() - 8);
  }
  std::fflush(stdout);
}

// Writes the Chrome trace and, beside it, the SVG swimlane (each atomically: a failure leaves
// the previous file and throws io::WriteError naming the file); prints what it wrote and the
// overlap figure.
void write_trace(const trace::Recorder& rec, const TrainOptions& o) {
  rec.write_chrome_json(o.trace);
  const std::string svg = trace_svg_path(o.trace);
  const auto events = rec.events();
  bool drawn = false;
  for (const auto& e : events) drawn = drawn || e.category == "forward";
  if (drawn) try {  // the measured swimlane, from the first step on (train/swimlane.h)
      pipeline::write_svg(measured_swimlane(events, "meshtrain train " + o.model + ": " +
                                                        mesh_str(o) +
                                                        (o.pp > 1 ? ", " + o.schedule : std::string()) + ", " +
                                                        std::to_string(o.microbatches) + " micro-batch(es)"),
                          svg);
    } catch (const io::WriteError& e) {
      throw io::WriteError(std::string(e.what()) + " (the trace " + o.trace + " was written)");
    }
  if (o.quiet) return;
  auto all = rec.events();
  std::vector<trace::Event> dp, rest, pp;  // dp collectives run async; tp ones inline in compute
  for (auto& e : all) (e.category == "tp-comm" ? rest : e.category == "pp-comm" ? pp : dp).push_back(e);
  std::printf("trace: %s (Perfetto / chrome://tracing)", o.trace.c_str());
  if (drawn) std::printf(" and %s", svg.c_str());
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
  if (const double conv_ms = trace::busy_us(all, 0, trace::Track::kernels) / 1e3; conv_ms > 0)
    std::printf(" | rank 0: convolutions %.1f ms = %.0f%% of its %.1f ms of compute-track time", conv_ms,
                100.0 * conv_ms / std::max(1e-9, compute_ms), compute_ms);
  std::printf("\n");
}

// ---- the end of the run ----

void RankTrainer::print_summary(float final_val, std::optional<float> final_acc, int stopped) {
  const TrainResult& res = sh_.res;
  const double rss = peak_rss_mb();
  char loss_text[48];
  std::snprintf(loss_text, sizeof loss_text, " | final validation loss %.4f", final_val);
  const std::string val =
      stopped ? std::string(" (stopped early, not evaluated)")
              : loss_text + (final_acc ? " | test accuracy " + std::to_string(100.0 * *final_acc).substr(0, 5) + "%"
                                       : std::string());
  // The process's peak against its prediction: what it held before training (libraries, the
  // program) plus the start-up check's estimate of this process (every rank's tensors by the
  // memory model, the data, the validation batches).
  const double MiB = 1024.0 * 1024.0;
  const MemoryEstimate est = estimate_memory(o_, sh_.spec);
  const double predicted = res.start_rss_mb + est.total() / MiB;
  std::printf("done: %lld steps in %.1f s%s | peak RSS %.0f MiB, %.2fx the predicted %.0f MiB (the process at start "
              "%.0f + tensors of its %d rank(s) %.0f + data %.0f + validation batches %.0f)\n",
              static_cast<long long>(res.steps.size()), res.wall_s, val.c_str(), rss, rss / predicted, predicted,
              res.start_rss_mb, est.ranks, (est.params + est.grads + est.optimizer + est.activations) / MiB,
              est.data / MiB, est.eval / MiB);
  const char* wire = o_.comm_dtype == kernels::Precision::bf16 ? "bf16" : "fp32";
  auto per_step = [&](uint64_t StepRecord::*field) {
    double sent = 0;
    for (const StepRecord& s : res.steps) sent += static_cast<double>(s.*field);
    return sent / static_cast<double>(std::max<size_t>(1, res.steps.size()));
  };
  if (res.predicted && !res.steps.empty()) report_prediction();
  if (o_.dp > 1)
    std::printf("data-parallel traffic: rank 0 sent %.0f bytes per step (gradients on the wire as %s)\n",
                per_step(&StepRecord::comm_bytes_sent), o_.exact_sums > 0 ? "float64 totals, --exact-sums" : wire);
  if (o_.tp > 1)
    std::printf("tensor-parallel traffic: rank 0 sent %.0f bytes per step (activations on the wire as %s)\n",
                per_step(&StepRecord::tp_bytes_sent), wire);
  std::fflush(stdout);
}

void note(const std::string& text) {
  std::fprintf(stderr, "meshtrain: note: %s\n", text.c_str());
  std::fflush(stderr);
}

void RankTrainer::report_prediction() {
  const TrainResult& res = sh_.res;
  const plan::Prediction& p = *res.predicted;
  const double MiB = 1024.0 * 1024.0;
  const size_t n = res.steps.size();
  const std::string which = n >= 5 ? "median of steps " + std::to_string(res.steps[2].step + 1) + "-" +
                                         std::to_string(res.steps.back().step + 1)
                                   : "median of " + std::to_string(n) + " step(s)";
  std::printf("predicted against measured: step %.2f ms vs %.2f ms (%s), error %+.1f%%",
              1e3 * p.step_s, 1e3 * res.measured_step_s, which.c_str(),
              res.measured_step_s > 0 ? 100 * (p.step_s - res.measured_step_s) / res.measured_step_s : 0.0);
  // Peak memory: per pipeline rank the prediction, against the most any rank at that pp
  // position held (ranks of one stage hold alike).
  double worst = 0;
  int worst_rank = 0;
  for (size_t r = 0; r < res.peak_tensor_bytes.size(); ++r) {
    const parallel::MeshCoord c = parallel::mesh_coord({o_.dp, o_.tp, o_.pp}, static_cast<int>(r));
    const plan::RankMemory& pm = p.memory.at(static_cast<size_t>(c.pp));
    const double predicted = pm.by_tp_rank.empty() ? pm.total() : pm.by_tp_rank.at(static_cast<size_t>(c.tp));
    const double measured = static_cast<double>(res.peak_tensor_bytes[r]);
    const double err = measured > 0 ? (predicted - measured) / measured : 0;
    if (r == 0 || std::abs(err) > std::abs(worst)) worst = err, worst_rank = static_cast<int>(r);
  }
  if (!res.peak_tensor_bytes.empty()) {
    const size_t r = static_cast<size_t>(worst_rank);
    const parallel::MeshCoord c = parallel::mesh_coord({o_.dp, o_.tp, o_.pp}, worst_rank);
    const plan::RankMemory& pm = p.memory.at(static_cast<size_t>(c.pp));
    std::printf(" | peak tensor memory of rank %d %.1f MiB vs %.1f MiB, error %+.1f%% (the largest error of the %zu ranks)",
                worst_rank, (pm.by_tp_rank.empty() ? pm.total() : pm.by_tp_rank.at(static_cast<size_t>(c.tp))) / MiB,
                static_cast<double>(res.peak_tensor_bytes[r]) / MiB, 100 * worst, res.peak_tensor_bytes.size());
  }
  std::printf("\n");
  // A prediction off by more than half its measurement: most likely rates measured while other
  // work held the cores (a quick calibration on a busy machine is cached for the next runs).
  if (res.measured_step_s > 0 && std::abs(p.step_s - res.measured_step_s) > 0.5 * res.measured_step_s)
    std::printf("note: the predicted step is %.1fx the measured one; the machine file (%s) was probably measured "
                "while other work used the cores, or this run shared them: measure again on a quiet machine with "
                "meshtrain calibrate --out FILE and pass --machine FILE (or delete the cached file)\n",
                p.step_s / res.measured_step_s, o_.hardware_source.c_str());
}

}  // namespace meshtrain::train::detail
