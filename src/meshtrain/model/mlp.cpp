#include "meshtrain/model/mlp.h"

#include <stdexcept>

namespace meshtrain::model {

MLP::MLP(const std::vector<int64_t>& dims, uint64_t seed, const std::string& prefix) {
  if (dims.size() < 2) throw std::invalid_argument("MLP needs at least an input and an output size");
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    layers.push_back(std::make_unique<nn::Linear>(prefix + "." + std::to_string(i), dims[i],
                                                  dims[i + 1], nn::LinearOptions{.seed = seed}));
    if (i + 2 < dims.size()) acts.push_back(std::make_unique<nn::Gelu>());
  }
}

Tensor MLP::forward(nn::Context& ctx, const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers.size(); ++i) {
    h = layers[i]->forward(ctx, h);
    if (i < acts.size()) h = acts[i]->forward(ctx, h);
  }
  return h;
}

Tensor MLP::backward(nn::Context& ctx, const Tensor& dy) {
  Tensor d = dy;
  for (size_t i = layers.size(); i-- > 0;) {
    if (i < acts.size()) d = acts[i]->backward(ctx, d);
    d = layers[i]->backward(ctx, d);
  }
  return d;
}

void MLP::collect_params(std::vector<nn::Param*>& out) {
  for (auto& l : layers) l->collect_params(out);
}

}  // namespace meshtrain::model
