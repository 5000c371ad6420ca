// MLP: a stack of Linear layers with GELU between them (the smallest model meshtrain builds;
// used to test layers and parallel strategies without attention).
//   forward: x(N, dims[0]) -> (N, dims.back())
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/nn/gelu.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain::model {

class MLP : public nn::Layer {
 public:
  // dims = {in, hidden..., out}; parameters are named "{prefix}.{i}.weight" / ".bias".
  MLP(const std::vector<int64_t>& dims, uint64_t seed, const std::string& prefix = "mlp");

  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<nn::Param*>& out) override;

  std::vector<std::unique_ptr<nn::Linear>> layers;
  std::vector<std::unique_ptr<nn::Gelu>> acts;  // one between consecutive layers
};

}  // namespace meshtrain::model
