#include "meshtrain/nn/activation.h"

#include "meshtrain/kernels/relu.h"

namespace meshtrain::nn {

Tensor ReLU::forward(Context& ctx, const Tensor& x) {
  Tensor y = Tensor::empty(x.shape());
  kernels::relu_forward(y.data(), x.data(), x.numel(), ctx.threads);
  ctx.save(this, {y});
  return y;
}

Tensor ReLU::backward(Context& ctx, const Tensor& dy) {
  Tensor y = ctx.saved(this)[0];
  ctx.release(this);
  Tensor dx = Tensor::empty(y.shape());
  kernels::relu_backward(dx.data(), y.data(), dy.data(), y.numel(), ctx.threads);
  return dx;
}

}  // namespace meshtrain::nn
