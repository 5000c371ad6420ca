// ReLU: y = max(x, 0), any shape (kernels/relu.h). Saves its output (the mask of backward);
// backward writes dx = dy where y > 0, else 0. No parameters.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class ReLU : public Layer {
 public:
  Tensor forward(Context& ctx, const Tensor& x) override;
  // max(a + b, 0) in one pass (a residual sum and its ReLU); backward as for forward(a + b), the
  // gradient of the sum (that of a and of b alike).
  Tensor forward_sum(Context& ctx, const Tensor& a, const Tensor& b);
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
};

}  // namespace meshtrain::nn
