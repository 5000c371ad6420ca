#include "meshtrain/nn/conv.h"

#include <cmath>
#include <functional>
#include <stdexcept>

namespace meshtrain::nn {

Conv2d::Conv2d(std::string name, int64_t in_channels, int64_t out_channels, int64_t k, const Conv2dOptions& opt)
    : weight(name + ".weight", {out_channels, in_channels, k, k}, opt.weight_shard, /*decay=*/true),
      has_bias(opt.bias), input_grad(opt.input_grad), in_block(opt.in_block), out_block(opt.out_block), kernel(k),
      stride(opt.stride), padding(opt.padding), row_padding(opt.row_padding < 0 ? opt.padding : opt.row_padding) {
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
                               .pad_h = row_padding, .pad_w = padding, .src_block = in_block, .dst_block = out_block};
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(weight.name + ": " + e.what());
  }
  return s;
}

// Runs f(slice shape, input offset, output offset) over the context's row slices (all rows at
// once without exact sums): every kernel call then has the same shape at every layout.
namespace {
void over_slices(const Context& ctx, const kernels::Conv2dShape& s,
                 const std::function<void(const kernels::Conv2dShape&, int64_t, int64_t)>& f) {
  const int64_t in = s.IC * s.H * s.W, out = s.OC * s.OH() * s.OW();
  for_row_slices(s.N, ctx.training ? ctx.grad_slices : 0, [&](int64_t r0, int64_t rows) {
    kernels::Conv2dShape t = s;
    t.N = rows;
    f(t, r0 * in, r0 * out);
  });
}
}  // namespace

Tensor Conv2d::forward(Context& ctx, const Tensor& x) {
  const kernels::Conv2dShape s = shape_for(x);
  Tensor y = Tensor::empty({s.N, s.OC, s.OH(), s.OW()});
  const float* b = has_bias && add_bias_in_forward ? bias.value.data() : nullptr;
  const KernelSpan span(ctx, "conv2d forward");
  over_slices(ctx, s, [&](const kernels::Conv2dShape& t, int64_t xi, int64_t yi) {
    kernels::conv2d_forward(y.data() + yi, x.data() + xi, weight.value.data(), b, t, ctx.threads);
  });
  ctx.save(this, {x});
  return y;
}

// The weight and bias gradients of (x, dy): into weight.grad and bias.grad, or with exact sums
// slice by slice into their float64 totals.
void Conv2d::add_weight_grads(Context& ctx, const Tensor& x, const Tensor& dy) {
  const kernels::Conv2dShape s = shape_for(x);
  if (ctx.grad_slices <= 0) {
    const KernelSpan span(ctx, "conv2d weight gradient");
    kernels::conv2d_backward(nullptr, weight.grad.data(), has_bias ? bias.grad.data() : nullptr, dy.data(), x.data(),
                             nullptr, s, ctx.threads);
  } else {
    Tensor dw = Tensor::empty(weight.local_shape()), db = Tensor::empty({has_bias ? s.OC : 0});
    over_slices(ctx, s, [&](const kernels::Conv2dShape& t, int64_t xi, int64_t yi) {
      dw.zero();
      db.zero();
      {
        const KernelSpan span(ctx, "conv2d weight gradient");
        kernels::conv2d_backward(nullptr, dw.data(), has_bias ? db.data() : nullptr, dy.data() + yi, x.data() + xi,
                                 nullptr, t, ctx.threads);
      }
      weight.add_exact(dw.data());
      if (has_bias) bias.add_exact(db.data());
    });
  }
  ctx.grad_ready(&weight);
  if (has_bias) ctx.grad_ready(&bias);
}

Tensor Conv2d::backward(Context& ctx, const Tensor& dy) {
  Tensor x = ctx.saved(this)[0];
  ctx.release(this);
  const kernels::Conv2dShape s = shape_for(x);
  Tensor dx = input_grad ? Tensor::empty(x.shape()) : Tensor();
  if (!ctx.defer_weight_grads && ctx.grad_slices <= 0) {  // one call: the output gradient converted once
    {
      const KernelSpan span(ctx, "conv2d backward");
      kernels::conv2d_backward(input_grad ? dx.data() : nullptr, weight.grad.data(),
                               has_bias ? bias.grad.data() : nullptr, dy.data(), x.data(), weight.value.data(), s,
                               ctx.threads);
    }
    ctx.grad_ready(&weight);
    if (has_bias) ctx.grad_ready(&bias);
    return dx;
  }
  if (input_grad) {
    const KernelSpan span(ctx, "conv2d input gradient");
    over_slices(ctx, s, [&](const kernels::Conv2dShape& t, int64_t xi, int64_t yi) {
      kernels::conv2d_backward(dx.data() + xi, nullptr, nullptr, dy.data() + yi, x.data() + xi, weight.value.data(), t,
                               ctx.threads);
    });
  }
  if (ctx.defer_weight_grads) {  // split backward: dx now, dW (and db) at the W action
    // dy is copied (its owner may reuse the buffer); x is the saved input, which nothing writes.
    // The weight gradient needs no weight values (under ZeRO-3 they are released by now).
    Tensor g = dy.clone();
    ctx.defer([this, x, g](Context& c) { add_weight_grads(c, x, g); }, x.bytes() + g.bytes());
    return dx;
  }
  add_weight_grads(ctx, x, dy);
  return dx;
}

void Conv2d::collect_params(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias) out.push_back(&bias);
}

}  // namespace meshtrain::nn
