// GPTStage: a contiguous piece of the GPT built by composition (DESIGN decision 8) — the
// embedding (optional), a range of blocks, and the head (optional: final layernorm, the output
// projection tied to the token table, the cross-entropy). The whole model is one stage; a
// pipeline cuts it into several, and the executor (pipeline/executor.h) runs them.
//
// How each piece is split over a layout is the job of a GPTLayout, the layer factory: the
// plain one here builds single-rank layers; parallel/tensor/tp_layout.h builds column/row-parallel
// blocks, the vocabulary-parallel embedding and head, and sequence parallelism. The stage never
// branches on the layout.
//
// Tied embedding across stages: when the first and last stage are different ranks, both hold a
// `wte.weight` (same name, same layout-invariant initialisation); the first uses it to embed,
// the last as the output projection. Their gradients are summed over the embedding group (the
// two ranks) before the optimizer step, so both copies stay equal (as Megatron does).
//
// Data flow of one micro-batch (B rows of T tokens, C = n_embd):
//   first stage  tokens (B, T) -> embedding -> x (B, T, C)
//   blocks       x (B, T, C) -> (B, T, C)      (under sequence parallelism: (B, T/tp, C))
//   last stage   x -> ln_f -> head -> mean loss over the valid targets
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/model/config.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/model/model.h"
#include "meshtrain/nn/layernorm.h"

namespace meshtrain::model {

// ---- the layer factory ----
class GPTLayout {
 public:
  virtual ~GPTLayout() = default;
  // Layout of the token table wte (V, C).
  virtual nn::ShardSpec wte_shard(const GPTConfig& cfg) const;
  // Block i, named "h.<i>".
  virtual std::unique_ptr<Block> block(int64_t i, const GPTConfig& cfg, uint64_t seed) const;
  // Checks a micro-batch's T against the layout (sequence parallelism needs T % tp == 0).
  virtual void check_seq(int64_t T) const {}
  // Ranks the sequence of an activation between blocks is split over (sequence parallelism: tp).
  virtual int64_t seq_shards() const { return 1; }

  // Embedding: tokens (B, T) -> x (B, T, C); backward accumulates into wte.grad and wpe.grad.
  virtual Tensor embed(nn::Context& ctx, const nn::Param& wte, const nn::Param& wpe,
                       const int32_t* tokens, int64_t B, int64_t T, int64_t V) const;
  virtual void embed_backward(nn::Context& ctx, nn::Param& wte, nn::Param& wpe, const Tensor& dx,
                              const int32_t* tokens, int64_t B, int64_t T, int64_t V) const;

  // Head: hN (ln_f's output) and the targets (B * T; -1 = not counted) -> the sum of the losses
  // over the valid targets and their count; saves what backward needs under `key`.
  struct Loss {
    double sum = 0;
    int64_t valid = 0;
  };
  virtual Loss head(nn::Context& ctx, const void* key, const Tensor& hN, const nn::Param& wte,
                    const int32_t* targets, int64_t B, int64_t T, int64_t V) const;
  // Backward of grad_scale * mean loss: accumulates into wte.grad, returns dhN (hN's shape).
  virtual Tensor head_backward(nn::Context& ctx, const void* key, nn::Param& wte, float grad_scale,
                               int64_t V) const;
  // Logits (B, T, V) of hN for sampling, the full vocabulary on every rank (tensor parallelism
  // gathers the vocabulary shards); saves nothing.
  virtual Tensor logits(nn::Context& ctx, const Tensor& hN, const nn::Param& wte, int64_t B, int64_t T,
                        int64_t V) const;
  // ln_f's backward (sequence parallelism reduces its partial gradients over tp).
  virtual Tensor final_norm_backward(nn::Context& ctx, nn::LayerNorm& ln_f, const Tensor& dy) const;
};

// The single-rank layout.
std::shared_ptr<const GPTLayout> plain_layout();

// ---- which piece a stage builds ----
struct StageSpec {
  int64_t first_layer = 0;  // blocks [first_layer, end_layer)
  int64_t end_layer = -1;   // -1: n_layer
  bool embedding = true;    // takes tokens: holds wte, wpe
  bool head = true;         // gives the loss: holds ln_f and (tied) wte
  static StageSpec whole() { return {}; }
};

// ---- the skip connection across stages ----
// When cfg.skip_from and cfg.skip_to sit on different stages, the skip tensor travels straight
// from the one to the other (a portal, as torchgpipe calls it), not through the stages between;
// its gradient travels back the same way. The executor carries them.
// nn::Portal: forward `in` is the skip tensor a later stage adds, `out` the one made here;
// backward `in` is its gradient coming back, `out` the gradient of the one added here.
using nn::Portal;

// ---- the stage ----
class GPTStage : public Stage {
 public:
  GPTStage(const GPTConfig& cfg, uint64_t seed, StageSpec spec,
           std::shared_ptr<const GPTLayout> layout = plain_layout());

