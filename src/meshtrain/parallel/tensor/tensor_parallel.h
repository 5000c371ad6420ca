// Tensor (intra-layer) parallelism as Megatron-LM does it, over an explicit tp communicator.
//
//   ColumnParallelLinear  weight (in, out) split along out: no communication in forward; its
//                         input passes CopyToTP (all-reduce in backward), or GatherFromSP under
//                         sequence parallelism.
//   RowParallelLinear     weight split along in: the partial outputs pass ReduceFromTP
//                         (all-reduce in forward), or ReduceScatterToSP; the bias (replicated)
//                         is added once, after the reduction.
// A GPT block half is column then row: MLP c_fc / c_proj; attention's fused c_attn split by
// heads (groups = 3: each rank holds its heads' columns of q, k and v) / c_proj. So each block
// half costs one all-reduce in forward and one in backward (without SP), or an all-gather and
// a reduce-scatter each way (with SP). The embedding and the tied output projection are
// vocabulary-parallel (tp_vocab.h); the layer factory that builds the model is tp_layout.h.
//
// Both layers ARE nn::Linear (same names, same (in, out) storage, a shard spec on weight and
// bias), so CausalSelfAttention and MLPBlock use them unchanged and checkpoints see GPT-2's
// names. Every parameter's shard spec is set at construction and initialisation is
// layout-invariant (DESIGN decisions 1 and 6).
//
// Sequence parallelism: layernorms and residual adds act on the rank's sequence shard
// (tp_regions.h); their parameters' gradients are then partial sums over the tp ranks, so
// reduce_partial_grads all-reduces them (once per block, packed) before reporting them ready.
// A column-parallel layer under SP saves only its input's sequence shard and all-gathers it
// again in backward (one more all-gather per block half), so no full-sequence (B, T, C)
// activation of the layernorm/residual regions is held from forward to backward. Its backward
// overlaps that gather with the input-gradient product, and the reduction of the input
// gradient with the weight-gradient product (async Work, split start / finish).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain::parallel {

struct TPOptions {
  bool sequence_parallel = false;  // --sequence-parallel
  bool pad_vocab = false;          // --pad-vocab: a vocabulary that tp does not divide is split
                                   // ceil(V/tp) rows per rank, the padding masked out of the loss
};

// Throws std::invalid_argument with a sentence saying what to change when cfg cannot be split
// over `tp` ranks: tp < 1, tp > heads, heads % tp, n_embd % tp, vocab % tp (unless pad_vocab),
// and under sequence parallelism seq % tp (seq <= 0 skips that check).
void validate_tp(const model::GPTConfig& cfg, int tp, const TPOptions& opt, int64_t seq);

// ---- layers ----

struct ParallelLinearOptions {
  bool bias = true;
  float init_std = 0.02f;
  uint64_t seed = 0;
  int groups = 1;                  // column-parallel: output features as `groups` equal parts
  bool sequence_parallel = false;  // input (column) / output (row) is a sequence shard
};

class ColumnParallelLinear : public nn::Linear {
 public:
  // Global weight (in, out), bias (out); this rank holds out / p columns (of each group).
  ColumnParallelLinear(std::string name, int64_t in, int64_t out,
                       std::shared_ptr<comm::Communicator> tp, const ParallelLinearOptions& opt);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;   // (B, T, in) -> (B, T, out/p)
  Tensor backward(nn::Context& ctx, const Tensor& dy) override; // (B, T, out/p) -> (B, T, in)
  // Under SP, x and the returned dx are sequence shards (B, T/p, in).

 private:
  std::shared_ptr<comm::Communicator> tp_;
  bool sp_;
};

class RowParallelLinear : public nn::Linear {
 public:
  // Global weight (in, out) of which this rank holds in / p rows; bias (out) replicated.
  RowParallelLinear(std::string name, int64_t in, int64_t out,
                    std::shared_ptr<comm::Communicator> tp, const ParallelLinearOptions& opt);
  Tensor forward(nn::Context& ctx, const Tensor& x) override;   // (B, T, in/p) -> (B, T, out)
  Tensor backward(nn::Context& ctx, const Tensor& dy) override; // (B, T, out) -> (B, T, in/p)
  // Under SP, y and dy are sequence shards (B, T/p, out).

 private:
  std::shared_ptr<comm::Communicator> tp_;
  bool sp_;
};

// Runs `body` (a backward that accumulates partial sums of `params`' gradients) with those
// gradients redirected to zeroed buffers and their grad_ready calls held back; then sums the
// buffers over tp in one all-reduce, adds them into the gradients (which keep accumulating
// across micro-batches) and reports the parameters ready.
void reduce_partial_grads(nn::Context& ctx, comm::Communicator& tp,
                          const std::vector<nn::Param*>& params,
                          const std::function<void()>& body);

// A transformer block of parallel layers. Without SP it is model::Block; with SP its input and
// output are sequence shards and backward reduces the layernorms' partial gradients.
class TPBlock : public model::Block {
 public:
  TPBlock(std::string name, const model::GPTConfig& cfg, uint64_t seed,
          std::shared_ptr<comm::Communicator> tp, const TPOptions& opt);
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;

 private:
  std::shared_ptr<comm::Communicator> tp_;
  bool sp_;
};

// ---- the model, checkpoints and clipping ----

// tp == nullptr or of size 1: the plain single-rank GPT. Otherwise the same model::GPT built
// by the tensor-parallel layout (tp_layout.h) on this rank's shards; validate_tp runs first
// (without the seq check).
std::unique_ptr<model::GPT> build_gpt(const model::GPTConfig& cfg, uint64_t seed,
                                      std::shared_ptr<comm::Communicator> tp,
                                      const TPOptions& opt);

// Collective over tp: the full logical tensor of p (global_shape). Replicated: p.value as is.
Tensor full_tensor(const nn::Param& p, comm::Communicator& tp);
// This rank's shard of `full` (shape p.global_shape) into p.value.
void load_full_tensor(nn::Param& p, const Tensor& full);
// The same for any tensor laid out like p (its gradient, its AdamW moments): gather `local`
// into the full tensor (collective over tp), or cut this rank's shard out of `full`.
Tensor full_tensor(const nn::Param& p, const Tensor& local, comm::Communicator& tp);
Tensor local_shard(const nn::Param& p, const Tensor& full);

// Collective over tp: the global sum of squares of the gradients, split parameters summed over
// the ranks and replicated ones counted once. Use as AdamW's norm_reduce.
double tp_grad_sq(const std::vector<nn::Param*>& params, comm::Communicator& tp);

}  // namespace meshtrain::parallel
