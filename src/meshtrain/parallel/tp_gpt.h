// TensorParallelGPT: model::GPT whose blocks are TPBlocks (tensor_parallel.h), whose token table
// wte is split over the vocabulary (tp_vocab.h) and whose loss is the vocabulary-parallel
// cross-entropy fused with the tied projection. The interface is model::GPT's: forward returns
// the mean loss over the call's (B, T) (the same on every tp rank), backward accumulates
// gradients into the local shards and calls ctx.grad_ready(p) for each parameter once final,
// params() lists the local shards with their shard specs and global shapes.
//
// Data flow of one forward, p = tp ranks, N = B*T (SP: sequence parallelism):
//   embedding  (N, C) partial -> ReduceFromTP (SP: ReduceScatterToSP -> (N/p, C))
//   blocks     (N, C)         (SP: (N/p, C) shards; see tensor_parallel.h)
//   ln_f       -> CopyToTP    (SP: ln_f on the shard, GatherFromSP -> (N, C))
//   head       logits (N, V/p), vocabulary-parallel cross-entropy
// Build it with parallel::build_gpt.
#pragma once

#include <memory>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/parallel/tensor_parallel.h"

namespace meshtrain::parallel {

class TensorParallelGPT : public model::GPT {
 public:
  TensorParallelGPT(const model::GPTConfig& cfg, uint64_t seed,
                    std::shared_ptr<comm::Communicator> tp, const TPOptions& opt);

  float forward(nn::Context& ctx, const int32_t* tokens, const int32_t* targets, int64_t B,
                int64_t T) override;
  void backward(nn::Context& ctx, float grad_scale = 1.0f) override;
  // Full logits (B, T, V) on every rank (gathered: for sampling only).
  Tensor logits(nn::Context& ctx, const int32_t* tokens, int64_t B, int64_t T) override;

  comm::Communicator& tp() const { return *tp_; }
  const TPOptions& options() const { return opt_; }

 private:
  // (B, T, C) replicated, or (B, T/p, C) under SP, after ln_f; then the head's input (N, C).
  Tensor trunk(nn::Context& ctx, const int32_t* tokens, int64_t B, int64_t T);
  Tensor head_input(const Tensor& hN);

  std::shared_ptr<comm::Communicator> tp_;
  TPOptions opt_;
  struct Head {};  // key for the head's saved tensors
  Head head_;
};

}  // namespace meshtrain::parallel
