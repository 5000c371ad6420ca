// GPTStageRunner: a model::GPTStage as the pipeline executor drives it (pipeline/executor.h).
// It holds the micro-batches of the coming run (token ids and targets, rows x T each), hands
// each stage its slice (the first stage reads tokens, the last targets), keeps the last stage's
// per-micro-batch losses, and tells data parallelism when a backward is the stage's last of the
// step. The trainer owns one per model chunk of its rank.
//
// Recomputation (--recompute, activation checkpointing at stage granularity): forward runs
// without saving anything but the stage's input (the first stage's tokens stay in the step's
// batch arrays, so it keeps nothing); backward runs the forward again on that input, saving as
// usual, then the backward. The kernels are deterministic, so the recomputed activations are
// the ones the first forward made and the loss curve does not change.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/model/stage.h"
#include "meshtrain/pipeline/executor.h"

namespace meshtrain::train {

class GPTStageRunner : public pipeline::StageRunner {
 public:
  // `hooks`: data parallelism's (null: none); `set_sync(last)` is called before each backward;
  // `seq_shards`: the boundary activation is a sequence shard over that many ranks (sequence
  // parallelism), else 1.
  GPTStageRunner(model::GPTStage& stage, nn::Hooks* hooks, std::function<void(bool)> set_sync,
                 int seq_shards, bool recompute = false);

  // The micro-batches of the next run: micro-batch k is rows [k rows, (k+1) rows) of the
  // (n * rows, T) arrays, which must outlive the run; backward scales the loss by grad_scale.
  void set_batches(const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t T, float grad_scale);
  // The last stage's mean loss of each micro-batch of the last run (index = micro-batch).
  const std::vector<float>& losses() const { return losses_; }

  Tensor forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal) override;
  Tensor backward(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) override;
  Tensor backward_input(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) override;
  void backward_weights(nn::Context& ctx, int mb, bool last) override;
  Shape boundary_shape() const override;
  // The skip connection's stages (model config skip_from / skip_to), when it crosses stages.
  void set_portal_stages(int to, int from) { portal_to_ = to, portal_from_ = from; }
  int portal_to() const override { return portal_to_; }
  int portal_from() const override { return portal_from_; }

 private:
  model::GPTStage& stage_;
  nn::Hooks* hooks_;
  std::function<void(bool)> set_sync_;
  int seq_shards_;
  bool recompute_;
  int portal_to_ = -1, portal_from_ = -1;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  int64_t rows_ = 0, T_ = 0;
  float grad_scale_ = 1.f;
  std::vector<float> losses_;
};

}  // namespace meshtrain::train
