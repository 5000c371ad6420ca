// What the rank loop does around each step (trainer.cpp: RankTrainer::run), in the order it
// calls them: beginning the run (--resume, the state and prediction figures, the header, the
// metrics file), the injected fault, the step's measurements (time, throughput, MFU, memory,
// traffic), rank 0's metrics line, the stop agreed at the step's end and the step's checkpoint,
// the step's report, and the end of the run. None of them changes what the step computes.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/io/file.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/rank_trainer.h"
#include "meshtrain/train/stop.h"

namespace meshtrain::train::detail {

namespace {
// Below this share of one rank's speed on the same cores, train notes that the layout does not
// pay (the bar issue 37 set for a split: 0.9x).
constexpr double kPaysAgainstOneRank = 0.9;
}  // namespace

// ---- beginning the run ----

// Returns the first step: the resumed checkpoint's, or 0.
int64_t RankTrainer::begin_run() {
  TrainResult& res = sh_.res;
  const bool talk = lead_ && !o_.quiet;
  const int64_t start = sh_.resume ? resume() : 0;
  if (o_.save_initial && start == 0) save(0);
  {  // every rank's state bytes and held parameters, for the result and the header
    const StateBytes mine = state_bytes();
    int64_t held = 0;
    for (nn::Param* p : stage_params()) held += p->local_numel();
    const int world = mesh_.world().size();
    std::vector<int64_t> all(4 * static_cast<size_t>(world));
    mesh_.world().all_gather(std::array<int64_t, 4>{mine.params, mine.grads, mine.optimizer, held}, all);
    if (lead_) {
      res.start_step = start, res.state_bytes = mine;
      res.ranks.clear();
      for (int r = 0; r < world; ++r)
        res.ranks.push_back({{all[4 * r], all[4 * r + 1], all[4 * r + 2]}, all[4 * r + 3]});
    }
  }
  flops_per_step_ = sh_.spec.flops_per_sample(o_.seq) * static_cast<double>(o_.batch);
  // MFU's peak: the GEMM rate of a rank's threads times the ranks that can run at once (threads
  // of one process share its cores: at most cores / threads of them compute together).
  const int concurrent = o_.backend == "mpi" ? mesh_.world().size()
                                             : std::max(1, std::min(mesh_.world().size(),
                                                                    static_cast<int>(std::thread::hardware_concurrency()) /
                                                                        std::max(1, o_.threads)));
  peak_gflops_ = measured_gemm_gflops(o_.threads, o_.precision) * concurrent;
  if (lead_ && o_.hardware) {
    try {
      res.predicted = plan::predict(sh_.spec, plan_layout(o_, spans_), *o_.hardware);
      if (talk)
        for (const std::string& n : res.predicted->notes) std::printf("cost model: note: %s\n", n.c_str());
      // A layout predicted well below one rank on the same cores: say so before the run spends them
      // (ranks as threads of this process; MPI ranks may be on other hosts).
      const auto one = o_.backend == "threads"
                           ? plan::against_one_rank(sh_.spec, plan_layout(o_, spans_), *o_.hardware, res.predicted->step_s)
                           : std::nullopt;
      if (talk && one && one->speed < kPaysAgainstOneRank)
        std::printf("cost model: note: one rank on the same cores (--threads %d) is predicted at %.2f ms a step against "
                    "this layout's %.2f ms, so this layout would run at %.2fx one rank's speed: it does not pay at this "
                    "size on this machine (meshtrain plan ranks the layouts)\n",
                    one->one_rank_threads, 1e3 * one->one_rank_step_s, 1e3 * res.predicted->step_s, one->speed);
    } catch (const std::invalid_argument& e) {  // a layout the model cannot describe: no prediction
      if (talk) std::printf("cost model: no prediction for this layout (%s)\n", e.what());
    }
  }
  if (talk) print_header();
  // --resume: train() kept the file's lines up to `start`; continue it.
  if (lead_) metrics_ = std::make_unique<MetricsWriter>(o_.metrics, /*append=*/o_.resume);
  t_start_ = Clock::now();
  if (lead_ && !o_.launch_status_file.empty())  // the supervising launcher learns the job is up (trainer.h)
    io::write_file_atomic(o_.launch_status_file, "running from step " + std::to_string(start) + "\n", "the launcher's status file");
  last_save_time_ = Clock::now();  // --checkpoint-every-s counts from the start or the last save
  return start;
}

// ---- before a step ----

// --fail-rank R --fail-at-step N: world rank R throws at the start of step N (0-based), as a rank
// lost mid-run (TrainOptions::fail_rank).
void RankTrainer::inject_fault(int64_t step) const {
  if (step == o_.fail_at_step && mesh_.rank() == o_.fail_rank)
    throw std::runtime_error("rank " + std::to_string(o_.fail_rank) + " failed: injected at step " +
                             std::to_string(step + 1) + " (--fail-rank " +
                             std::to_string(o_.fail_rank) + " --fail-at-step " + std::to_string(o_.fail_at_step) + ")");
}

StepMeter RankTrainer::start_meter() {
  StepMeter m;
  m.t0 = Clock::now();
  reset_tensor_bytes_peak_thread();  // this step's peak, without the last one's evaluation or save
  m.dp = mesh_.dp_group().stats(), m.tp = mesh_.tp_group().stats();
  return m;
}

// ---- inside the step: the pipeline's figures ----

// Every pp rank's figures of the step, for rank 0's metrics line: collectives of the pp group,
// made by every rank inside the step (train_step). The bubble of rank r is the idle share of
// the pipeline's step, (step - compute_r) / step, where the step is the longest rank's (all
// start together after the last step's collectives), as the simulator's makespan is.
PipelineFigures RankTrainer::gather_pipeline_figures(const pipeline::StepStats& st) {
  PipelineFigures f;
  std::vector<double> times(2 * o_.pp);
  mesh_.pp_group().all_gather(std::array<double, 2>{st.step_us, st.compute_us}, times);
  double step_us = 0;
  for (int r = 0; r < o_.pp; ++r) step_us = std::max(step_us, times[2 * r]);
  for (int r = 0; r < o_.pp; ++r) f.bubble.push_back(step_us > 0 ? (step_us - times[2 * r + 1]) / step_us : 0.0);
  f.peak_saved.resize(o_.pp), f.in_flight.resize(o_.pp);
  mesh_.pp_group().all_gather(std::array<int64_t, 1>{st.peak_saved_bytes}, f.peak_saved);
  mesh_.pp_group().all_gather(std::array<int64_t, 1>{st.max_in_flight}, f.in_flight);
  return f;
}

// ---- after a step ----

// The step's record: its results, and what it cost against the meter read at its start.
StepRecord RankTrainer::measure(int64_t step, const StepResult& out, const StepMeter& m) {
  StepRecord r;
  r.step = step;
  r.loss = static_cast<float>(out.loss);
  r.accuracy = out.accuracy;
  r.grad_norm = out.grad_norm;
  r.lr = lr_at(o_.optim, step);
  step_peak_ = std::max(step_peak_, tensor_bytes_peak_thread());
  r.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - m.t0).count();
  r.tokens_per_s = static_cast<double>(o_.batch * o_.seq) / (r.step_ms / 1e3);
  r.mfu = flops_per_step_ / (r.step_ms / 1e3) / (peak_gflops_ * 1e9);
  r.peak_rss_mb = peak_rss_mb();
  const comm::CommStats dp = mesh_.dp_group().stats();
  r.comm_bytes_sent = dp.bytes_sent - m.dp.bytes_sent;
  r.comm_bytes_received = dp.bytes_received - m.dp.bytes_received;
  r.comm_bytes_cross_host = dp.bytes_sent_cross_host - m.dp.bytes_sent_cross_host;
  r.comm_wait_ms = (dp.wait_seconds - m.dp.wait_seconds) * 1e3;
  r.tp_bytes_sent = mesh_.tp_group().stats().bytes_sent - m.tp.bytes_sent;
  return r;
}

