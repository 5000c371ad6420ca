// Tensor-parallel layers, the block, the builder, and the checkpoint / clipping helpers
// (tensor_parallel.h).
#include "meshtrain/parallel/tensor/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "meshtrain/kernels/gemm.h"
#include "meshtrain/kernels/linear.h"
#include "meshtrain/parallel/tensor/tp_layout.h"
#include "meshtrain/parallel/tensor/tp_regions.h"

namespace meshtrain::parallel {

// ---- validation ----

void validate_tp(const model::GPTConfig& cfg, int tp, const TPOptions& opt, int64_t seq) {
  const std::string p = std::to_string(tp);
  if (tp < 1) throw std::invalid_argument("--tp must be at least 1, got " + p + ".");
  if (tp == 1) return;
  if (tp > cfg.n_head)
    throw std::invalid_argument("--tp " + p + " is larger than the model's " +
                                std::to_string(cfg.n_head) +
                                " attention heads; use a tp that divides the head count.");
  if (cfg.n_head % tp != 0)
    throw std::invalid_argument("the model's " + std::to_string(cfg.n_head) +
                                " attention heads do not divide over --tp " + p +
                                "; use a tp that divides the head count.");
  if (cfg.n_embd % tp != 0)
    throw std::invalid_argument("hidden size " + std::to_string(cfg.n_embd) +
                                " does not divide over --tp " + p +
                                "; use a tp that divides n_embd.");
  if (cfg.mlp_width() % tp != 0)
    throw std::invalid_argument("the MLP's hidden width " + std::to_string(cfg.mlp_width()) +
                                " does not divide over --tp " + p + "; use a tp that divides it.");
  if (cfg.vocab_size % tp != 0 && !opt.pad_vocab)
    throw std::invalid_argument(
        "vocabulary of " + std::to_string(cfg.vocab_size) + " does not divide over --tp " + p +
        "; add --pad-vocab (each rank then holds " +
        std::to_string((cfg.vocab_size + tp - 1) / tp) +
        " rows, the padding left out of the loss, which stays the unpadded model's) or use a tp "
        "that divides it.");
  if (opt.sequence_parallel && seq > 0 && seq % tp != 0)
    throw std::invalid_argument("--sequence-parallel splits the sequence over --tp " + p +
                                ", but --seq " + std::to_string(seq) +
                                " does not divide by it; use a sequence length divisible by tp.");
}

// ---- ColumnParallelLinear: CopyToTP (or GatherFromSP), then the local columns ----

namespace {
nn::LinearOptions column_options(const ParallelLinearOptions& o, const comm::Communicator& tp) {
  return {.bias = o.bias,
          .init_std = o.init_std,
          .seed = o.seed,
          .weight_shard = nn::ShardSpec::split(1, tp.rank(), tp.size(), o.groups),
          .bias_shard = nn::ShardSpec::split(0, tp.rank(), tp.size(), o.groups)};
}
nn::LinearOptions row_options(const ParallelLinearOptions& o, const comm::Communicator& tp) {
  return {.bias = o.bias,
          .init_std = o.init_std,
          .seed = o.seed,
          .weight_shard = nn::ShardSpec::split(0, tp.rank(), tp.size()),
          .bias_shard = nn::ShardSpec::replicated()};
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(std::string name, int64_t in, int64_t out,
                                           std::shared_ptr<comm::Communicator> tp,
                                           const ParallelLinearOptions& opt)
    : nn::Linear(std::move(name), in, out, column_options(opt, *tp)),
      tp_(std::move(tp)),
      sp_(opt.sequence_parallel) {}

Tensor ColumnParallelLinear::forward(nn::Context& ctx, const Tensor& x) {
  if (!sp_) return nn::Linear::forward(ctx, CopyToTP::forward(*tp_, x));  // (B, T, out/p)
  Tensor y = nn::Linear::forward(ctx, GatherFromSP::forward(*tp_, x));  // (B, T, out/p)
  // Keep only the sequence shard (B, T/p, in) for backward, which gathers it again: the
  // gathered input is not held between forward and backward (Megatron's SP memory saving).
  ctx.save(this, {x});
  return y;
}

// Backward overlaps its communication with the two products, as Megatron does:
//   SP: start re-gathering the input | dx = dy W^T | wait; start reduce-scattering dx | dW, db
//   no SP:                             dx = dy W^T | start all-reducing dx          | dW, db
// (the tp communicator runs its operations one at a time, in this order, on every rank).
Tensor ColumnParallelLinear::backward(nn::Context& ctx, const Tensor& dy) {
  Tensor saved = ctx.saved(this)[0];  // (B, T, in), or its sequence shard under SP
  ctx.release(this);
  Tensor x = saved;
  comm::Work gather;
  if (sp_) gather = GatherFromSP::forward_start(*tp_, saved, x);
  const int64_t C = in_local(), OC = out_local(), N = dy.numel() / OC;
  Shape xs = dy.shape();
  xs.back() = C;
  Tensor dx = Tensor::empty(xs);  // (B, T, in), partial over ranks
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, N, C, OC, 1.f, dy.data(), OC,
                weight.value.data(), OC, 0.f, dx.data(), C, ctx.gemm_with(weight));
  gather.wait();
  Tensor dx_out = dx;
  comm::Work reduce = sp_ ? GatherFromSP::backward_start(*tp_, dx, dx_out)
                          : CopyToTP::backward_start(*tp_, dx_out);
  if (ctx.defer_weight_grads) {  // split backward: the weight gradient at the W action
    defer_weight_grad(ctx, x, dy);  // x is the gathered input under SP
    reduce.wait();
    return dx_out;
  }
  kernels::linear_backward(nullptr, weight.grad.data(), has_bias ? bias.grad.data() : nullptr,
                           dy.data(), x.data(), weight.value.data(), N, C, OC, ctx.gemm());
  reduce.wait();
  ctx.grad_ready(&weight);
  if (has_bias) ctx.grad_ready(&bias);
  return dx_out;
}

// ---- RowParallelLinear: the local rows, then ReduceFromTP (or ReduceScatterToSP) + bias ----

RowParallelLinear::RowParallelLinear(std::string name, int64_t in, int64_t out,
                                     std::shared_ptr<comm::Communicator> tp,
                                     const ParallelLinearOptions& opt)
    : nn::Linear(std::move(name), in, out, row_options(opt, *tp)),
      tp_(std::move(tp)),
      sp_(opt.sequence_parallel) {
  add_bias_in_forward = false;  // added once, after the reduction
}

Tensor RowParallelLinear::forward(nn::Context& ctx, const Tensor& x) {
  Tensor part = nn::Linear::forward(ctx, x);  // (B, T, out), partial over ranks, no bias
  Tensor y = sp_ ? ReduceScatterToSP::forward(*tp_, part) : ReduceFromTP::forward(*tp_, part);
  if (has_bias) {
    const int64_t OC = out_local(), n = y.numel() / OC;
    const float* b = bias.value.data();
    float* py = y.data();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < OC; ++j) py[i * OC + j] += b[j];
  }
  return y;
}

Tensor RowParallelLinear::backward(nn::Context& ctx, const Tensor& dy) {
  // The full (B, T, out) gradient: so the bias gradient Linear::backward sums is complete.
  Tensor dfull = sp_ ? ReduceScatterToSP::backward(*tp_, dy) : ReduceFromTP::backward(*tp_, dy);
  return nn::Linear::backward(ctx, dfull);  // (B, T, in/p)
}

// ---- partial gradients of sequence-parallel regions ----

void reduce_partial_grads(nn::Context& ctx, comm::Communicator& tp,
                          const std::vector<nn::Param*>& params,
                          const std::function<void()>& body) {
  // Redirect the gradients to zeroed buffers (the real ones may hold earlier micro-batches).
  std::vector<Tensor> kept;
  int64_t total = 0;
  for (nn::Param* p : params) {
    kept.push_back(p->grad);
    p->grad = Tensor(p->grad.shape());
    total += p->grad.numel();
  }
  // Hold back their grad_ready calls; pass every other one through.
  nn::Hooks* outer = ctx.hooks;
  nn::Hooks held;
  if (outer) {
    held = *outer;
    std::unordered_set<const nn::Param*> set(params.begin(), params.end());
    held.grad_ready = [outer, set](nn::Param* p) {
      if (!set.count(p) && outer->grad_ready) outer->grad_ready(p);
    };
    ctx.hooks = &held;
  }
  try {
    body();
  } catch (...) {
    ctx.hooks = outer;
    for (size_t i = 0; i < params.size(); ++i) params[i]->grad = kept[i];
    throw;
  }
  ctx.hooks = outer;
  // One packed all-reduce, then accumulate into the real gradients.
  std::vector<float> buf(static_cast<size_t>(total));
  int64_t off = 0;
  for (nn::Param* p : params) {
    std::memcpy(buf.data() + off, p->grad.data(), p->grad.bytes());
    off += p->grad.numel();
  }
  tp.all_reduce(std::span<float>(buf), {.algorithm = kTPAlgorithm});
  off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Param* p = params[i];
    p->grad = kept[i];
    float* g = p->grad.data();
    for (int64_t j = 0; j < p->grad.numel(); ++j) g[j] += buf[off + j];
    off += p->grad.numel();
  }
  for (nn::Param* p : params) ctx.grad_ready(p);
}

