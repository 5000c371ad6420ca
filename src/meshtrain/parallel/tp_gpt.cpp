// TensorParallelGPT (tp_gpt.h): the single-rank GPT's forward and backward with the vocabulary-
// parallel embedding and head, the parallel blocks, and the region ops between them.
#include "meshtrain/parallel/tp_gpt.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>

#include "meshtrain/kernels/gemm.h"
#include "meshtrain/parallel/tp_regions.h"
#include "meshtrain/parallel/tp_vocab.h"

namespace meshtrain::parallel {

namespace {
std::vector<std::unique_ptr<model::Block>> tp_blocks(const model::GPTConfig& cfg, uint64_t seed,
                                                     const std::shared_ptr<comm::Communicator>& tp,
                                                     const TPOptions& opt) {
  std::vector<std::unique_ptr<model::Block>> h;
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    h.push_back(std::make_unique<TPBlock>("h." + std::to_string(i), cfg, seed, tp, opt));
  return h;
}
}  // namespace

TensorParallelGPT::TensorParallelGPT(const model::GPTConfig& cfg, uint64_t seed,
                                     std::shared_ptr<comm::Communicator> tp, const TPOptions& opt)
    : model::GPT(cfg, seed,
                 cfg.vocab_size % tp->size() ? nn::ShardSpec::split_padded(0, tp->rank(), tp->size())
                                             : nn::ShardSpec::split(0, tp->rank(), tp->size()),
                 tp_blocks(cfg, seed, tp, opt)),
      tp_(std::move(tp)),
      opt_(opt) {
  if (cfg.has_skip())
    throw std::invalid_argument("TensorParallelGPT has no skip connection; a model with skip_from/skip_to "
                                "trains through model::GPTStage with the tensor-parallel layout");
}

// ---- trunk: embedding, blocks, ln_f ----

Tensor TensorParallelGPT::trunk(nn::Context& ctx, const int32_t* tokens, int64_t B, int64_t T) {
  const auto& cfg = config();
  check_inputs(tokens, B, T);
  if (opt_.sequence_parallel && T % tp_->size() != 0)
    throw std::invalid_argument("--sequence-parallel: sequence length " + std::to_string(T) +
                                " does not divide over " + std::to_string(tp_->size()) +
                                " tensor-parallel ranks");
  Tensor x = vocab_parallel_embedding_forward(*tp_, tokens, wte.value.data(), wpe.value.data(), B,
                                              T, cfg.n_embd, cfg.vocab_size,
                                              opt_.sequence_parallel, ctx.threads);
  if (ctx.training) ctx.ints(this).assign(tokens, tokens + B * T);
  for (auto& block : h) {
    ctx.pre_forward(block.get());
    x = block->forward(ctx, x);  // (B, T, C), or (B, T/p, C) under SP
    ctx.post_forward(block.get());
  }
  return ln_f.forward(ctx, x);
}

// The head's input: (N, C) on every rank.
Tensor TensorParallelGPT::head_input(const Tensor& hN) {
  return opt_.sequence_parallel ? GatherFromSP::forward(*tp_, hN) : CopyToTP::forward(*tp_, hN);
}

// ---- forward ----

float TensorParallelGPT::forward(nn::Context& ctx, const int32_t* tokens, const int32_t* targets,
                                 int64_t B, int64_t T) {
  const auto& cfg = config();
  ctx.pre_forward(this);
  Tensor hN = trunk(ctx, tokens, B, T);  // (B, T, C), or (B, T/p, C) under SP
  Tensor hin = head_input(hN);          // (B, T, C)
  VocabParallelCE ce =
      vocab_parallel_ce_forward(*tp_, hin, wte.value.data(), targets, cfg.vocab_size, ctx.threads);
  if (ctx.training) {
    ctx.save(&head_, {hin, ce.logits, ce.lse});
    auto& t = ctx.ints(&head_);
    t.assign(targets, targets + B * T);
    t.push_back(static_cast<int32_t>(ce.valid));
  }
  ctx.post_forward(this);
  return ce.valid ? static_cast<float>(ce.loss_sum / static_cast<double>(ce.valid)) : 0.f;
}

// ---- backward: the mirror of forward ----

void TensorParallelGPT::backward(nn::Context& ctx, float grad_scale) {
  const auto& cfg = config();
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  ctx.pre_backward(this);
  auto& s = ctx.saved(&head_);
  Tensor hin = s[0];
  VocabParallelCE ce{s[1], s[2], 0.0, 0};
  std::vector<int32_t> targets = std::move(ctx.ints(&head_));
  const int64_t valid = targets.back();
  targets.pop_back();
  ctx.release(&head_);
  const int64_t B = hin.dim(0), T = hin.dim(1);

  const float dloss = valid ? grad_scale / static_cast<float>(valid) : 0.f;
  Tensor dpart = vocab_parallel_ce_backward(*tp_, ce, hin, wte.value.data(), wte.grad.data(),
                                            targets.data(), dloss, V, ctx.threads);  // (B, T, C)
  hin = Tensor();
  Tensor dhN = opt_.sequence_parallel ? GatherFromSP::backward(*tp_, dpart)
                                      : CopyToTP::backward(*tp_, std::move(dpart));

  Tensor dx;
  if (opt_.sequence_parallel)
    reduce_partial_grads(ctx, *tp_, {&ln_f.weight, &ln_f.bias},
                         [&] { dx = ln_f.backward(ctx, dhN); });
  else
    dx = ln_f.backward(ctx, dhN);
  for (auto it = h.rbegin(); it != h.rend(); ++it) {
    ctx.pre_backward(it->get());
    dx = (*it)->backward(ctx, dx);
    ctx.post_backward(it->get());
  }
  std::vector<int32_t> tokens = std::move(ctx.ints(this));
  ctx.release(this);
  vocab_parallel_embedding_backward(*tp_, dx, tokens.data(), wte.grad.data(), wpe.grad.data(), B,
                                    T, C, V, opt_.sequence_parallel, ctx.threads);
  ctx.grad_ready(&wpe);
  ctx.grad_ready(&wte);
  ctx.post_backward(this);
}

// ---- logits for sampling: local (N, V/p), gathered rank-major, then put in vocab order ----

Tensor TensorParallelGPT::logits(nn::Context& ctx, const int32_t* tokens, int64_t B, int64_t T) {
  const auto& cfg = config();
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, N = B * T;
  const int p = tp_->size();
  const int64_t Vl = vocab_shard(V, *tp_).size;  // rank r's columns: r Vl + [0, its valid)
  nn::Context eval(ctx.threads, /*training=*/false);
  Tensor hin = head_input(trunk(eval, tokens, B, T));  // (B, T, C)
  Tensor local = Tensor::empty({N, Vl});
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, N, Vl, C, 1.f, hin.data(), C,
                wte.value.data(), C, 0.f, local.data(), Vl, {ctx.threads});
  std::vector<float> all(static_cast<size_t>(N * Vl * p));
  tp_->all_gather(std::span<const float>(local.data(), N * Vl), std::span<float>(all),
                  {.algorithm = kTPAlgorithm});
  Tensor out = Tensor::empty({B, T, V});
  for (int r = 0; r < p; ++r) {
    const int64_t cols = std::clamp<int64_t>(V - r * Vl, 0, Vl);  // padding columns dropped
    for (int64_t i = 0; i < N && cols > 0; ++i)
      std::memcpy(out.data() + i * V + r * Vl, all.data() + (r * N + i) * Vl, cols * sizeof(float));
  }
  return out;
}

}  // namespace meshtrain::parallel
