#include "meshtrain/nn/gelu.h"

#include "meshtrain/kernels/gelu.h"

namespace meshtrain::nn {

Tensor Gelu::forward(Context& ctx, const Tensor& x) {
  Tensor y = Tensor::empty(x.shape());
  if (exact) kernels::gelu_erf_forward(y.data(), x.data(), x.numel(), ctx.threads);
  else kernels::gelu_forward(y.data(), x.data(), x.numel(), ctx.threads);
  ctx.save(this, {x});
  return y;
}

Tensor Gelu::backward(Context& ctx, const Tensor& dy) {
  Tensor x = ctx.saved(this)[0];
  ctx.release(this);
  Tensor dx = Tensor::empty(x.shape());
  if (exact) kernels::gelu_erf_backward(dx.data(), x.data(), dy.data(), x.numel(), ctx.threads);
  else kernels::gelu_backward(dx.data(), x.data(), dy.data(), x.numel(), ctx.threads);
  return dx;
}

}  // namespace meshtrain::nn
