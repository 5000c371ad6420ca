#include "meshtrain/nn/batchnorm.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "meshtrain/kernels/batchnorm.h"
#include "meshtrain/kernels/layout.h"

namespace meshtrain::nn {

namespace {

int64_t spatial(const Tensor& x) {  // H * W (1 for (N, C))
  int64_t n = 1;
  for (int d = 2; d < x.ndim(); ++d) n *= x.dim(d);
  return n;
}

// The group's count travels to backward in Context::ints as the two halves of its bits.
void save_count(std::vector<int32_t>& out, double count) {
  int32_t w[2];
  std::memcpy(w, &count, sizeof count);
  out.assign(w, w + 2);
}

double load_count(const std::vector<int32_t>& in) {
  double count;
  std::memcpy(&count, in.data(), sizeof count);
  return count;
}

}  // namespace

BatchNorm2d::BatchNorm2d(std::string name, int64_t c, const BatchNormOptions& o)
    : name(name),
      weight(name + ".weight", {c}, o.shard, /*decay=*/false),
      bias(name + ".bias", {c}, o.shard, /*decay=*/false),
      running_mean(Param::buffer(name + ".running_mean", {c}, o.shard)),
      running_var(Param::buffer(name + ".running_var", {c}, o.shard)),
      channels(o.shard.local_shape({c})[0]),
      opt(o) {
  if (c <= 0) throw std::invalid_argument(name + ": the channel count must be positive");
  init_constant(weight, 1.0f);
  init_constant(bias, 0.0f);
  init_constant(running_mean, 0.0f);
  init_constant(running_var, 1.0f);
}

void BatchNorm2d::check_input(const Tensor& x) const {
  if (x.ndim() < 2 || x.dim(1) != channels)
    throw std::invalid_argument(name + ": input " + shape_str(x.shape()) +
                                " is not (N, " + std::to_string(channels) + ", ...)");
  kernels::check_activation_block(block, channels, name.c_str());
}

// ---- forward ----
Tensor BatchNorm2d::forward(Context& ctx, const Tensor& x) {
  check_input(x);
  const int64_t N = x.dim(0), C = channels, HW = spatial(x);
  Tensor y = Tensor::empty(x.shape());
  if (!ctx.training) {
    std::vector<float> rstd(static_cast<size_t>(C));
    kernels::batchnorm_eval_rstd(rstd.data(), running_var.value.data(), C, opt.eps);
    kernels::batchnorm_normalize(y.data(), x.data(), weight.value.data(), bias.value.data(),
                                 running_mean.value.data(), rstd.data(), N, C, HW, ctx.threads, relu_after, block);
    return y;
  }
  std::vector<double> stats(static_cast<size_t>(1 + 2 * C));  // [count, sum x (C), sum x^2 (C)]
  kernels::batchnorm_local_stats(stats.data(), x.data(), N, C, HW, ctx.threads, block);
  if (reduce_stats) reduce_stats(stats);
  Tensor stat = Tensor::empty({2, C});  // mean (C), rstd (C)
  float* mean = stat.data();
  float* rstd = mean + C;
  kernels::batchnorm_stats(mean, rstd, nullptr, stats.data(), C, opt.eps);
  kernels::batchnorm_update_running(running_mean.value.data(), running_var.value.data(), stats.data(), C,
                                    opt.momentum);
  kernels::batchnorm_normalize(y.data(), x.data(), weight.value.data(), bias.value.data(), mean, rstd, N, C, HW,
                               ctx.threads, relu_after, block);
  ctx.save(this, {x, stat});
  save_count(ctx.ints(this), stats[0]);
  return y;
}

// ---- backward ----
Tensor BatchNorm2d::backward(Context& ctx, const Tensor& dy) {
  const std::vector<Tensor> saved = ctx.saved(this);  // shares the storage
  const double count = load_count(ctx.ints(this));
  ctx.release(this);
  const Tensor& x = saved[0];
  const float* mean = saved[1].data();
  const float* rstd = mean + channels;
  const int64_t N = x.dim(0), C = channels, HW = spatial(x);
  std::vector<double> sums(static_cast<size_t>(2 * C));  // [sum dy (C), sum dy xhat (C)]
  const kernels::ReluAfter relu{weight.value.data(), bias.value.data()};
  const kernels::ReluAfter* mask = relu_after ? &relu : nullptr;
  kernels::batchnorm_backward_sums(sums.data(), dy.data(), x.data(), mean, rstd, N, C, HW, ctx.threads, mask, block);
  // The parameter gradients take the local sums, before the group's reduction (with exact
  // sums, nn/context.h, the float64 sums themselves).
  auto add_params = [this](Context& c, const std::vector<double>& local) {
    if (c.grad_slices > 0) {
      weight.add_exact(local.data() + channels);
      bias.add_exact(local.data());
    } else {
      kernels::batchnorm_backward_params(weight.grad.data(), bias.grad.data(), local.data(), channels);
    }
    c.grad_ready(&weight);
    c.grad_ready(&bias);
  };
  if (ctx.defer_weight_grads)
    ctx.defer([add_params, local = sums](Context& c) { add_params(c, local); },
              static_cast<int64_t>(sums.size() * sizeof(double)));
  else
    add_params(ctx, sums);
  if (reduce_stats) reduce_stats(sums);
  Tensor dx = Tensor::empty(x.shape());
  kernels::batchnorm_backward_data(dx.data(), dy.data(), x.data(), weight.value.data(), mean, rstd, sums.data(),
                                   count, N, C, HW, ctx.threads, mask, block);
  return dx;
}

void BatchNorm2d::collect_params(std::vector<Param*>& out) {
  out.push_back(&weight);
  out.push_back(&bias);
}

void BatchNorm2d::collect_buffers(std::vector<Param*>& out) {
  out.push_back(&running_mean);
  out.push_back(&running_var);
}

}  // namespace meshtrain::nn
