// GELU activation (tanh approximation, GPT-2). No parameters.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class Gelu : public Layer {
 public:
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
};

}  // namespace meshtrain::nn
