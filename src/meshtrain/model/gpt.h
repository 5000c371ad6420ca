// GPT: GPT-2's architecture with explicit backward. Pre-LN blocks (ln_1 -> attention ->
// residual, ln_2 -> MLP 4x tanh-GELU -> residual), learned positions, final layernorm, and the
// output projection tied to the token embedding. Parameter names and layouts are those of the
// GPT-2 checkpoints on the Hugging Face hub (`wte.weight` (V, C), `h.{i}.attn.c_attn.weight`
// (C, 3C) stored (in, out), ...), so a GPT-2 model.safetensors loads as is.
//
// Initialisation (GPT-2): weights N(0, 0.02), residual projections (attn.c_proj, mlp.c_proj)
// N(0, 0.02 / sqrt(2 n_layer)), biases 0, layernorm weights 1, all drawn layout-invariantly.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/model/config.h"
#include "meshtrain/nn/attention.h"
#include "meshtrain/nn/gelu.h"
#include "meshtrain/nn/layernorm.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain::model {

using nn::Context;
using nn::Param;

// ---- MLP half of a block: c_fc (C, H) -> GELU (tanh, or exact) -> c_proj (H, C); GPT-2: H = 4C ----
class MLPBlock : public nn::Layer {
 public:
  MLPBlock(std::string name, int64_t C, int64_t H, bool exact_gelu, uint64_t seed, float proj_std);
  MLPBlock(std::unique_ptr<nn::Linear> fc, std::unique_ptr<nn::Linear> proj, bool exact_gelu);
  Tensor forward(Context& ctx, const Tensor& x) override;   // (B, T, C) -> (B, T, C)
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>& out) override;

  std::unique_ptr<nn::Linear> c_fc;
  nn::Gelu gelu;
  std::unique_ptr<nn::Linear> c_proj;
};

// ---- transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)) ----
class Block : public nn::Layer {
 public:
  Block(std::string name, const GPTConfig& cfg, uint64_t seed);
  Block(std::string name, int64_t C, std::unique_ptr<nn::Layer> attn,
        std::unique_ptr<nn::Layer> mlp);
  Tensor forward(Context& ctx, const Tensor& x) override;   // (B, T, C) -> (B, T, C)
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>& out) override;

  nn::LayerNorm ln_1;
  std::unique_ptr<nn::Layer> attn;
  nn::LayerNorm ln_2;
  std::unique_ptr<nn::Layer> mlp;
};

// ---- the model: the whole GPT as one GPTStage (model/stage.h) ----
class GPTLayout;
class GPTStage;

class GPT : public nn::Module {
 public:
  // `layout` is the layer factory (model/stage.h): null gives the single-rank layers;
  // parallel::gpt_layout gives the tensor-parallel ones (parallel::build_gpt).
  GPT(const GPTConfig& cfg, uint64_t seed, std::shared_ptr<const GPTLayout> layout = nullptr);
  ~GPT() override;

  // Mean cross-entropy over the (B, T) targets; saves activations in ctx when training.
  float forward(Context& ctx, const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // Backward of `grad_scale * mean loss` (grad_scale = this micro-batch's share of the global
  // batch). Parameter gradients accumulate.
  void backward(Context& ctx, float grad_scale = 1.0f);
  // Logits (B, T, V) for sampling, the full vocabulary on every rank; saves nothing.
  Tensor logits(Context& ctx, const int32_t* tokens, int64_t B, int64_t T);

  void collect_params(std::vector<Param*>& out) override;
  const GPTConfig& config() const;
  GPTStage& stage() { return *stage_; }  // wte, wpe, h, ln_f

 private:
  std::unique_ptr<GPTStage> stage_;
};

// Checks T against the model's positions and every token id against its vocabulary; throws
// std::invalid_argument with a sentence (GPT and GPTStage call it before embedding).
void check_tokens(const GPTConfig& cfg, const int32_t* tokens, int64_t B, int64_t T);

// Names and full shapes of the parameters GPT(cfg) holds, in params() order, computed from the
// config alone (nothing is allocated): loaders compare a checkpoint with them before building
// a model.
std::vector<std::pair<std::string, Shape>> gpt_param_shapes(const GPTConfig& cfg);

}  // namespace meshtrain::model
