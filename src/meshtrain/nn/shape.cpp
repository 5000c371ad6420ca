#include "meshtrain/nn/shape.h"

#include <stdexcept>

#include "meshtrain/kernels/concat.h"
#include "meshtrain/nn/saved_shape.h"

namespace meshtrain::nn {

namespace {
int64_t spatial(const Shape& s) {  // product of the dimensions after (N, C)
  int64_t n = 1;
  for (size_t d = 2; d < s.size(); ++d) n *= s[d];
  return n;
}
}  // namespace

// ---- flatten ----
Tensor Flatten::forward(Context& ctx, const Tensor& x) {
  if (x.ndim() < 1) throw std::invalid_argument("Flatten: input has no batch dimension");
  const int64_t n = x.dim(0);
  Tensor y = x.clone();
  y.reshape({n, n == 0 ? 0 : x.numel() / n});
  detail::save_input_shape(ctx, this, x.shape());
  return y;
}

Tensor Flatten::backward(Context& ctx, const Tensor& dy) {
  const Shape xs = detail::take_input_shape(ctx, this);
  if (shape_numel(xs) != dy.numel())
    throw std::invalid_argument("Flatten: gradient " + shape_str(dy.shape()) + " does not match input " + shape_str(xs));
  Tensor dx = dy.clone();
  dx.reshape(xs);
  return dx;
}

// ---- concatenation ----
Tensor ConcatChannels::forward(Context& ctx, std::span<const Tensor> xs) {
  if (xs.empty()) throw std::invalid_argument("ConcatChannels: no inputs");
  const Shape& first = xs[0].shape();
  if (first.size() < 2) throw std::invalid_argument("ConcatChannels: input " + shape_str(first) + " has no channels");
  std::vector<const float*> ptrs;
  std::vector<int64_t> channels;
  int64_t total = 0;
  for (const Tensor& x : xs) {
    Shape rest = x.shape(), rest0 = first;
    if (rest.size() == first.size()) rest[1] = rest0[1] = 0;
    if (rest != rest0)
      throw std::invalid_argument("ConcatChannels: inputs " + shape_str(first) + " and " + shape_str(x.shape()) +
                                  " differ in more than the channels");
    ptrs.push_back(x.data());
    channels.push_back(x.dim(1));
    total += x.dim(1);
  }
  Shape ys = first;
  ys[1] = total;
  const int64_t N = first[0], HW = spatial(first);
  Tensor y = Tensor::empty(ys);
  kernels::concat_channels_forward(y.data(), ptrs, channels, N, HW, ctx.threads);
  if (ctx.training) {
    auto& saved = ctx.ints(this);
    saved.clear();
    for (const Tensor& x : xs) detail::push_shape(saved, x.shape());
  }
  return y;
}

std::vector<Tensor> ConcatChannels::backward(Context& ctx, const Tensor& dy) {
  std::vector<int32_t> saved = std::move(ctx.ints(this));
  ctx.release(this);
  std::vector<Tensor> dxs;
  std::vector<float*> ptrs;
  std::vector<int64_t> channels;
  for (size_t at = 0; at < saved.size() || dxs.empty();) {
    dxs.push_back(Tensor::empty(detail::read_shape(saved, at)));
    ptrs.push_back(dxs.back().data());
    channels.push_back(dxs.back().dim(1));
  }
  int64_t total = 0;
  for (int64_t c : channels) total += c;
  Shape expect = dxs[0].shape();
  expect[1] = total;
  if (dy.shape() != expect)
    throw std::invalid_argument("ConcatChannels: gradient " + shape_str(dy.shape()) + " is not " + shape_str(expect));
  const int64_t N = dy.dim(0), HW = spatial(expect);
  kernels::concat_channels_backward(ptrs, dy.data(), channels, N, HW, ctx.threads);
  return dxs;
}

}  // namespace meshtrain::nn
