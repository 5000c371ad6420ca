// LayerNorm over the last dimension (eps 1e-5 unless given), with weight and bias (GPT-2's
// `ln_*`; an image model's after a flatten). Exact sums (Context::grad_slices): the parameter
// gradients slice by slice into their float64 totals.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class LayerNorm : public Layer {
 public:
  LayerNorm(std::string name, int64_t C, float eps = 1e-5f);

  Tensor forward(Context& ctx, const Tensor& x) override;    // (N.., C) -> (N.., C)
  Tensor backward(Context& ctx, const Tensor& dy) override;  // written
  // Adds the input gradient into dx (the residual stream's gradient): saves a pass.
  void backward_into(Context& ctx, const Tensor& dy, Tensor& dx);
  void collect_params(std::vector<Param*>& out) override;

  Param weight;  // (C)
  Param bias;    // (C)
  float eps;
};

}  // namespace meshtrain::nn
