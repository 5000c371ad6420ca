// BatchNorm2d: per-channel normalisation of x (N, C, H, W) (or (N, C): BatchNorm1d's case) over
// (N, H, W), then y = xhat * weight + bias (kernels/batchnorm.h: the computation), as PyTorch:
//   training Context:    batch mean and biased variance; running_mean and running_var move
//                        towards them by `momentum` (running_var towards the unbiased
//                        variance); saves x and the batch statistics for backward.
//   evaluation Context:  the running statistics; nothing saved, nothing updated.
// Parameters "<name>.weight" (C, ones) and "<name>.bias" (C, zeros), no weight decay; buffers
// (nn/module.h) "<name>.running_mean" (C, zeros) and "<name>.running_var" (C, ones). PyTorch's
// num_batches_tracked is not kept (it only matters for momentum = None).
//
// SYNCHRONISED BATCH NORM. `reduce_stats`, when set, is called with per-channel float64 sums
// and must replace them by their sums over the group of ranks whose slices make up one batch
// (an all-reduce of SUM over that group). It is called twice per micro-batch, by every rank of
// the group in the same order:
//   in forward (training Context): 1 + 2C values [count, sum x (C), sum x^2 (C)];
//   in backward:                   2C values     [sum dy (C), sum dy * xhat (C)].
// Each rank then normalises its slice with the group's statistics, updates identical running
// statistics, and its input gradient is that of the group's batch. The weight and bias
// gradients stay each rank's local share, which the data-parallel gradient sum adds up. The
// slices may hold different numbers of samples (the count travels with the sums). Null (the
// default): the local batch's statistics. The layer knows nothing of ranks: whoever builds it
// (parallel/) binds the callback to a communicator and group.
//
// `relu_after` makes the layer BatchNorm2d then ReLU in one (the model builders set it where a
// ReLU follows: two passes over the activation fewer each step, the same numbers).
//
// Gradients: weight and bias accumulate (+=); the input gradient is written. With
// ctx.defer_weight_grads the (already computed, cheap) weight and bias gradients are added at
// the W action. Limit: a forward recomputed for activation checkpointing would update the running
// statistics a second time.
#pragma once

#include <functional>
#include <span>

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

struct BatchNormOptions {
  float eps = 1e-5f;
  float momentum = 0.1f;
  // Over channels split across ranks (a filter-split convolution's output): split along dim 0;
  // the layer then normalises this rank's channels, `channels` their count.
  ShardSpec shard = {};
};

class BatchNorm2d : public Layer {
 public:
  BatchNorm2d(std::string name, int64_t channels, const BatchNormOptions& opt = {});

  Tensor forward(Context& ctx, const Tensor& x) override;    // (N, C, H, W) -> same
  Tensor backward(Context& ctx, const Tensor& dy) override;  // (N, C, H, W) -> same
  void collect_params(std::vector<Param*>& out) override;
  void collect_buffers(std::vector<Param*>& out) override;

  std::function<void(std::span<double>)> reduce_stats;  // see above; null: local statistics
  // The ReLU that follows, done in the same passes: y = max(0, bn(x)), and backward takes the
  // ReLU's output gradient (the mask recomputed from x, nothing more saved).
  bool relu_after = false;
  // The activations' memory layout (kernels/layout.h): 0 NCHW, B oneDNN's nChw{B}c (a model
  // that keeps activations blocked between convolutions sets it; B must divide the channels).
  int block = 0;

  std::string name;
  Param weight, bias;                 // (C)
  Param running_mean, running_var;    // (C), buffers
  int64_t channels;  // local (this rank's) channels
  BatchNormOptions opt;

 private:
  void check_input(const Tensor& x) const;
};

}  // namespace meshtrain::nn
