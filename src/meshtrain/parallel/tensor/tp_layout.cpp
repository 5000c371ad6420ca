#include "meshtrain/parallel/tensor/tp_layout.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "meshtrain/kernels/gemm.h"
#include "meshtrain/parallel/tensor/tp_regions.h"
#include "meshtrain/parallel/tensor/tp_vocab.h"

namespace meshtrain::parallel {

TensorParallelLayout::TensorParallelLayout(std::shared_ptr<comm::Communicator> tp, TPOptions opt)
    : tp_(std::move(tp)), opt_(opt) {}

nn::ShardSpec TensorParallelLayout::wte_shard(const model::GPTConfig& cfg) const {
  return cfg.vocab_size % tp_->size() ? nn::ShardSpec::split_padded(0, tp_->rank(), tp_->size())
                                      : nn::ShardSpec::split(0, tp_->rank(), tp_->size());
}

std::unique_ptr<model::Block> TensorParallelLayout::block(int64_t i, const model::GPTConfig& cfg,
                                                          uint64_t seed) const {
  return std::make_unique<TPBlock>("h." + std::to_string(i), cfg, seed, tp_, opt_);
}

int64_t TensorParallelLayout::seq_shards() const { return opt_.sequence_parallel ? tp_->size() : 1; }

void TensorParallelLayout::check_seq(int64_t T) const {
  if (opt_.sequence_parallel && T % tp_->size() != 0)
    throw std::invalid_argument("--sequence-parallel: sequence length " + std::to_string(T) +
                                " does not divide over " + std::to_string(tp_->size()) +
                                " tensor-parallel ranks");
}

// ---- embedding ----

Tensor TensorParallelLayout::embed(nn::Context& ctx, const nn::Param& wte, const nn::Param& wpe,
                                   const int32_t* tokens, int64_t B, int64_t T, int64_t V) const {
  return vocab_parallel_embedding_forward(*tp_, tokens, wte.value.data(), wpe.value.data(), B, T,
                                          wte.value.dim(1), V, opt_.sequence_parallel, ctx.threads);
}

void TensorParallelLayout::embed_backward(nn::Context& ctx, nn::Param& wte, nn::Param& wpe,
                                          const Tensor& dx, const int32_t* tokens, int64_t B,
                                          int64_t T, int64_t V) const {
  vocab_parallel_embedding_backward(*tp_, dx, tokens, wte.grad.data(), wpe.grad.data(), B, T,
                                    wte.value.dim(1), V, opt_.sequence_parallel, ctx.threads);
}

// ---- head: the input gathered (SP) or copied into the tp region, then the fused CE ----

model::GPTLayout::Loss TensorParallelLayout::head(nn::Context& ctx, const void* key, const Tensor& hN,
                                                  const nn::Param& wte, const int32_t* targets,
                                                  int64_t B, int64_t T, int64_t V) const {
  Tensor hin = opt_.sequence_parallel ? GatherFromSP::forward(*tp_, hN) : CopyToTP::forward(*tp_, hN);
  VocabParallelCE ce = vocab_parallel_ce_forward(*tp_, hin, wte.value.data(), targets, V, ctx.gemm_with(wte));
  if (ctx.training) {
    ctx.save(key, {hin, ce.logits, ce.lse});
    auto& t = ctx.ints(key);
    t.assign(targets, targets + B * T);
    t.push_back(static_cast<int32_t>(ce.valid));
  }
  return {ce.loss_sum, ce.valid};
}

Tensor TensorParallelLayout::head_backward(nn::Context& ctx, const void* key, nn::Param& wte,
                                           float grad_scale, int64_t V) const {
  auto& s = ctx.saved(key);
  Tensor hin = s[0];
  VocabParallelCE ce{s[1], s[2], 0.0, 0};
  std::vector<int32_t> targets = std::move(ctx.ints(key));
  const int64_t valid = targets.back();
  targets.pop_back();
  ctx.release(key);
  const float dloss = valid ? grad_scale / static_cast<float>(valid) : 0.f;
  Tensor dpart = vocab_parallel_ce_backward(*tp_, ce, hin, wte.value.data(), wte.grad.data(),
                                            targets.data(), dloss, V, ctx.gemm_with(wte));  // (B, T, C)
  hin = Tensor();
  return opt_.sequence_parallel ? GatherFromSP::backward(*tp_, dpart)
                                : CopyToTP::backward(*tp_, std::move(dpart));
}

// ---- logits for sampling: local (N, V/p), gathered rank-major, then put in vocabulary order ----

Tensor TensorParallelLayout::logits(nn::Context& ctx, const Tensor& hN, const nn::Param& wte, int64_t B,
                                    int64_t T, int64_t V) const {
  const int64_t C = wte.value.dim(1), N = B * T;
  const int p = tp_->size();
  const int64_t Vl = vocab_shard(V, *tp_).size;  // rank r's columns: r Vl + [0, its valid)
  Tensor hin = opt_.sequence_parallel ? GatherFromSP::forward(*tp_, hN) : CopyToTP::forward(*tp_, hN);  // (B, T, C)
  Tensor local = Tensor::empty({N, Vl});
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, N, Vl, C, 1.f, hin.data(), C, wte.value.data(), C, 0.f,
                local.data(), Vl, ctx.gemm());
  std::vector<float> all(static_cast<size_t>(N * Vl * p));
  tp_->all_gather(std::span<const float>(local.data(), N * Vl), std::span<float>(all), {.algorithm = kTPAlgorithm});
  Tensor out = Tensor::empty({B, T, V});
  for (int r = 0; r < p; ++r) {
    const int64_t cols = std::clamp<int64_t>(V - r * Vl, 0, Vl);  // padding columns dropped
    for (int64_t i = 0; i < N && cols > 0; ++i)
      std::memcpy(out.data() + i * V + r * Vl, all.data() + (r * N + i) * Vl, cols * sizeof(float));
  }
  return out;
}

Tensor TensorParallelLayout::final_norm_backward(nn::Context& ctx, nn::LayerNorm& ln_f,
                                                 const Tensor& dy) const {
  if (!opt_.sequence_parallel) return ln_f.backward(ctx, dy);
  Tensor dx;
  reduce_partial_grads(ctx, *tp_, {&ln_f.weight, &ln_f.bias}, [&] { dx = ln_f.backward(ctx, dy); });
  return dx;
}

std::shared_ptr<const model::GPTLayout> gpt_layout(std::shared_ptr<comm::Communicator> tp,
                                                   const TPOptions& opt) {
  if (!tp || tp->size() == 1) return model::plain_layout();
  return std::make_shared<const TensorParallelLayout>(std::move(tp), opt);
}

}  // namespace meshtrain::parallel
