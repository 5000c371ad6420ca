// Dropout (`dropout` in a layer graph, docs/models.md): in training, each element is zeroed with
// probability p and the others scaled by 1 / (1 - p); in evaluation it passes x through. The mask
// is a pure function of (seed, the layer's name, the step, the sample's index in the step's
// global batch, the element's index in the sample), drawn by Philox (tensor/rng.h), so it is the
// same at every layout: a data-parallel rank, a pipeline stage or a micro-batch draws the
// elements of exactly the samples it holds (nn::Context::step and first_sample say which).
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class Dropout : public Layer {
 public:
  Dropout(std::string name, double p, uint64_t seed);
  // x: (rows, ...) of whole samples; element (n, e) is dropped when its draw is below p.
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
  double p() const { return p_; }

 private:
  std::string name_;
  double p_;
  uint64_t seed_;
};

}  // namespace meshtrain::nn
