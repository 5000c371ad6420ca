// TensorParallelLayout: the layer factory (model/stage.h) for tensor parallelism. It fills a
// GPTStage with TPBlocks (column-parallel qkv and c_fc, row-parallel projections), the token
// table split over the vocabulary, the vocabulary-parallel embedding and the cross-entropy fused
// with the tied projection (tp_vocab.h), and — with sequence parallelism — the region ops that
// keep layernorms and residuals on sequence shards. The stage code is the single-rank one; only
// this factory knows about tp.
//
// Data flow, p = tp ranks, N = B*T (SP: sequence parallelism):
//   embedding  (N, C) partial -> ReduceFromTP (SP: ReduceScatterToSP -> (N/p, C))
//   blocks     (N, C)         (SP: (N/p, C) shards)
//   ln_f       -> CopyToTP    (SP: ln_f on the shard, GatherFromSP -> (N, C))
//   head       logits (N, V/p), vocabulary-parallel cross-entropy
#pragma once

#include <memory>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"

namespace meshtrain::parallel {

class TensorParallelLayout : public model::GPTLayout {
 public:
  TensorParallelLayout(std::shared_ptr<comm::Communicator> tp, TPOptions opt);

  nn::ShardSpec wte_shard(const model::GPTConfig& cfg) const override;
  std::unique_ptr<model::Block> block(int64_t i, const model::GPTConfig& cfg, uint64_t seed) const override;
  void check_seq(int64_t T) const override;
  int64_t seq_shards() const override;
  Tensor embed(nn::Context& ctx, const nn::Param& wte, const nn::Param& wpe, const int32_t* tokens,
               int64_t B, int64_t T, int64_t V) const override;
  void embed_backward(nn::Context& ctx, nn::Param& wte, nn::Param& wpe, const Tensor& dx,
                      const int32_t* tokens, int64_t B, int64_t T, int64_t V) const override;
  Loss head(nn::Context& ctx, const void* key, const Tensor& hN, const nn::Param& wte,
            const int32_t* targets, int64_t B, int64_t T, int64_t V) const override;
  Tensor head_backward(nn::Context& ctx, const void* key, nn::Param& wte, float grad_scale,
                       int64_t V) const override;
  Tensor logits(nn::Context& ctx, const Tensor& hN, const nn::Param& wte, int64_t B, int64_t T,
                int64_t V) const override;
  Tensor final_norm_backward(nn::Context& ctx, nn::LayerNorm& ln_f, const Tensor& dy) const override;

 private:
  std::shared_ptr<comm::Communicator> tp_;
  TPOptions opt_;
};

// The layout for a tp group: plain when tp is null or of size 1.
std::shared_ptr<const model::GPTLayout> gpt_layout(std::shared_ptr<comm::Communicator> tp,
                                                   const TPOptions& opt);

}  // namespace meshtrain::parallel
