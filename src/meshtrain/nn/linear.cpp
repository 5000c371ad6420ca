#include "meshtrain/nn/linear.h"

#include <stdexcept>

#include "meshtrain/kernels/linear.h"

namespace meshtrain::nn {

Linear::Linear(std::string name, int64_t in, int64_t out, const LinearOptions& opt)
    : weight(name + ".weight", {in, out}, opt.weight_shard, /*decay=*/true), has_bias(opt.bias) {
  init_normal(weight, opt.seed, opt.init_std);
  if (has_bias) {
    bias = Param(name + ".bias", {out}, opt.bias_shard, /*decay=*/false);
    init_constant(bias, 0.f);
  }
}

Tensor Linear::forward(Context& ctx, const Tensor& x) {
  const int64_t C = in_local(), OC = out_local();
  if (x.dim(-1) != C)
    throw std::invalid_argument(weight.name + ": input " + shape_str(x.shape()) +
                                " does not end in " + std::to_string(C));
  const int64_t N = x.numel() / C;
  Shape ys = x.shape();
  ys.back() = OC;
  Tensor y = Tensor::empty(ys);
  const float* b = has_bias && add_bias_in_forward ? bias.value.data() : nullptr;
  // With exact sums slice by slice (nn/context.h): the same products at every layout.
  for_row_slices(N, ctx.training ? ctx.grad_slices : 0, [&](int64_t r0, int64_t rows) {
    kernels::linear_forward(y.data() + r0 * OC, x.data() + r0 * C, weight.value.data(), b, rows, C, OC,
                            ctx.gemm_with(weight));
  });
  ctx.save(this, {x});
  return y;
}

Tensor Linear::backward(Context& ctx, const Tensor& dy) {
  Tensor x = ctx.saved(this)[0];
  ctx.release(this);
  const int64_t C = in_local(), OC = out_local(), N = x.numel() / C;
  Tensor dx = Tensor::empty(x.shape());
  if (!ctx.defer_weight_grads && ctx.grad_slices <= 0) {
    kernels::linear_backward(dx.data(), weight.grad.data(), has_bias ? bias.grad.data() : nullptr,
                             dy.data(), x.data(), weight.value.data(), N, C, OC, ctx.gemm_with(weight));
    ctx.grad_ready(&weight);
    if (has_bias) ctx.grad_ready(&bias);
    return dx;
  }
  for_row_slices(N, ctx.grad_slices, [&](int64_t r0, int64_t rows) {
    kernels::linear_backward(dx.data() + r0 * C, nullptr, nullptr, dy.data() + r0 * OC, x.data() + r0 * C,
                             weight.value.data(), rows, C, OC, ctx.gemm_with(weight));
  });
  if (ctx.defer_weight_grads) {  // split backward: dx now, dW (and db) at the W action
    defer_weight_grad(ctx, x, dy);
    return dx;
  }
  add_weight_grads(ctx, x, dy);
  return dx;
}

// dW = x^T dy and db: into weight.grad and bias.grad, or with exact sums slice by slice into
// their float64 totals. Needs no weight values (under ZeRO-3 they may be released by now).
void Linear::add_weight_grads(Context& ctx, const Tensor& x, const Tensor& dy) {
  const int64_t C = in_local(), OC = out_local(), N = x.numel() / C;
  if (ctx.grad_slices <= 0) {
    kernels::linear_backward(nullptr, weight.grad.data(), has_bias ? bias.grad.data() : nullptr, dy.data(), x.data(),
                             nullptr, N, C, OC, ctx.gemm());
  } else {
    Tensor dw = Tensor::empty(weight.local_shape()), db = Tensor::empty({has_bias ? OC : 0});
    for_row_slices(N, ctx.grad_slices, [&](int64_t r0, int64_t rows) {
      dw.zero();
      db.zero();
      kernels::linear_backward(nullptr, dw.data(), has_bias ? db.data() : nullptr, dy.data() + r0 * OC,
                               x.data() + r0 * C, nullptr, rows, C, OC, ctx.gemm());
      weight.add_exact(dw.data());
      if (has_bias) bias.add_exact(db.data());
    });
  }
  ctx.grad_ready(&weight);
  if (has_bias) ctx.grad_ready(&bias);
}

void Linear::defer_weight_grad(Context& ctx, const Tensor& x, const Tensor& dy) {
  // dy is copied: the caller may go on writing into its buffer (the residual stream's
  // gradient); x is the input saved by forward, which nothing writes.
  Tensor g = dy.clone();
  ctx.defer([this, x, g](Context& c) { add_weight_grads(c, x, g); }, x.bytes() + g.bytes());
}

void Linear::collect_params(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias) out.push_back(&bias);
}

}  // namespace meshtrain::nn
