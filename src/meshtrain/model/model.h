// The model as a plug-in: what the executor, the trainer, checkpoints, validation and the
// metrics ask of any network, so that GPT and the convolutional networks are two
// implementations of one interface (docs/architecture.md, "Any model").
//
// A model is cut into stages (DESIGN decision 8): a Stage is a contiguous piece of it — the
// first takes the micro-batch's inputs (token ids, or images N x C x H x W), the middle ones
// take the previous stage's activation, the last gives the loss and what the metrics need
// (the count of correct predictions for a classifier). A whole model is one stage; a pipeline
// cuts it at unit boundaries (GPT: transformer blocks; a CNN: its blocks), which the Model
// numbers, so the pipeline's partitioner needs nothing else of a family.
//
// The trainer never branches on the family: it asks the Model for stages, for the names and
// shapes of every parameter and buffer (checkpoints), for the units data parallelism and ZeRO-3
// gather, and for the parameters several stages hold (GPT's tied token table), and it asks
// each stage for the shapes that cross its boundaries (the executor's receive buffers).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/nn/module.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::model {

// What the first stage reads.
enum class InputKind { tokens, images };

// One micro-batch as a stage sees it: `rows` samples. Token models: tokens and targets are
// (rows, T) ids (a target of -1 is not counted). Image models: images (rows, C, H, W) float32
// and targets (rows) class labels; T is 1.
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const float* images = nullptr;
  const int32_t* targets = nullptr;
  int64_t rows = 0;
  int64_t T = 1;
};

// What the last stage reports of a micro-batch: its mean loss, and for a classifier the number
// of correct predictions among `counted` samples (counted 0: not a classifier).
struct StageResult {
  float loss = 0;
  int64_t correct = 0;
  int64_t counted = 0;
};

// A data-parallel unit: a module and the parameters it owns directly (its children's own units
// are listed separately). ZeRO-3 gathers a unit's parameters around its forward and backward
// (nn::Hooks pre_forward ... post_backward), and buckets fill in units' reverse order.
struct StageUnit {
  const nn::Module* module = nullptr;
  std::vector<nn::Param*> params;
};

class Stage : public nn::Module {
 public:
  // The first stage reads the micro-batch's inputs; the last gives the loss.
  virtual bool first() const = 0;
  virtual bool last() const = 0;

  // Forward of one micro-batch: `x` is the previous stage's output (ignored by the first). The
  // last stage writes *result and returns an empty tensor; the others return their output. A
  // skip connection across stages travels in `portal` (nn/context.h).
  virtual Tensor forward(nn::Context& ctx, const Tensor& x, const MicroBatch& mb, StageResult* result,
                         nn::Portal* portal) = 0;
  // Backward of the micro-batch ctx holds: the last stage starts from grad_scale * its mean
  // loss (dy ignored), the others from dy. Returns the gradient of x (empty on the first).
  // Parameter gradients accumulate (nn/module.h).
  virtual Tensor backward(nn::Context& ctx, const Tensor& dy, float grad_scale, nn::Portal* portal) = 0;

  // Shapes crossing this stage's boundaries for micro-batches of `rows` samples (T: the
  // sequence length of token models): what it receives (and sends back as a gradient), what it
  // sends on, and the skip tensor a portal carries.
  virtual Shape input_shape(int64_t rows, int64_t T) const = 0;
  virtual Shape output_shape(int64_t rows, int64_t T) const = 0;
  virtual Shape portal_shape(int64_t rows, int64_t T) const { return output_shape(rows, T); }
  // A skip connection crossing stages: this stage makes the tensor, or adds it.
  virtual bool sends_portal() const { return false; }
  virtual bool takes_portal() const { return false; }

  // Data-parallel units in forward order.
  virtual std::vector<StageUnit> units() = 0;
  // A parameter this stage shares with another stage under the same name (GPT's token table,
  // held by the first stage and the last when they differ): the two copies' gradients are
  // summed before the optimizer step (over the group of the ranks holding them). Null: none.
  virtual nn::Param* tied_param() { return nullptr; }
  // This stage's tied parameter is the copy: the gradient norm and checkpoints skip it.
  virtual bool tied_copy() const { return false; }
  // Layers that normalise over the batch (batch norm) reduce their statistics with `reduce`
  // (it replaces the values with their sum over the ranks sharing the batch); null: local.
  virtual void set_batch_stats_reduce(const std::function<void(std::span<double>)>& reduce) {}
  // A classifier's last stage: the predicted class of each sample of its last forward.
  virtual std::vector<int32_t> predictions() const { return {}; }
};

}  // namespace meshtrain::model
