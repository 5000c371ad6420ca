// Module: a layer with an explicit forward and backward (DESIGN decision 5, as llm.c and
// Megatron's fused layers do). Forward reads its input, saves what backward needs in the
// per-micro-batch Context, and returns its output; backward takes the gradient of the output
// and returns the gradient of the input.
//
// THE GRADIENT RULE (stated once, here, for all of meshtrain):
//   parameter gradients ACCUMULATE (+=) into Param::grad, so micro-batches and tied weights
//   add up without extra buffers; the trainer zeroes them once per step;
//   activation gradients are WRITTEN (=): backward returns a fresh tensor. Where a kernel adds
//   into an activation gradient instead (layernorm backward into the residual stream), its
//   header says so.
//
// BUFFERS: state a module keeps and a checkpoint saves but nothing trains (batch norm's running
// mean and variance) are Params whose grad is empty (Param::buffer), listed by collect_buffers,
// never by collect_params. The optimizer, gradient synchronisation and ZeRO all work from
// params(), so they never see a buffer; whoever saves or loads a model's state reads both.
// A module with children forwards collect_buffers to them as it does collect_params.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/nn/context.h"
#include "meshtrain/nn/param.h"

namespace meshtrain::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Appends this module's parameters (and its children's) in a fixed order.
  virtual void collect_params(std::vector<Param*>& out) = 0;
  // Appends this module's buffers (and its children's) in a fixed order; none by default.
  virtual void collect_buffers(std::vector<Param*>& out) {}

  std::vector<Param*> params();
  std::vector<Param*> buffers();
  int64_t num_params();  // local elements
  void zero_grad();
};

// A module mapping one tensor to one tensor.
class Layer : public Module {
 public:
  virtual Tensor forward(Context& ctx, const Tensor& x) = 0;
  virtual Tensor backward(Context& ctx, const Tensor& dy) = 0;
};

}  // namespace meshtrain::nn