// Rank 0's metrics line of the step. A checkpoint of the step records it (without the save's
// timings) before `latest` names it, so no kill leaves a committed step without its line: a
// resume writes back a line the file lacks (prepare_checkpoints).
nlohmann::json RankTrainer::metrics_line(const StepRecord& r, const StepResult& out) const {
  nlohmann::json line = step_json(r);
  if (o_.dp > 1) {
    line["comm_bytes_sent"] = r.comm_bytes_sent;
    line["comm_bytes_received"] = r.comm_bytes_received;
    line["comm_wait_ms"] = r.comm_wait_ms;
    if (mesh_.dp_group().num_hosts() > 1) line["comm_bytes_cross_host"] = r.comm_bytes_cross_host;
  }
  if (o_.tp > 1) line["tp_bytes_sent"] = r.tp_bytes_sent;
  if (o_.pp > 1) {  // one entry per pipeline rank (of rank 0's dp/tp position)
    line["bubble"] = out.pipeline.bubble;
    line["peak_saved_activation_bytes"] = out.pipeline.peak_saved;
    line["microbatches_in_flight"] = out.pipeline.in_flight;
  } else {
    line["peak_saved_activation_bytes"] = std::vector<int64_t>{out.stats.peak_saved_bytes};
  }
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  line["peak_tensor_bytes"] = step_peak_;  // rank 0's, so far
  if (const auto& p = sh_.res.predicted) {  // rank 0's prediction against rank 0's measurement, with the error
    const double pred_ms = 1e3 * p->step_s, pred_peak = p->memory.at(0).total();
    line["predicted_step_ms"] = pred_ms;
    line["predicted_step_error"] = r.step_ms > 0 ? (pred_ms - r.step_ms) / r.step_ms : 0.0;
    line["predicted_peak_tensor_bytes"] = pred_peak;
    line["predicted_peak_error"] = step_peak_ > 0 ? (pred_peak - static_cast<double>(step_peak_)) / static_cast<double>(step_peak_) : 0.0;
  }
  if (images()) line["images_per_s"] = r.tokens_per_s;  // T is 1: samples per second
  if (out.noise) {  // dp > 1: the gradient noise scale (train/noise_scale.h), its base batch one rank's
    line["grad_sq_estimate"] = out.noise->grad_sq;
    line["grad_trace_estimate"] = out.noise->trace;
    if (out.noise_scale) {
      const double b = static_cast<double>(o_.batch), e = stat_efficiency(*out.noise_scale, b / o_.dp, b);
      line["grad_noise_scale"] = *out.noise_scale;
      line["stat_efficiency"] = e;
      line["goodput"] = r.step_ms > 0 ? b / (r.step_ms / 1e3) * e : 0.0;  // samples per second, times E
    }
  }
  if (r.accuracy) line["accuracy"] = *r.accuracy;
  if (r.val_accuracy) line["val_accuracy"] = *r.val_accuracy;
  return line;
}

