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

  std::vector<Param*> params();
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
