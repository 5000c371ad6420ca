// CausalSelfAttention: GPT-2's attention block half, `attn.c_attn` (fused qkv projection,
// (C, 3C)), tiled causal attention (kernels/attention.h), and `attn.c_proj` ((C, C)).
//   forward:  x(B, T, C) -> y(B, T, C)
// Tensor parallelism splits it by heads: c_attn column-parallel (qkv groups = 3), c_proj
// row-parallel; a rank then runs this same code on its n_head / tp heads (parallel/).
#pragma once

#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {

struct AttentionOptions {
  uint64_t seed = 0;
  float init_std = 0.02f;
  float proj_init_std = 0.02f;  // GPT-2 scales the residual projection by 1/sqrt(2 n_layer)
};

class CausalSelfAttention : public Layer {
 public:
  CausalSelfAttention(std::string name, int64_t C, int64_t n_head, const AttentionOptions& opt);
  // For tensor parallelism: projections built by the caller (local heads only).
  CausalSelfAttention(std::unique_ptr<Linear> c_attn, std::unique_ptr<Linear> c_proj,
                      int64_t local_heads);

  Tensor forward(Context& ctx, const Tensor& x) override;   // (B, T, C) -> (B, T, C)
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>& out) override;

  // The attention core without projections: qkv(B, T, 3*Cl) -> (B, T, Cl), Cl = local width.
  Tensor attend(Context& ctx, const Tensor& qkv);
  Tensor attend_backward(Context& ctx, const Tensor& dy);

  std::unique_ptr<Linear> c_attn;
  std::unique_ptr<Linear> c_proj;
  int64_t n_head;  // heads on this rank

 private:
  struct Core {};  // key for the core's saved tensors in the Context
  Core core_;
};

}  // namespace meshtrain::nn