// ---- TPBlock ----

namespace {
std::unique_ptr<nn::Layer> tp_attention(const std::string& name, const model::GPTConfig& cfg,
                                        uint64_t seed, std::shared_ptr<comm::Communicator> tp,
                                        const TPOptions& opt) {
  const int64_t C = cfg.n_embd;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  auto qkv = std::make_unique<ColumnParallelLinear>(
      name + ".c_attn", C, 3 * C, tp,
      ParallelLinearOptions{.seed = seed, .groups = 3, .sequence_parallel = opt.sequence_parallel});
  auto proj = std::make_unique<RowParallelLinear>(
      name + ".c_proj", C, C, tp,
      ParallelLinearOptions{
          .init_std = proj_std, .seed = seed, .sequence_parallel = opt.sequence_parallel});
  return std::make_unique<nn::CausalSelfAttention>(std::move(qkv), std::move(proj),
                                                   cfg.n_head / tp->size());
}

std::unique_ptr<nn::Layer> tp_mlp(const std::string& name, const model::GPTConfig& cfg,
                                  uint64_t seed, std::shared_ptr<comm::Communicator> tp,
                                  const TPOptions& opt) {
  const int64_t C = cfg.n_embd, H = cfg.mlp_width();
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  auto fc = std::make_unique<ColumnParallelLinear>(
      name + ".c_fc", C, H, tp,
      ParallelLinearOptions{.seed = seed, .sequence_parallel = opt.sequence_parallel});
  auto proj = std::make_unique<RowParallelLinear>(
      name + ".c_proj", H, C, tp,
      ParallelLinearOptions{
          .init_std = proj_std, .seed = seed, .sequence_parallel = opt.sequence_parallel});
  return std::make_unique<model::MLPBlock>(std::move(fc), std::move(proj), cfg.gelu_exact);
}
}  // namespace

