// Linear: y(N.., OC) = x(N.., C) @ weight(C, OC) + bias(OC). The weight is stored (in, out), the
// layout of GPT-2's Conv1D, so published checkpoints load without a transpose.
// A shard spec on construction makes it a tensor-parallel piece: split along dim 1 (output
// features) it is column-parallel, along dim 0 (input features) row-parallel; the
// communication around those lives in parallel/, not here.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

struct LinearOptions {
  bool bias = true;
  float init_std = 0.02f;
  uint64_t seed = 0;
  ShardSpec weight_shard = {};  // global weight is (in, out)
  ShardSpec bias_shard = {};    // global bias is (out)
};

class Linear : public Layer {
 public:
  Linear(std::string name, int64_t in, int64_t out, const LinearOptions& opt = {});

  Tensor forward(Context& ctx, const Tensor& x) override;   // (N.., in) -> (N.., out)
  Tensor backward(Context& ctx, const Tensor& dy) override; // (N.., out) -> (N.., in)
  void collect_params(std::vector<Param*>& out) override;

  int64_t in_local() const { return weight.local_shape()[0]; }  // also while ZeRO-3 has released the values
  int64_t out_local() const { return weight.local_shape()[1]; }

  Param weight;  // (in, out), local part
  Param bias;    // (out), local part; empty when bias = false
  bool has_bias;
  // A row-parallel rank adds the bias once after the all-reduce, not per rank: the parallel
  // layer sets this to false and adds the bias itself.
  bool add_bias_in_forward = true;

 protected:
  // Split backward (ctx.defer_weight_grads): hands ctx the weight and bias gradient of input x
  // and output gradient dy, to run at the W action.
  void defer_weight_grad(Context& ctx, const Tensor& x, const Tensor& dy);
  // The weight and bias gradients of input x and output gradient dy, added (into grad, or with
  // ctx.grad_slices slice by slice into grad_exact, nn/context.h) and reported ready.
  void add_weight_grads(Context& ctx, const Tensor& x, const Tensor& dy);
};

}  // namespace meshtrain::nn
