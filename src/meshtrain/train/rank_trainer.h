// The trainer's rank loop, shared by trainer.cpp (the step and the loop around it),
// rank_hooks.cpp (what the loop does around each step: measurements, the metrics line, the
// agreed stop and the step's checkpoint, the run's beginning and end), rank_data.cpp (the step's
// and the validation batches, the evaluation, the launcher's heartbeat), rank_checkpoints.cpp
// (saving this rank's pieces, restoring, choosing what to resume) and rank_report.cpp (progress
// lines, the header, the summary, the trace). Internal to train/: not part of the library's
// interface.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/data/images.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/data/data_parallel.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/pipeline/executor.h"
#include "meshtrain/trace/trace.h"
#include "meshtrain/train/layout.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/noise_scale.h"
#include "meshtrain/train/stage_runner.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/weight_stash.h"
#include "meshtrain/train/weight_versions.h"

namespace meshtrain::train::detail {

using Clock = std::chrono::steady_clock;

inline std::invalid_argument bad(const std::string& msg) { return std::invalid_argument(msg); }

struct Shared {
  const TrainOptions& o;
  const model::GPTConfig& cfg;  // GPT's config (a default one for other families: use spec)
  const model::ModelSpec& spec;
  const TokenDataset* tokens;   // token models
  const ImageDataset* images;   // image models
  TrainResult& res;
  trace::Recorder* recorder;  // null without --trace
  const CheckpointIndex* resume = nullptr;  // --resume: the verified checkpoint to continue from
};

// Every pipeline rank's figures of a step, for rank 0's metrics line (pp > 1).
struct PipelineFigures {
  std::vector<double> bubble;         // (pp): the idle share of the pipeline's step
  std::vector<int64_t> peak_saved;    // (pp): the most activation bytes held at once
  std::vector<int64_t> in_flight;     // (pp): the most micro-batches alive at once
};

// What one step (RankTrainer::train_step) gives back. The loss and gradient norm are the same
// on every rank.
struct StepResult {
  double loss = 0;                // the mean over the batch (micro-batches, dp)
  double grad_norm = 0;           // the global norm, before clipping
  std::optional<float> accuracy;  // a classifier's share of the batch predicted right
  pipeline::StepStats stats;      // this rank's executor figures
  PipelineFigures pipeline;       // pp > 1
  // Data parallelism (train/noise_scale.h): the step's unbiased |G|^2 and tr(Sigma), and the
  // noise scale of their moving averages (none while those do not define it yet).
  std::optional<NoiseEstimate> noise;
  std::optional<double> noise_scale;
};

// What a step is measured against, read just before it (RankTrainer::start_meter).
struct StepMeter {
  Clock::time_point t0;
  comm::CommStats dp, tp;  // the dp and tp groups' counters
};

class RankTrainer {
 public:
  RankTrainer(comm::Communicator& world, Shared& sh);

  void run();

 private:
  // ---- trainer.cpp: the step ----
  StepResult train_step(int64_t step);
  void zero_grads();
  void finish_grad_sync();     // finish_local_grads, then sync_tied_grad
  void finish_local_grads();  // the dp sync finished, or the exact sums rounded
  void sync_tied_grad();      // the tied token table's two copies summed
  void sync_replicas();       // Chimera: each model stage's two copies summed over their pair
  // --schedule pipedream-2bw (train/weight_versions.h): the step's update applies the previous
  // step's gradient; a flush drains the pipeline and applies the current one. At pp 1 the same
  // recurrence on one rank, computed directly (the reference the pipelines are checked against).
  void update_two_bw(StepResult& out);
  void flush_two_bw();
  // --schedule pipedream (train/weight_stash.h): chunk c's update after each of its micro-batches'
  // backward, on the stage's own gradient norm; a flush drains the pipeline (nothing in flight)
  // and lets the next micro-batches start from the newest weights.
  void update_pipedream(size_t c, int64_t k);
  // Every asynchronous schedule's flush (before an evaluation, a checkpoint, at the start and the end).
  void flush_pipeline();
  void measure_noise(StepResult& out, double sq_big);  // the gradient noise scale, under dp
  // ---- rank_hooks.cpp: around the step, in the order run() calls them ----
  int64_t begin_run();  // returns the first step
  void inject_fault(int64_t step) const;
  StepMeter start_meter();
  PipelineFigures gather_pipeline_figures(const pipeline::StepStats& st);  // inside the step
  StepRecord measure(int64_t step, const StepResult& out, const StepMeter& m);
  nlohmann::json metrics_line(const StepRecord& r, const StepResult& out) const;
  int checkpoint_or_stop(int64_t step, const nlohmann::json& line);
  void report_step(const StepRecord& r, nlohmann::json& line);
  void finish_run(int64_t start, int stopped);

