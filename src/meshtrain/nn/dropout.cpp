#include "meshtrain/nn/dropout.h"

#include <stdexcept>

#include "meshtrain/nn/context.h"
#include "meshtrain/tensor/rng.h"

namespace meshtrain::nn {

Dropout::Dropout(std::string name, double p, uint64_t seed) : name_(std::move(name)), p_(p), seed_(seed) {
  if (!(p >= 0 && p < 1)) throw std::invalid_argument("Dropout " + name_ + ": p must be in [0, 1)");
}

Tensor Dropout::forward(Context& ctx, const Tensor& x) {
  if (ctx.step < 0 || p_ == 0) {  // evaluation (or nothing to drop): the identity
    if (ctx.training) ctx.save(this, {});
    return x;
  }
  const int64_t rows = x.shape().at(0), per = x.numel() / rows;
  // One stream a (layer, step); element (global sample, element) is its counter.
  const uint64_t key = stream_key(seed_ ^ (static_cast<uint64_t>(ctx.step) * 0x9E3779B97F4A7C15ull), "dropout:" + name_);
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p_)), p = static_cast<float>(p_);
  Tensor mask = Tensor::empty(x.shape()), y = Tensor::empty(x.shape());
  const float* xs = x.data();
  float *m = mask.data(), *ys = y.data();
#pragma omp parallel for num_threads(ctx.threads) schedule(static)
  for (int64_t n = 0; n < rows; ++n) {
    const uint64_t first = static_cast<uint64_t>(ctx.first_sample + n) * static_cast<uint64_t>(per);
    for (int64_t e = 0; e < per; ++e) {
      const int64_t i = n * per + e;
      m[i] = philox_uniform(key, first + static_cast<uint64_t>(e)) < p ? 0.f : keep_scale;
      ys[i] = xs[i] * m[i];
    }
  }
  if (ctx.training) ctx.save(this, {mask});
  return y;
}

Tensor Dropout::backward(Context& ctx, const Tensor& dy) {
  std::vector<Tensor> saved = ctx.saved(this);
  ctx.release(this);
  if (saved.empty()) return dy;  // it passed x through
  const Tensor& mask = saved[0];
  Tensor dx = Tensor::empty(dy.shape());
  const float *m = mask.data(), *g = dy.data();
  float* d = dx.data();
  const int64_t n = dy.numel();
#pragma omp parallel for num_threads(ctx.threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = g[i] * m[i];
  return dx;
}

}  // namespace meshtrain::nn
