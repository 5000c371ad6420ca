#include "meshtrain/model/gpt.h"

#include "meshtrain/model/stage.h"

#include <cmath>
#include <stdexcept>

#include "meshtrain/kernels/elementwise.h"

namespace meshtrain::model {

// ---- MLPBlock ----

MLPBlock::MLPBlock(std::string name, int64_t C, int64_t H, bool exact_gelu, uint64_t seed, float proj_std)
    : c_fc(std::make_unique<nn::Linear>(name + ".c_fc", C, H,
                                        nn::LinearOptions{.seed = seed})),
      gelu(exact_gelu),
      c_proj(std::make_unique<nn::Linear>(name + ".c_proj", H, C,
                                          nn::LinearOptions{.init_std = proj_std, .seed = seed})) {}

MLPBlock::MLPBlock(std::unique_ptr<nn::Linear> fc, std::unique_ptr<nn::Linear> proj, bool exact_gelu)
    : c_fc(std::move(fc)), gelu(exact_gelu), c_proj(std::move(proj)) {}

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
  mlp = std::make_unique<MLPBlock>(name + ".mlp", cfg.n_embd, cfg.mlp_width(), cfg.gelu_exact, seed, proj_std);
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

// ---- GPT: one whole-model stage ----

GPT::GPT(const GPTConfig& cfg, uint64_t seed, std::shared_ptr<const GPTLayout> layout)
    : stage_(std::make_unique<GPTStage>(cfg, seed, StageSpec::whole(), layout ? std::move(layout) : plain_layout())) {}

GPT::~GPT() = default;

float GPT::forward(Context& ctx, const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  float loss = 0;
  stage_->forward(ctx, Tensor(), tokens, targets, B, T, &loss);
  return loss;
}

void GPT::backward(Context& ctx, float grad_scale) { stage_->backward(ctx, Tensor(), grad_scale); }

Tensor GPT::logits(Context& ctx, const int32_t* tokens, int64_t B, int64_t T) {
  return stage_->logits(ctx, tokens, B, T);
}

void GPT::collect_params(std::vector<Param*>& out) { stage_->collect_params(out); }

const GPTConfig& GPT::config() const { return stage_->config(); }

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

std::vector<std::pair<std::string, Shape>> gpt_param_shapes(const GPTConfig& cfg) {
  const int64_t C = cfg.n_embd, H = cfg.mlp_width();
  std::vector<std::pair<std::string, Shape>> out = {{"wte.weight", {cfg.vocab_size, C}},
                                                    {"wpe.weight", {cfg.block_size, C}}};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string b = "h." + std::to_string(i);
    for (auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
             {".ln_1.weight", {C}},          {".ln_1.bias", {C}},
             {".attn.c_attn.weight", {C, 3 * C}}, {".attn.c_attn.bias", {3 * C}},
             {".attn.c_proj.weight", {C, C}},     {".attn.c_proj.bias", {C}},
             {".ln_2.weight", {C}},          {".ln_2.bias", {C}},
             {".mlp.c_fc.weight", {C, H}},    {".mlp.c_fc.bias", {H}},
             {".mlp.c_proj.weight", {H, C}},  {".mlp.c_proj.bias", {C}}})
      out.emplace_back(b + name, shape);
  }
  out.emplace_back("ln_f.weight", Shape{C});
  out.emplace_back("ln_f.bias", Shape{C});
  return out;
}

}  // namespace meshtrain::model