  // Data-parallel units in forward order: per stage, its ends (embedding, ln_f) and its blocks.
  std::vector<parallel::Unit> units() {
    std::vector<parallel::Unit> u;
    for (auto& stage : stages_)
      for (model::StageUnit& unit : stage->units()) u.push_back({unit.module, std::move(unit.params)});
    return u;
  }
  std::vector<nn::Param*> stage_params() {
    std::vector<nn::Param*> out;
    for (auto& stage : stages_) stage->collect_params(out);
    return out;
  }
  std::vector<nn::Param*> model_params() { return ddp_ ? ddp_->params() : stage_params(); }
  // The last stage's copy of the tied token table (pp > 1), which the norm counts once.
  // Chimera: of the down pipeline's stage (chunk 0), the only one norm_params holds.
  const nn::Param* wte_copy() {
    const auto& s = replica_ ? stages_.front() : stages_.back();
    return s->tied_copy() ? s->tied_param() : nullptr;
  }
  // The parameters the global norm counts: every stage's, except under Chimera the up
  // pipeline's copies (chunk 1), which equal the down pipeline's on the pair rank.
  std::vector<nn::Param*> norm_params() {
    if (!replica_) return stage_params();
    std::vector<nn::Param*> out;
    stages_.front()->collect_params(out);
    return out;
  }
  // The chunk an evaluation's last stage is (Chimera evaluates on the down pipeline alone).
  size_t eval_chunk() const { return replica_ ? 0 : stages_.size() - 1; }
  double global_grad_sq();
  void reduce_param_sq(std::span<double> sq, size_t per_param);
  double pp_sum(double v) {
    if (o_.pp == 1) return v;
    std::array<double, 1> a{v};
    mesh_.pp_group().all_reduce(a);
    return a[0];
  }
  // Runs micro-batch losses through the pipeline: the mean over them, on every rank.
  double pipeline_loss(int64_t n) {
    double sum = 0;
    for (size_t c = 0; c < stages_.size(); ++c)  // Chimera: both pipelines' last stages
      if (stages_[c]->last())
        for (const model::StageResult& r : runners_[c]->results()) sum += r.loss / static_cast<double>(n);
    return pp_sum(sum);
  }
  // A classifier's share of the last run's samples predicted right, over dp and pp.
  float batch_accuracy() {
    std::array<double, 2> a{0, 0};  // correct, counted
    for (size_t c = 0; c < stages_.size(); ++c)
      if (stages_[c]->last())
        for (const model::StageResult& r : runners_[c]->results())
          a[0] += static_cast<double>(r.correct), a[1] += static_cast<double>(r.counted);
    if (o_.dp > 1) mesh_.dp_group().all_reduce(a);
    if (o_.pp > 1) mesh_.pp_group().all_reduce(a);
    return static_cast<float>(a[0] / std::max(1.0, a[1]));
  }
  void record(const pipeline::StepStats& st);
  nn::Hooks* hooks() { return ddp_ ? ddp_->hooks() : nullptr; }
  double dp_mean(double v) {
    if (o_.dp == 1) return v;
    std::array<double, 1> a{v};
    mesh_.dp_group().all_reduce(a, {.op = comm::ReduceOp::avg});
    return a[0];
  }
  // ---- rank_data.cpp ----
  // The validation loss (and accuracy, for a classifier) over --eval-batches batches.
  std::pair<float, std::optional<float>> evaluate();
  static constexpr int64_t kEvalChunk = 32;  // evaluation batches per executor run (a heartbeat after each)
  void heartbeat();
  // Fills this rank's rows of `step`'s batch (micro-batch by micro-batch) into the step arrays.
  void fill_batch(int64_t step);
  bool images() const { return sh_.images != nullptr; }
  std::vector<int32_t> tok_, tgt_;  // the step's token ids and targets (or labels)
  ImageRows image_rows_;            // the step's images and labels (image models)
  std::vector<int64_t> first_rows_;  // each micro-batch's first sample in the step's global batch
  void save(int64_t step, const nlohmann::json* metrics_line = nullptr);
  RankPieces my_pieces();
  void report_save(int64_t step, double seconds, std::vector<RankSave> ranks);
  std::optional<int64_t> pending_save_;  // rank 0: a save of this step, for its metrics line
  int64_t restore_bytes_read_ = 0;
  std::vector<pipeline::LayerSpan> spans_;   // blocks of every stage (the same on every rank)
  std::optional<StageCosts> profiled_;       // --pp-balance profile: the measured costs
  std::string layout_line_;  // the image model's intra-layer layout, described (CNNLayout::describe)
  int64_t restore();
  int64_t resume();  // restore(), with what each rank read reported
  [[noreturn]] void diverged(int64_t step, const char* what, double value) const;
  std::string kept_checkpoint() const;
  StateBytes state_bytes();
  void print_header();
  // The end of a run with a prediction: predicted against measured step time and peak memory.
  void report_prediction();
  void print_validation(const StepRecord& r) const;
  // The run's last lines: steps, time, the final validation, peak RSS, the prediction, traffic.
  void print_summary(float final_val, std::optional<float> final_acc, int stopped);

