#include "meshtrain/nn/pool.h"

#include <stdexcept>
#include <string>

#include "meshtrain/nn/saved_shape.h"

namespace meshtrain::nn {

namespace {

kernels::Pool2dShape pool_shape(const Shape& x, int64_t k, int64_t stride, int64_t padding, const char* what) {
  if (x.size() != 4) throw std::invalid_argument(std::string(what) + ": input " + shape_str(x) + " is not (N, C, H, W)");
  const kernels::Pool2dShape s{.N = x[0], .C = x[1], .H = x[2], .W = x[3], .KH = k, .KW = k, .stride_h = stride,
                               .stride_w = stride, .pad_h = padding, .pad_w = padding};
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(what) + ": " + e.what());
  }
  return s;
}

}  // namespace

// ---- max ----
MaxPool2d::MaxPool2d(int64_t k, const Pool2dOptions& opt)
    : kernel(k), stride(opt.stride == 0 ? k : opt.stride), padding(opt.padding) {}

Tensor MaxPool2d::forward(Context& ctx, const Tensor& x) {
  const kernels::Pool2dShape s = pool_shape(x.shape(), kernel, stride, padding, "MaxPool2d");
  Tensor y = Tensor::empty({s.N, s.C, s.OH(), s.OW()});
  if (!ctx.training) {
    kernels::maxpool2d_forward(y.data(), nullptr, x.data(), s, ctx.threads);
    return y;
  }
  // The argmax (int32, one per output) in a tensor's storage: saved activation memory like any
  // other, counted and served as such (tensor/tensor.h).
  Tensor argmax = Tensor::empty({y.numel()});
  static_assert(sizeof(int32_t) == sizeof(float));
  kernels::maxpool2d_forward(y.data(), reinterpret_cast<int32_t*>(argmax.data()), x.data(), s, ctx.threads);
  ctx.save(this, {argmax});
  detail::save_input_shape(ctx, this, x.shape());
  return y;
}

Tensor MaxPool2d::backward(Context& ctx, const Tensor& dy) {
  const std::vector<Tensor> kept = ctx.saved(this);
  const Shape xs = detail::take_input_shape(ctx, this);  // throws when forward saved nothing
  const Tensor& argmax = kept.at(0);
  const kernels::Pool2dShape s = pool_shape(xs, kernel, stride, padding, "MaxPool2d");
  Tensor dx = Tensor::empty(xs);
  kernels::maxpool2d_backward(dx.data(), dy.data(), reinterpret_cast<const int32_t*>(argmax.data()), s, ctx.threads);
  return dx;
}

// ---- average ----
AvgPool2d::AvgPool2d(int64_t k, const Pool2dOptions& opt)
    : kernel(k), stride(opt.stride == 0 ? k : opt.stride), padding(opt.padding),
      count_include_pad(opt.count_include_pad) {}

Tensor AvgPool2d::forward(Context& ctx, const Tensor& x) {
  const kernels::Pool2dShape s = pool_shape(x.shape(), kernel, stride, padding, "AvgPool2d");
  Tensor y = Tensor::empty({s.N, s.C, s.OH(), s.OW()});
  kernels::avgpool2d_forward(y.data(), x.data(), s, count_include_pad, ctx.threads);
  detail::save_input_shape(ctx, this, x.shape());
  return y;
}

Tensor AvgPool2d::backward(Context& ctx, const Tensor& dy) {
  const Shape xs = detail::take_input_shape(ctx, this);
  const kernels::Pool2dShape s = pool_shape(xs, kernel, stride, padding, "AvgPool2d");
  Tensor dx = Tensor::empty(xs);
  kernels::avgpool2d_backward(dx.data(), dy.data(), s, count_include_pad, ctx.threads);
  return dx;
}

// ---- global average ----
Tensor GlobalAvgPool::forward(Context& ctx, const Tensor& x) {
  if (x.ndim() != 4) throw std::invalid_argument("GlobalAvgPool: input " + shape_str(x.shape()) + " is not (N, C, H, W)");
  Tensor y = Tensor::empty({x.dim(0), x.dim(1), 1, 1});
  if (block)
    kernels::global_avgpool_blocked_forward(y.data(), x.data(), x.dim(0), x.dim(1), x.dim(2) * x.dim(3), block,
                                            ctx.threads);
  else
    kernels::global_avgpool_forward(y.data(), x.data(), x.dim(0) * x.dim(1), x.dim(2) * x.dim(3), ctx.threads);
  detail::save_input_shape(ctx, this, x.shape());
  return y;
}

Tensor GlobalAvgPool::backward(Context& ctx, const Tensor& dy) {
  const Shape xs = detail::take_input_shape(ctx, this);
  Tensor dx = Tensor::empty(xs);
  if (block)
    kernels::global_avgpool_blocked_backward(dx.data(), dy.data(), xs[0], xs[1], xs[2] * xs[3], block, ctx.threads);
  else
    kernels::global_avgpool_backward(dx.data(), dy.data(), xs[0] * xs[1], xs[2] * xs[3], ctx.threads);
  return dx;
}

}  // namespace meshtrain::nn
