#include "meshtrain/nn/activation.h"

#include <stdexcept>
#include <string>

#include "meshtrain/kernels/relu.h"
#include "meshtrain/nn/shape.h"

namespace meshtrain::nn {

Tensor ReLU::forward(Context& ctx, const Tensor& x) {
  Tensor y = Tensor::empty(x.shape());
  kernels::relu_forward(y.data(), x.data(), x.numel(), ctx.threads);
  ctx.save(this, {y});
  return y;
}

Tensor ReLU::forward_sum(Context& ctx, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw std::invalid_argument("ReLU::forward_sum: " + shape_str(a.shape()) + " and " + shape_str(b.shape()) +
                                " differ");
  Tensor y = Tensor::empty(a.shape());
  kernels::add_relu_forward(y.data(), a.data(), b.data(), a.numel(), ctx.threads);
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
