// GELU activation: the tanh approximation (GPT-2's, PyTorch's approximate="tanh"; the
// default), or the exact erf form (PyTorch's default nn.GELU()). Any shape; no parameters.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class Gelu : public Layer {
 public:
  explicit Gelu(bool exact = false) : exact(exact) {}
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
  bool exact;
};

}  // namespace meshtrain::nn
