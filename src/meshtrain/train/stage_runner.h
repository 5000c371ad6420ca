// StageDriver: a model::Stage (any family: model/model.h) as the pipeline executor drives it
// (pipeline/executor.h). It holds the micro-batches of the coming run (the step's inputs —
// token ids or images — and targets, `rows` samples each), hands each stage its micro-batch
// (the first stage reads the inputs, the last the targets), keeps the last stage's result per
// micro-batch (mean loss, and correct predictions for a classifier), and tells data
// parallelism when a backward is the stage's last of the step. The trainer owns one per model
// chunk of its rank.
//
// Recomputation (--recompute, activation checkpointing at stage granularity): forward runs
// without saving anything but the stage's input (the first stage's inputs stay in the step's
// batch arrays, so it keeps nothing); backward runs the forward again on that input, saving as
// usual, then the backward. The kernels are deterministic, so the recomputed activations are
// the ones the first forward made and the loss curve does not change.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/model/model.h"
#include "meshtrain/pipeline/executor.h"

namespace meshtrain {
class ImageDataset;
}

namespace meshtrain::train {

struct TrainOptions;
class WeightVersions;
class WeightStash;

// The arrays of one run's micro-batches: micro-batch k holds samples [k rows, (k+1) rows).
// Token models: tokens and targets (n * rows, T). Image models: images (n * rows, C, H, W)
// with sample_floats = C * H * W, targets (n * rows); T = 1.
struct BatchArrays {
  const int32_t* tokens = nullptr;
  const float* images = nullptr;
  int64_t sample_floats = 0;
  const int32_t* targets = nullptr;
  int64_t rows = 0;
  int64_t T = 1;
  // Training: the step, and per micro-batch the index of its first sample in the step's global
  // batch (nn::Context::step, first_sample: dropout's masks). step -1: none (evaluation).
  int64_t step = -1;
  const int64_t* first_sample = nullptr;
};

// A data-parallel rank's rows of a training step of an image model (the all-reduce trainer's
// dp ranks and the parameter server's workers alike): micro-batch k is rows [k B / M, (k+1) B / M)
// of the global batch, split over the `dp` ranks, so each micro-batch's batch-norm statistics,
// summed over the ranks, are one rank's micro-batch k. Fills the buffers and returns their arrays.
struct ImageRows {
  std::vector<float> images;
  std::vector<int32_t> labels;
  std::vector<int64_t> first_rows;  // each micro-batch's first sample in the step's global batch
};
BatchArrays image_rows(const ImageDataset& ds, const TrainOptions& o, int64_t step, int dp_rank, ImageRows& out);

class StageDriver : public pipeline::StageRunner {
 public:
  // `hooks`: data parallelism's (null: none); `set_sync(last)` is called before each backward.
  StageDriver(model::Stage& stage, nn::Hooks* hooks, std::function<void(bool)> set_sync, bool recompute = false);

  // The micro-batches of the next run (the arrays must outlive it); backward scales the loss
  // by grad_scale.
  void set_batches(const BatchArrays& batches, float grad_scale);
  // The last stage's result of each micro-batch of the last run (index = micro-batch).
  const std::vector<model::StageResult>& results() const { return results_; }

  Tensor forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal) override;
  Tensor backward(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) override;
  Tensor backward_input(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) override;
  void backward_weights(nn::Context& ctx, int mb, bool last) override;
  void after_backward(int mb) override;
  Shape input_shape() const override { return stage_.input_shape(b_.rows, b_.T); }
  Shape output_shape() const override { return stage_.output_shape(b_.rows, b_.T); }
  Shape portal_shape() const override { return stage_.portal_shape(b_.rows, b_.T); }
  // PipeDream-2BW (train/weight_versions.h): a backward of the previous step's micro-batches
  // (mb < 0) runs on the stashed weights; the step's first backward (mb 0) sets the previous
  // step's gradient aside.
  void set_versions(WeightVersions* v) { versions_ = v; }
  // PipeDream (train/weight_stash.h): every forward and backward on the stash's version for
  // the micro-batch (numbered across steps: step x `per_step` + mb), each micro-batch's
  // gradient unscaled by the micro-batch count (it is an update of its own), and `update(k)`
  // after micro-batch k's backward and the send of its input gradient (after_backward). Data
  // parallelism syncs every backward's gradients.
  void set_stash(WeightStash* stash, std::function<void(int64_t)> update, int64_t per_step) {
    stash_ = stash, update_ = std::move(update), per_step_ = per_step;
  }
  // The step the micro-batches are numbered from, without new arrays: a drain's backwards
  // (-m .. -1) belong to the step before `step`, as the executor numbers them.
  void set_step(int64_t step) { b_.step = step; }
  // The skip connection's stages, when it crosses stages.
  void set_portal_stages(int to, int from) { portal_to_ = to, portal_from_ = from; }
  int portal_to() const override { return portal_to_; }
  int portal_from() const override { return portal_from_; }

 private:
  model::MicroBatch micro_batch(int mb) const;
  Tensor run_forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal);
  model::Stage& stage_;
  nn::Hooks* hooks_;
  std::function<void(bool)> set_sync_;
  bool recompute_;
  WeightVersions* versions_ = nullptr;
  WeightStash* stash_ = nullptr;
  std::function<void(int64_t)> update_;
  int64_t per_step_ = 1;
  int portal_to_ = -1, portal_from_ = -1;
  BatchArrays b_;
  float grad_scale_ = 1.f;
  std::vector<model::StageResult> results_;
};

}  // namespace meshtrain::train