TPBlock::TPBlock(std::string name, const model::GPTConfig& cfg, uint64_t seed,
                 std::shared_ptr<comm::Communicator> tp, const TPOptions& opt)
    : model::Block(name, cfg.n_embd, tp_attention(name + ".attn", cfg, seed, tp, opt),
                   tp_mlp(name + ".mlp", cfg, seed, tp, opt)),
      tp_(std::move(tp)),
      sp_(opt.sequence_parallel) {}

Tensor TPBlock::backward(nn::Context& ctx, const Tensor& dy) {
  if (!sp_) return model::Block::backward(ctx, dy);
  Tensor dx;
  reduce_partial_grads(ctx, *tp_, {&ln_1.weight, &ln_1.bias, &ln_2.weight, &ln_2.bias},
                       [&] { dx = model::Block::backward(ctx, dy); });
  return dx;
}

// ---- builder ----

std::unique_ptr<model::GPT> build_gpt(const model::GPTConfig& cfg, uint64_t seed,
                                      std::shared_ptr<comm::Communicator> tp,
                                      const TPOptions& opt) {
  if (!tp || tp->size() == 1) return std::make_unique<model::GPT>(cfg, seed);
  validate_tp(cfg, tp->size(), opt, 0);
  return std::make_unique<model::GPT>(cfg, seed, gpt_layout(std::move(tp), opt));
}

