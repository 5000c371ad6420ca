#include "meshtrain/model/gpt.h"

#include "meshtrain/model/stage.h"

#include <cmath>
#include <stdexcept>

#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/kernels/embedding.h"
#include "meshtrain/kernels/gemm.h"

namespace meshtrain::model {

// ---- MLPBlock ----

MLPBlock::MLPBlock(std::string name, int64_t C, uint64_t seed, float proj_std)
    : c_fc(std::make_unique<nn::Linear>(name + ".c_fc", C, 4 * C,
                                        nn::LinearOptions{.seed = seed})),
      c_proj(std::make_unique<nn::Linear>(name + ".c_proj", 4 * C, C,
                                          nn::LinearOptions{.init_std = proj_std, .seed = seed})) {}

MLPBlock::MLPBlock(std::unique_ptr<nn::Linear> fc, std::unique_ptr<nn::Linear> proj)
    : c_fc(std::move(fc)), c_proj(std::move(proj)) {}

Tensor MLPBlock::forward(Context& ctx, const Tensor& x) {
  Tensor h = c_fc->forward(ctx, x);  // (B, T, 4C)
  Tensor g = gelu.forward(ctx, h);   // (B, T, 4C)
  return c_proj->forward(ctx, g);    // (B, T, C)
}

Tensor MLPBlock::backward(Context& ctx, const Tensor& dy) {
  Tensor dg = c_proj->backward(ctx, dy);
  Tensor dh = gelu.backward(ctx, dg);
  return c_fc->backward(ctx, dh);
}

void MLPBlock::collect_params(std::vector<Param*>& out) {
  c_fc->collect_params(out);
  c_proj->collect_params(out);
}

// ---- Block ----

Block::Block(std::string name, const GPTConfig& cfg, uint64_t seed)
    : ln_1(name + ".ln_1", cfg.n_embd), ln_2(name + ".ln_2", cfg.n_embd) {
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  attn = std::make_unique<nn::CausalSelfAttention>(
      name + ".attn", cfg.n_embd, cfg.n_head,
      nn::AttentionOptions{.seed = seed, .init_std = 0.02f, .proj_init_std = proj_std});
  mlp = std::make_unique<MLPBlock>(name + ".mlp", cfg.n_embd, seed, proj_std);
}

Block::Block(std::string name, int64_t C, std::unique_ptr<nn::Layer> a,
             std::unique_ptr<nn::Layer> m)
    : ln_1(name + ".ln_1", C), attn(std::move(a)), ln_2(name + ".ln_2", C), mlp(std::move(m)) {}

Tensor Block::forward(Context& ctx, const Tensor& x) {
  const int threads = ctx.threads;
  Tensor a = attn->forward(ctx, ln_1.forward(ctx, x));
  Tensor x1 = Tensor::empty(x.shape());
  kernels::add(x1.data(), x.data(), a.data(), x.numel(), threads);
  Tensor m = mlp->forward(ctx, ln_2.forward(ctx, x1));
  kernels::accumulate(m.data(), x1.data(), m.numel(), threads);  // x2 = x1 + mlp(...)
  return m;
}

Tensor Block::backward(Context& ctx, const Tensor& dy) {
  // dx1 = dy + ln_2'(mlp'(dy)); dx = dx1 + ln_1'(attn'(dx1)). The layernorm backward adds into
  // the residual gradient, so dy's buffer becomes dx1 and then dx without new allocations.
  Tensor dx = dy.clone();
  ln_2.backward_into(ctx, mlp->backward(ctx, dy), dx);
  Tensor da = attn->backward(ctx, dx);
  ln_1.backward_into(ctx, da, dx);
  return dx;
}

void Block::collect_params(std::vector<Param*>& out) {
  ln_1.collect_params(out);
  attn->collect_params(out);
  ln_2.collect_params(out);
  mlp->collect_params(out);
}

// ---- GPT ----

GPT::GPT(const GPTConfig& cfg, uint64_t seed)
    : wte("wte.weight", {cfg.vocab_size, cfg.n_embd}),
      wpe("wpe.weight", {cfg.block_size, cfg.n_embd}),
      ln_f("ln_f", cfg.n_embd),
      cfg_(cfg) {
  cfg_.validate();
  nn::init_normal(wte, seed, 0.02f);
  nn::init_normal(wpe, seed, 0.02f);
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    h.push_back(std::make_unique<Block>("h." + std::to_string(i), cfg, seed));
}

GPT::GPT(const GPTConfig& cfg, uint64_t seed, nn::ShardSpec wte_shard,
         std::vector<std::unique_ptr<Block>> blocks)
    : wte("wte.weight", {cfg.vocab_size, cfg.n_embd}, wte_shard),
      wpe("wpe.weight", {cfg.block_size, cfg.n_embd}),
      h(std::move(blocks)),
      ln_f("ln_f", cfg.n_embd),
      cfg_(cfg) {
  cfg_.validate();
  if (static_cast<int64_t>(h.size()) != cfg.n_layer)
    throw std::invalid_argument("GPT: " + std::to_string(h.size()) + " blocks given for " +
                                std::to_string(cfg.n_layer) + " layers");
  nn::init_normal(wte, seed, 0.02f);
  nn::init_normal(wpe, seed, 0.02f);
}

void check_tokens(const GPTConfig& cfg, const int32_t* tokens, int64_t B, int64_t T) {
  const int64_t V = cfg.vocab_size;
  if (T > cfg.block_size)
    throw std::invalid_argument("sequence length " + std::to_string(T) + " exceeds the model's " +
                                std::to_string(cfg.block_size) + " positions");
  for (int64_t i = 0; i < B * T; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      throw std::invalid_argument("token id " + std::to_string(tokens[i]) +
                                  " outside the vocabulary of " + std::to_string(V));
}

void GPT::check_inputs(const int32_t* tokens, int64_t B, int64_t T) const { check_tokens(cfg_, tokens, B, T); }

Tensor GPT::trunk_forward(Context& ctx, const int32_t* tokens, int64_t B, int64_t T) {
  check_inputs(tokens, B, T);
  Tensor x = plain_layout()->embed(ctx, wte, wpe, tokens, B, T, cfg_.vocab_size);
  if (ctx.training) ctx.ints(this).assign(tokens, tokens + B * T);
  Tensor skip;  // the long skip connection (config skip_from -> skip_to), if any
  for (size_t i = 0; i < h.size(); ++i) {
    if (static_cast<int64_t>(i) == cfg_.skip_to) {
      Tensor sum = Tensor::empty(x.shape());
      kernels::add(sum.data(), x.data(), skip.data(), x.numel(), ctx.threads);
      x = sum;
    }
    ctx.pre_forward(h[i].get());
    x = h[i]->forward(ctx, x);
    ctx.post_forward(h[i].get());
    if (static_cast<int64_t>(i) == cfg_.skip_from) skip = x;
  }
  return ln_f.forward(ctx, x);
}

float GPT::forward(Context& ctx, const int32_t* tokens, const int32_t* targets, int64_t B,
                   int64_t T) {
  ctx.pre_forward(this);
  Tensor hN = trunk_forward(ctx, tokens, B, T);  // (B, T, C)
  // The head is the plain layout's (model/stage.h): tied projection and cross-entropy.
  const GPTLayout::Loss l = plain_layout()->head(ctx, &head_, hN, wte, targets, B, T, cfg_.vocab_size);
  ctx.post_forward(this);
  return l.valid ? static_cast<float>(l.sum / static_cast<double>(l.valid)) : 0.f;
}

void GPT::backward(Context& ctx, float grad_scale) {
  const int64_t V = cfg_.vocab_size;
  ctx.pre_backward(this);
  Tensor dh = plain_layout()->head_backward(ctx, &head_, wte, grad_scale, V);  // (B, T, C)
  const int64_t B = dh.dim(0), T = dh.dim(1);
  Tensor dx = ln_f.backward(ctx, dh);
  Tensor dskip;
  for (size_t i = h.size(); i-- > 0;) {
    if (static_cast<int64_t>(i) == cfg_.skip_from) {
      Tensor sum = Tensor::empty(dx.shape());
      kernels::add(sum.data(), dx.data(), dskip.data(), dx.numel(), ctx.threads);
      dx = sum;
    }
    ctx.pre_backward(h[i].get());
    dx = h[i]->backward(ctx, dx);
    ctx.post_backward(h[i].get());
    if (static_cast<int64_t>(i) == cfg_.skip_to) dskip = dx.clone();
  }
  std::vector<int32_t> tokens = std::move(ctx.ints(this));
  ctx.release(this);
  plain_layout()->embed_backward(ctx, wte, wpe, dx, tokens.data(), B, T, V);
  ctx.grad_ready(&wpe);
  ctx.grad_ready(&wte);
  ctx.post_backward(this);
}

Tensor GPT::logits(Context& ctx, const int32_t* tokens, int64_t B, int64_t T) {
  const int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
  Context eval(ctx.threads, /*training=*/false);
  Tensor hN = trunk_forward(eval, tokens, B, T);
  Tensor out = Tensor::empty({B, T, V});
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, B * T, V, C, 1.f, hN.data(), C,
                wte.value.data(), C, 0.f, out.data(), V, {ctx.threads});
  return out;
}

void GPT::collect_params(std::vector<Param*>& out) {
  out.push_back(&wte);
  out.push_back(&wpe);
  for (auto& b : h) b->collect_params(out);
  ln_f.collect_params(out);
}

std::vector<std::pair<std::string, Shape>> gpt_param_shapes(const GPTConfig& cfg) {
  const int64_t C = cfg.n_embd;
  std::vector<std::pair<std::string, Shape>> out = {{"wte.weight", {cfg.vocab_size, C}},
                                                    {"wpe.weight", {cfg.block_size, C}}};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string b = "h." + std::to_string(i);
    for (auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
             {".ln_1.weight", {C}},          {".ln_1.bias", {C}},
             {".attn.c_attn.weight", {C, 3 * C}}, {".attn.c_attn.bias", {3 * C}},
             {".attn.c_proj.weight", {C, C}},     {".attn.c_proj.bias", {C}},
             {".ln_2.weight", {C}},          {".ln_2.bias", {C}},
             {".mlp.c_fc.weight", {C, 4 * C}},    {".mlp.c_fc.bias", {4 * C}},
             {".mlp.c_proj.weight", {4 * C, C}},  {".mlp.c_proj.bias", {C}}})
      out.emplace_back(b + name, shape);
  }
  out.emplace_back("ln_f.weight", Shape{C});
  out.emplace_back("ln_f.bias", Shape{C});
  return out;
}

}  // namespace meshtrain::model
