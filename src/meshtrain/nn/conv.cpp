#include "meshtrain/nn/conv.h"

#include <cmath>
#include <stdexcept>

namespace meshtrain::nn {

Conv2d::Conv2d(std::string name, int64_t in_channels, int64_t out_channels, int64_t k, const Conv2dOptions& opt)
    : weight(name + ".weight", {out_channels, in_channels, k, k}, opt.weight_shard, /*decay=*/true),
      has_bias(opt.bias), input_grad(opt.input_grad), in_block(opt.in_block), out_block(opt.out_block), kernel(k), stride(opt.stride), padding(opt.padding) {
  if (in_channels <= 0 || out_channels <= 0 || k <= 0 || stride <= 0 || padding < 0)
    throw std::invalid_argument(name + ": channels, kernel and stride must be positive and padding not negative");
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_channels * k * k));
  init_uniform(weight, opt.seed, -bound, bound);
  if (has_bias) {
    bias = Param(name + ".bias", {out_channels}, opt.bias_shard, /*decay=*/false);
    init_uniform(bias, opt.seed, -bound, bound);
  }
}

kernels::Conv2dShape Conv2d::shape_for(const Tensor& x) const {
  if (x.ndim() != 4 || x.dim(1) != in_local())
    throw std::invalid_argument(weight.name + ": input " + shape_str(x.shape()) + " is not (N, " +
                                std::to_string(in_local()) + ", H, W)");
  const kernels::Conv2dShape s{.N = x.dim(0), .IC = in_local(), .H = x.dim(2), .W = x.dim(3), .OC = out_local(),
                               .KH = kernel, .KW = kernel, .stride_h = stride, .stride_w = stride,
                               .pad_h = padding, .pad_w = padding, .src_block = in_block, .dst_block = out_block};
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(weight.name + ": " + e.what());
  }
  return s;
}

Tensor Conv2d::forward(Context& ctx, const Tensor& x) {
  const kernels::Conv2dShape s = shape_for(x);
  Tensor y = Tensor::empty({s.N, s.OC, s.OH(), s.OW()});
  const float* b = has_bias && add_bias_in_forward ? bias.value.data() : nullptr;
  kernels::conv2d_forward(y.data(), x.data(), weight.value.data(), b, s, ctx.threads);
  ctx.save(this, {x});
  return y;
}

Tensor Conv2d::backward(Context& ctx, const Tensor& dy) {
  Tensor x = ctx.saved(this)[0];
  ctx.release(this);
  const kernels::Conv2dShape s = shape_for(x);
  Tensor dx = input_grad ? Tensor::empty(x.shape()) : Tensor();
  float* dxp = input_grad ? dx.data() : nullptr;
  if (ctx.defer_weight_grads) {  // split backward: dx now, dW (and db) at the W action
    kernels::conv2d_backward(dxp, nullptr, nullptr, dy.data(), x.data(), weight.value.data(), s, ctx.threads);
    defer_weight_grad(ctx, x, dy);
    return dx;
  }
  kernels::conv2d_backward(dxp, weight.grad.data(), has_bias ? bias.grad.data() : nullptr, dy.data(),
                           x.data(), weight.value.data(), s, ctx.threads);
  ctx.grad_ready(&weight);
  if (has_bias) ctx.grad_ready(&bias);
  return dx;
}

void Conv2d::defer_weight_grad(Context& ctx, const Tensor& x, const Tensor& dy) {
  // dy is copied (its owner may reuse the buffer); x is the saved input, which nothing writes.
  Tensor g = dy.clone();
  ctx.defer(
      [this, x, g](Context& c) {
        // The weight gradient needs no weight values (under ZeRO-3 they are released by now).
        kernels::conv2d_backward(nullptr, weight.grad.data(), has_bias ? bias.grad.data() : nullptr, g.data(),
                                 x.data(), nullptr, shape_for(x), c.threads);
        c.grad_ready(&weight);
        if (has_bias) c.grad_ready(&bias);
      },
      x.bytes() + g.bytes());
}

void Conv2d::collect_params(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias) out.push_back(&bias);
}

}  // namespace meshtrain::nn