// ---- checkpoints: full logical tensors <-> shards ----
// Both directions map through ShardSpec::for_each_run (nn/param.h), as checkpoint pieces do.

Tensor full_tensor(const nn::Param& p, const Tensor& local, comm::Communicator& tp) {
  if (local.shape() != p.local_shape())
    throw std::invalid_argument(p.name + ": local tensor " + shape_str(local.shape()) +
                                " is not laid out like the parameter " +
                                shape_str(p.local_shape()));
  if (!p.shard.is_split()) return local;
  if (p.shard.size != tp.size())
    throw std::invalid_argument(p.name + ": shard spec " + p.shard.str() +
                                " does not match a tp group of " + std::to_string(tp.size()));
  const int64_t n = local.numel();
  std::vector<float> all(static_cast<size_t>(n) * tp.size());
  tp.all_gather(std::span<const float>(local.data(), n), std::span<float>(all),
                {.algorithm = kTPAlgorithm});
  Tensor full = Tensor::empty(p.global_shape);
  for (int r = 0; r < tp.size(); ++r) {
    nn::ShardSpec s = p.shard;
    s.rank = r;
    const float* src = all.data() + static_cast<size_t>(r) * n;
    s.for_each_run(p.global_shape, 0, n, [&](int64_t l, int64_t g, int64_t k) {
      std::memcpy(full.data() + g, src + l, static_cast<size_t>(k) * sizeof(float));
    });
  }
  return full;
}

Tensor full_tensor(const nn::Param& p, comm::Communicator& tp) {
  return full_tensor(p, p.value, tp);
}

Tensor local_shard(const nn::Param& p, const Tensor& full) {
  if (full.shape() != p.global_shape)
    throw std::invalid_argument(p.name + ": tensor of shape " + shape_str(full.shape()) +
                                " where " + shape_str(p.global_shape) + " is expected");
  if (!p.shard.is_split()) return full.clone();
  Tensor local = p.shard.padded ? Tensor(p.shard.local_shape(p.global_shape))  // zero padding
                                : Tensor::empty(p.shard.local_shape(p.global_shape));
  p.shard.for_each_run(p.global_shape, 0, local.numel(), [&](int64_t l, int64_t g, int64_t k) {
    std::memcpy(local.data() + l, full.data() + g, static_cast<size_t>(k) * sizeof(float));
  });
  return local;
}

void load_full_tensor(nn::Param& p, const Tensor& full) {
  p.value.copy_from(local_shard(p, full));
}

// ---- clipping ----

double tp_grad_sq(const std::vector<nn::Param*>& params, comm::Communicator& tp) {
  double split = 0, replicated = 0;
  for (const nn::Param* p : params) {
    double s = 0;
    const float* g = p->grad.data();
    for (int64_t i = 0; i < p->grad.numel(); ++i) s += static_cast<double>(g[i]) * g[i];
    (p->shard.is_split() ? split : replicated) += s;
  }
  // Replicated gradients are equal on every tp rank: rank 0 contributes them.
  double total = split + (tp.rank() == 0 ? replicated : 0.0);
  std::vector<double> buf{total};
  if (tp.size() > 1) tp.all_reduce(std::span<double>(buf), {.algorithm = kTPAlgorithm});
  return buf[0];
}

}  // namespace meshtrain::parallel