  // One micro-batch. The first stage reads `tokens` (B * T ids) and ignores x; the others take
  // x, the previous stage's output. The last stage reads `targets`, writes the mean loss over
  // the valid targets to *loss and returns an empty tensor; the others return their output.
  // With a skip connection across stages: a stage that makes the skip tensor (sends_portal)
  // writes it to portal->out; one that adds it (takes_portal) reads portal->in.
  Tensor forward(nn::Context& ctx, const Tensor& x, const int32_t* tokens, const int32_t* targets,
                 int64_t B, int64_t T, float* loss, Portal* portal = nullptr);
  // Backward of the micro-batch ctx holds. The last stage starts from grad_scale * its mean
  // loss (dy ignored); the others from dy, the gradient of their output. Returns the gradient
  // of the input x (empty for the first stage). Parameter gradients accumulate.
  // Across stages: takes_portal writes the skip tensor's gradient to portal->out; sends_portal
  // reads it from portal->in.
  Tensor backward(nn::Context& ctx, const Tensor& dy, float grad_scale, Portal* portal = nullptr) override;
  // The model::Stage form of forward: tokens and targets from `mb`, the mean loss in result.
  Tensor forward(nn::Context& ctx, const Tensor& x, const MicroBatch& mb, StageResult* result,
                 Portal* portal) override;
  // Activations between stages: (rows, T, C), (rows, T / tp, C) under sequence parallelism.
  Shape input_shape(int64_t rows, int64_t T) const override;
  Shape output_shape(int64_t rows, int64_t T) const override { return input_shape(rows, T); }
  // Units: the stage's ends (embedding, ln_f: its parameters outside the blocks), then each block.
  std::vector<StageUnit> units() override;
  // The tied token table when the first and the last stage differ; the last stage's is the copy.
  nn::Param* tied_param() override { return spec_.head != spec_.embedding ? &wte : nullptr; }
  bool tied_copy() const override { return spec_.head && !spec_.embedding; }
  // Logits (B, T, V) for sampling, on a stage that holds the whole model; saves nothing.
  Tensor logits(nn::Context& ctx, const int32_t* tokens, int64_t B, int64_t T);
  bool sends_portal() const override { return holds(cfg_.skip_from) && !holds(cfg_.skip_to); }
  bool takes_portal() const override { return holds(cfg_.skip_to) && !holds(cfg_.skip_from); }

  void collect_params(std::vector<nn::Param*>& out) override;  // wte, wpe, blocks, ln_f (held ones)

  const GPTConfig& config() const { return cfg_; }
  const StageSpec& spec() const { return spec_; }
  bool first() const override { return spec_.embedding; }
  bool last() const override { return spec_.head; }

  nn::Param wte;  // (V, C): held by the first and the last stage (tied)
  nn::Param wpe;  // (block_size, C): first stage only
  std::vector<std::unique_ptr<Block>> h;  // blocks first_layer .. end_layer-1
  std::unique_ptr<nn::LayerNorm> ln_f;    // last stage only

 private:
  // The embedding (first stage) and the blocks: the input of ln_f (last stage) or the output.
  Tensor trunk(nn::Context& ctx, const Tensor& x_in, const int32_t* tokens, int64_t B, int64_t T, Portal* portal);
  bool holds(int64_t block) const { return block >= spec_.first_layer && block < spec_.end_layer; }
  GPTConfig cfg_;
  StageSpec spec_;
  std::shared_ptr<const GPTLayout> layout_;
  struct Head {};  // key for the head's saved tensors
  Head head_;
};

}  // namespace meshtrain::model
