// ReLU: y = max(x, 0), any shape (kernels/relu.h). Saves its output (the mask of backward);
// backward writes dx = dy where y > 0, else 0. No parameters.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class ReLU : public Layer {
 public:
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
};

}  // namespace meshtrain::nn
