#include "meshtrain/nn/layernorm.h"

#include "meshtrain/kernels/layernorm.h"

namespace meshtrain::nn {

LayerNorm::LayerNorm(std::string name, int64_t C, float eps)
    : weight(name + ".weight", {C}, {}, /*decay=*/false),
      bias(name + ".bias", {C}, {}, /*decay=*/false),
      eps(eps) {
  init_constant(weight, 1.f);
  init_constant(bias, 0.f);
}

Tensor LayerNorm::forward(Context& ctx, const Tensor& x) {
  const int64_t C = weight.value.numel(), N = x.numel() / C;
  Tensor y = Tensor::empty(x.shape());
  Tensor mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), weight.value.data(),
                             bias.value.data(), N, C, ctx.threads, eps);
  ctx.save(this, {x, mean, rstd});
  return y;
}

void LayerNorm::backward_into(Context& ctx, const Tensor& dy, Tensor& dx) {
  auto& s = ctx.saved(this);
  const Tensor &x = s[0], &mean = s[1], &rstd = s[2];
  const int64_t C = weight.value.numel(), N = x.numel() / C;
  if (ctx.grad_slices <= 0) {
    kernels::layernorm_backward(dx.data(), weight.grad.data(), bias.grad.data(), dy.data(), x.data(),
                                weight.value.data(), mean.data(), rstd.data(), N, C, ctx.threads);
  } else {
    Tensor dw = Tensor::empty({C}), db = Tensor::empty({C});
    for_row_slices(N, ctx.grad_slices, [&](int64_t r0, int64_t rows) {
      dw.zero();
      db.zero();
      kernels::layernorm_backward(dx.data() + r0 * C, dw.data(), db.data(), dy.data() + r0 * C, x.data() + r0 * C,
                                  weight.value.data(), mean.data() + r0, rstd.data() + r0, rows, C, ctx.threads);
      weight.add_exact(dw.data());
      bias.add_exact(db.data());
    });
  }
  ctx.release(this);
  ctx.grad_ready(&weight);
  ctx.grad_ready(&bias);
}

Tensor LayerNorm::backward(Context& ctx, const Tensor& dy) {
  Tensor dx(dy.shape());
  backward_into(ctx, dy, dx);
  return dx;
}

void LayerNorm::collect_params(std::vector<Param*>& out) {
  out.push_back(&weight);
  out.push_back(&bias);
}

}  // namespace meshtrain::nn