  Shared& sh_;
  const TrainOptions& o_;
  double analytic_mb_ = 0;
  int64_t step_peak_ = 0;  // the most tensor memory this rank held in a step so far
  parallel::DeviceMesh mesh_;
  bool lead_;
  std::vector<std::unique_ptr<model::Stage>> stages_;  // this rank's chunks, in chunk order
  std::unique_ptr<parallel::DataParallel> ddp_;
  std::vector<std::unique_ptr<StageDriver>> runners_;
  std::unique_ptr<pipeline::Executor> exec_;
  std::shared_ptr<comm::Communicator> emb_;  // pp > 1: first and last stage, for the tied wte
  std::shared_ptr<comm::Communicator> replica_;  // Chimera: ranks r and pp-1-r
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<GradNoiseScale> noise_;
  std::unique_ptr<WeightVersions> versions_;  // pipedream-2bw at pp > 1
  bool two_bw_reference_ = false;             // pipedream-2bw at pp 1
  std::vector<Tensor> reference_prev_;        // pp 1: the weights the next step computes its gradient at
  std::vector<std::unique_ptr<WeightStash>> stashes_;  // pipedream: one per chunk
  std::vector<Optimizer*> stage_optimizers_;            // pipedream: chunk c's (optimizer_ at one chunk)
  std::vector<std::unique_ptr<Optimizer>> owned_stage_optimizers_;  // the reference's (--pp 1 --chunks P)
  int64_t pipedream_step_ = 0;     // the step whose window runs
  double pipedream_norm_ = 0;      // this rank's last update's gradient norm
  int64_t pending_step_ = -1;                 // pipedream-2bw: the step whose gradient a flush applies  // dp > 1 where the local norms are measured (trainer.cpp)
  // For each of the optimizer's parameters, the index of its origin in model_params() (the same
  // order on every rank of its dp and tp groups): where reduce_param_sq adds its sums.
  std::vector<size_t> origin_index_;
  std::optional<int64_t> saved_step_;  // the newest checkpoint this run saved or resumed from
  // The run's state between steps (begin_run sets it).
  std::unique_ptr<MetricsWriter> metrics_;  // rank 0
  Clock::time_point t_start_, last_save_time_;  // --checkpoint-every-s counts from the last save
  double flops_per_step_ = 0, peak_gflops_ = 0;  // MFU's numerator and peak
};

// ---- rank_checkpoints.cpp ----
// The run's settings a checkpoint records (and a resume must match).
nlohmann::json run_config(const model::ModelSpec& spec, const TrainOptions& o);
// --resume: chooses and loads the checkpoint (the newest valid step folder), checks it belongs
// to this run, and trims the metrics file to its step. Without --resume, a run that will save
// refuses a directory holding step folders. `lead` prints the notes.
std::optional<CheckpointIndex> prepare_checkpoints(const TrainOptions& o, const model::ModelSpec& spec, bool lead);

// ---- rank_report.cpp ----
// `tail`: more fields for the line (" | noise 1.2k | goodput 3.4k/s").
void print_step(const StepRecord& r, int64_t steps, const std::string& tail = "");
// Writes the Chrome trace and, beside it, the SVG swimlane; prints the overlap figures.
void write_trace(const trace::Recorder& rec, const TrainOptions& o);
void note(const std::string& text);

}  // namespace meshtrain::train::detail