// ---- the step's end: a stop, a checkpoint, the report ----

// A stop asked by SIGINT or SIGTERM (train/stop.h), and --checkpoint-every-s's clock (world
// rank 0's): every rank agrees on both at the step's end, in one all-reduce. A checkpoint
// directory always gets the end of the run (and a stopped one); --checkpoint-every and
// --checkpoint-every-s add a cadence. Returns the signal the run stops on, or 0.
int RankTrainer::checkpoint_or_stop(int64_t step, const nlohmann::json& line) {
  const bool last = step + 1 == o_.steps;
  int stopping = 0;
  bool timed_save = false;
  if ((stop_handlers_installed() || o_.checkpoint_every_s > 0) && !last) {
    const bool due = mesh_.rank() == 0 && o_.checkpoint_every_s > 0 &&
                     std::chrono::duration<double>(Clock::now() - last_save_time_).count() >= o_.checkpoint_every_s;
    std::array<int64_t, 2> flags{stop_signal(), due ? 1 : 0};
    mesh_.world().all_reduce(flags, {.op = comm::ReduceOp::max});
    stopping = static_cast<int>(flags[0]);
    timed_save = flags[1] != 0;
  }
  if (!o_.checkpoint_dir.empty() &&
      ((o_.checkpoint_every > 0 && (step + 1) % o_.checkpoint_every == 0) || last || stopping || timed_save)) {
    save(step + 1, lead_ ? &line : nullptr);
    last_save_time_ = Clock::now();
  }
  if (stopping && lead_) sh_.res.stopped_by = stopping;  // the result is shared: the lead writes it
  return stopping;
}

