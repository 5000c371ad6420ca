#include "meshtrain/nn/attention.h"

#include <stdexcept>

#include "meshtrain/kernels/attention.h"
#include "meshtrain/kernels/bf16.h"

namespace meshtrain::nn {

CausalSelfAttention::CausalSelfAttention(std::string name, int64_t C, int64_t heads,
                                         const AttentionOptions& opt)
    : n_head(heads) {
  if (C % heads != 0)
    throw std::invalid_argument(name + ": width " + std::to_string(C) +
                                " is not divisible by " + std::to_string(heads) + " heads");
  LinearOptions a{.bias = true, .init_std = opt.init_std, .seed = opt.seed};
  LinearOptions p{.bias = true, .init_std = opt.proj_init_std, .seed = opt.seed};
  c_attn = std::make_unique<Linear>(name + ".c_attn", C, 3 * C, a);
  c_proj = std::make_unique<Linear>(name + ".c_proj", C, C, p);
}

CausalSelfAttention::CausalSelfAttention(std::unique_ptr<Linear> qkv, std::unique_ptr<Linear> proj,
                                         int64_t local_heads)
    : c_attn(std::move(qkv)), c_proj(std::move(proj)), n_head(local_heads) {}

Tensor CausalSelfAttention::attend(Context& ctx, const Tensor& qkv) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  Tensor y = Tensor::empty({B, T, C});
  Tensor lse = Tensor::empty({B, n_head, T});
  // bf16: the products take bf16 operands (Q, K, V rounded here, so backward sees the same
  // values) and accumulate in float32, as do the softmax statistics; the kernel itself is the
  // float32 one (a product of two bf16 values is exact in float32).
  // qkv is c_attn's output, held by nothing else: rounded in place (a handle sharing its storage).
  if (ctx.precision == kernels::Precision::bf16) {
    Tensor shared = qkv;
    kernels::round_bf16(shared.data(), shared.numel(), ctx.threads);
  }
  kernels::attention_forward(y.data(), lse.data(), qkv.data(), B, T, C, n_head, ctx.threads);
  ctx.save(static_cast<const void*>(&core_), {qkv, y, lse});
  return y;
}

Tensor CausalSelfAttention::attend_backward(Context& ctx, const Tensor& dy) {
  const void* key = &core_;
  auto& s = ctx.saved(key);
  const Tensor &qkv = s[0], &y = s[1], &lse = s[2];
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  Tensor dqkv = Tensor::empty(qkv.shape());
  Tensor dy16;
  if (ctx.precision == kernels::Precision::bf16) {
    dy16 = dy.clone();
    kernels::round_bf16(dy16.data(), dy16.numel(), ctx.threads);
  }
  kernels::attention_backward(dqkv.data(), (dy16.numel() ? dy16 : dy).data(), qkv.data(), y.data(), lse.data(), B, T, C,
                              n_head, ctx.threads);
  ctx.release(key);
  return dqkv;
}

Tensor CausalSelfAttention::forward(Context& ctx, const Tensor& x) {
  if (x.ndim() != 3) throw std::invalid_argument("attention input must be (B, T, C)");
  Tensor qkv = c_attn->forward(ctx, x);  // (B, T, 3C)
  Tensor y = attend(ctx, qkv);           // (B, T, C)
  return c_proj->forward(ctx, y);        // (B, T, C)
}

Tensor CausalSelfAttention::backward(Context& ctx, const Tensor& dy) {
  Tensor dyatt = c_proj->backward(ctx, dy);
  Tensor dqkv = attend_backward(ctx, dyatt);
  return c_attn->backward(ctx, dqkv);
}

void CausalSelfAttention::collect_params(std::vector<Param*>& out) {
  c_attn->collect_params(out);
  c_proj->collect_params(out);
}

}  // namespace meshtrain::nn
