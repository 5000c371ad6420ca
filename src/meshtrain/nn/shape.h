// Layers that only move elements: no parameters, backward writes the input gradient.
//
//   Flatten:        (N, d1, d2, ...) -> (N, d1 * d2 * ...), row-major, as torch.flatten(x, 1).
//                   Forward and backward COPY (one pass over the tensor) rather than return a
//                   view: the tensor a module returns belongs to its caller, who may write into
//                   it (model/gpt.cpp adds the residual into a layer's output), and a view would
//                   carry that write into a tensor another module saved for backward.
//   ConcatChannels: tensors (N, C_i, H, W) with one N, H, W -> (N, sum C_i, H, W), as
//                   torch.cat(xs, 1) (kernels/concat.h); backward splits the gradient back into
//                   one tensor per input. Not a Layer: it takes several inputs.
// Both keep the input shapes (Context::ints) for backward; an evaluation Context saves nothing.
#pragma once

#include <span>

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class Flatten : public Layer {
 public:
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
};

class ConcatChannels : public Module {
 public:
  Tensor forward(Context& ctx, std::span<const Tensor> xs);    // (N, C_i, H, W)... -> (N, sum C_i, H, W)
  std::vector<Tensor> backward(Context& ctx, const Tensor& dy);  // -> one (N, C_i, H, W) per input
  void collect_params(std::vector<Param*>&) override {}
};

}  // namespace meshtrain::nn