// The progress line's noise scale and goodput, from the metrics line (" | noise 1.2k | goodput
// 3.4k/s"); empty without them.
namespace {
std::string short_number(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  else if (a >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}
std::string noise_tail(const nlohmann::json& line) {
  if (!line.contains("grad_noise_scale")) return "";
  std::string s = " | noise ";
  s += short_number(line["grad_noise_scale"].get<double>());
  s += " | goodput ";
  s += short_number(line["goodput"].get<double>());
  s += "/s";
  return s;
}
}  // namespace

// Rank 0: the step's metrics line (with the timings of its checkpoint, if one was saved), its
// progress and validation lines, its record in the result, and the launcher's heartbeat.
void RankTrainer::report_step(const StepRecord& r, nlohmann::json& line) {
  TrainResult& res = sh_.res;
  const bool talk = !o_.quiet, last = r.step + 1 == o_.steps;
  if (pending_save_) {  // this step's checkpoint, per world rank
    nlohmann::json c = {{"step", *pending_save_}, {"seconds", res.last_save_s}};
    for (const RankSave& s : res.saves) {
      c["rank_seconds"].push_back(s.seconds);
      c["bytes_written"].push_back(s.bytes_written);
      c["resident_bytes"].push_back(s.resident_bytes);
      c["peak_bytes"].push_back(s.peak_bytes);
    }
    line["checkpoint"] = c;
    pending_save_.reset();
  }
  try {
    metrics_->write(line);
  } catch (const io::WriteError& e) {
    throw io::WriteError(std::string(e.what()) + " (at step " + std::to_string(r.step + 1) + ")" + kept_checkpoint());
  }
  if (o_.on_step) o_.on_step(line);
  if (talk && o_.log_every > 0 && ((r.step + 1) % o_.log_every == 0 || last)) print_step(r, o_.steps, noise_tail(line));
  if (talk && r.val_loss) print_validation(r);
  res.steps.push_back(r);
  heartbeat();
}

// ---- the end of the run ----

// The final evaluation (unless the last step made one, or the run stopped), every rank's peak
// tensor memory, and on rank 0 the metrics file closed, the result's figures and the summary.
void RankTrainer::finish_run(int64_t start, int stopped) {
  TrainResult& res = sh_.res;
  float final_val = (!res.steps.empty() && res.steps.back().val_loss) ? *res.steps.back().val_loss : 0.f;
  std::optional<float> final_acc = !res.steps.empty() ? res.steps.back().val_accuracy : std::nullopt;
  bool have_val = lead_ ? (!res.steps.empty() && res.steps.back().val_loss) : false;
  // Every rank must agree whether to evaluate (a collective under dp); a stopped run does not.
  if ((o_.eval_every <= 0 || start >= o_.steps) && stopped == 0) {
    auto [v, acc] = evaluate();
    final_val = v, final_acc = acc, have_val = true;
  }
  {  // every rank's peak tensor memory in a step
    std::vector<int64_t> peaks(static_cast<size_t>(mesh_.world().size()));
    mesh_.world().all_gather(std::array<int64_t, 1>{step_peak_}, peaks);
    if (lead_) res.peak_tensor_bytes = peaks;
  }
  if (!lead_) return;
  try {
    metrics_->close();
  } catch (const io::WriteError& e) {
    throw io::WriteError(std::string(e.what()) + " (closing it at the end of the run)" + kept_checkpoint());
  }
  res.wall_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
  {
    std::vector<double> ms;
    for (const StepRecord& s : res.steps) ms.push_back(s.step_ms);
    if (ms.size() >= 5) ms.erase(ms.begin(), ms.begin() + 2);  // the first steps allocate
    if (!ms.empty()) {
      std::sort(ms.begin(), ms.end());
      const size_t n = ms.size();
      res.measured_step_s = 1e-3 * (n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2);
    }
  }
  if (have_val) res.final_val_loss = final_val, res.final_val_accuracy = final_acc;
  if (!o_.quiet) print_summary(final_val, final_acc, stopped);
}

}  // namespace meshtrain::train::detail
