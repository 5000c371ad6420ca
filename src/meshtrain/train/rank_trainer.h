// The trainer's rank loop, shared by trainer.cpp (the loop), rank_data.cpp (the step's and the
// validation batches, the evaluation, the launcher's heartbeat), rank_checkpoints.cpp (saving
// this rank's pieces, restoring, choosing what to resume) and rank_report.cpp (progress
// lines, the header, the trace). Internal to train/: not part of the library's interface.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/pipeline/executor.h"
#include "meshtrain/trace/trace.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/images.h"
#include "meshtrain/train/layout.h"
#include "meshtrain/train/optimizer.h"
#include "meshtrain/train/stage_runner.h"
#include "meshtrain/train/trainer.h"

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

class RankTrainer {
 public:
  RankTrainer(comm::Communicator& world, Shared& sh);

  void run();

 private:
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
  const nn::Param* wte_copy() {
    return stages_.back()->tied_copy() ? stages_.back()->tied_param() : nullptr;
  }
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
    if (stages_.back()->last())
      for (const model::StageResult& r : runners_.back()->results()) sum += r.loss / static_cast<double>(n);
    return pp_sum(sum);
  }
  // A classifier's correct predictions and counted samples of the last run, over dp and pp.
  std::pair<double, double> pipeline_correct() {
    std::array<double, 2> a{0, 0};
    if (stages_.back()->last())
      for (const model::StageResult& r : runners_.back()->results())
        a[0] += static_cast<double>(r.correct), a[1] += static_cast<double>(r.counted);
    if (o_.dp > 1) mesh_.dp_group().all_reduce(a);
    if (o_.pp > 1) mesh_.pp_group().all_reduce(a);
    return {a[0], a[1]};
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
  std::vector<float> img_;          // the step's images
  void save(int64_t step, const nlohmann::json* metrics_line = nullptr);
  RankPieces my_pieces();
  void report_save(int64_t step, double seconds, std::vector<RankSave> ranks);
  std::optional<int64_t> pending_save_;  // rank 0: a save of this step, for its metrics line
  int64_t restore_bytes_read_ = 0;
  std::vector<pipeline::LayerSpan> spans_;   // blocks of every stage (the same on every rank)
  std::optional<StageCosts> profiled_;       // --pp-balance profile: the measured costs
  std::string layout_line_;  // the image model's intra-layer layout, described (CNNLayout::describe)
  int64_t restore();
  [[noreturn]] void diverged(int64_t step, const char* what, double value) const;
  std::string kept_checkpoint() const;
  StateBytes state_bytes();
  void print_header();
  // The end of a run with a prediction: predicted against measured step time and peak memory.
  void report_prediction();

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
  std::unique_ptr<Optimizer> optimizer_;
  // For each of the optimizer's parameters, the index of its origin in model_params() (the same
  // order on every rank of its dp and tp groups): where reduce_param_sq adds its sums.
  std::vector<size_t> origin_index_;
  std::optional<int64_t> saved_step_;  // the newest checkpoint this run saved or resumed from
};

// ---- rank_checkpoints.cpp ----
// The run's settings a checkpoint records (and a resume must match).
nlohmann::json run_config(const model::ModelSpec& spec, const TrainOptions& o);
// --resume: chooses and loads the checkpoint (the newest valid step folder), checks it belongs
// to this run, and trims the metrics file to its step. Without --resume, a run that will save
// refuses a directory holding step folders. `lead` prints the notes.
std::optional<CheckpointIndex> prepare_checkpoints(const TrainOptions& o, const model::ModelSpec& spec, bool lead);

// ---- rank_report.cpp ----
void print_step(const StepRecord& r, int64_t steps);
// Writes the Chrome trace and, beside it, the SVG swimlane; prints the overlap figures.
void write_trace(const trace::Recorder& rec, const TrainOptions& o);
void note(const std::string& text);

}  // namespace meshtrain::train::detail
