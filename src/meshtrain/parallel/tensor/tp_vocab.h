// Vocabulary parallelism: the token embedding and the cross-entropy of the tied output
// projection, with the table wte (V, C) split by rows over the tp ranks (rank r owns tokens
// [r V/p, (r+1) V/p)). The full (N, V) logits never exist on one rank.
//
// Embedding: each rank looks up the tokens it owns (others give zero rows, and rank 0 alone
// adds the positions), then the partial sums are reduced: all-reduce (ReduceFromTP), or
// reduce-scatter to the sequence shard under sequence parallelism (ReduceScatterToSP). The
// backward runs the mirror region and scatters into the own rows of dwte; dwpe is computed on
// every rank from the same full gradient (wpe is replicated).
//
// Cross-entropy (Megatron's vocab_parallel_cross_entropy, fused with the projection):
//   logits (N, V/p) = h (N, C) @ wte_local^T
//   M_i   = max over ranks of the local row max               all-reduce(max) of N floats
//   S_i   = sum over ranks of sum_j exp(logit_ij - M_i)       } one all-reduce(sum) of
//   z_i   = the target's logit, from the rank that owns it    } 2N doubles
//   loss_i = M_i + log S_i - z_i  (the same on every rank)
// Backward (no communication here): dlogits = (softmax - onehot) * dloss, local columns only;
// dwte_local += dlogits^T h; dh (N, C) = dlogits @ wte_local is a partial sum over ranks, which
// the caller's region (CopyToTP / GatherFromSP backward) reduces.
//
// Limits: float32; rows with a negative target count no loss and no gradient.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/gemm.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel {

struct VocabShard {
  int64_t start = 0;  // first token this rank owns
  int64_t size = 0;   // rows of its table slice: ceil(V / p) (V / p when p divides V)
  int64_t valid = 0;  // of those, real tokens (< V); the rest is padding, never a target
};
// Rank r owns tokens [r ceil(V/p), ...); with V % p != 0 the last slices end in padding rows
// (the table is split with ShardSpec::split_padded), which the cross-entropy leaves out of the
// softmax, so the loss and every real gradient equal the unpadded model's.
VocabShard vocab_shard(int64_t V, const comm::Communicator& tp);

// ---- embedding ----
// Returns (B, T, C), or this rank's sequence shard (B, T/p, C) when `sequence_parallel`.
// wte_local (V/p, C); wpe (>= T, C), replicated.
Tensor vocab_parallel_embedding_forward(comm::Communicator& tp, const int32_t* tokens,
                                        const float* wte_local, const float* wpe, int64_t B,
                                        int64_t T, int64_t C, int64_t V, bool sequence_parallel,
                                        int threads);
// dx: (B, T, C), or the sequence shard (B, T/p, C). dwte_local (V/p, C) +=, dwpe (T, C) +=.
void vocab_parallel_embedding_backward(comm::Communicator& tp, const Tensor& dx,
                                       const int32_t* tokens, float* dwte_local, float* dwpe,
                                       int64_t B, int64_t T, int64_t C, int64_t V,
                                       bool sequence_parallel, int threads);

// ---- cross-entropy fused with the tied projection ----
struct VocabParallelCE {
  Tensor logits;    // (N, V/p): local logits, turned into dlogits by backward
  Tensor lse;       // (N): global log-sum-exp per row
  double loss_sum = 0;  // sum of the counted rows' losses (identical on every tp rank)
  int64_t valid = 0;    // rows with a target >= 0
};
// h (N, C) replicated over tp; wte_local (V/p, C); targets (N).
VocabParallelCE vocab_parallel_ce_forward(comm::Communicator& tp, const Tensor& h,
                                          const float* wte_local, const int32_t* targets,
                                          int64_t V, const kernels::GemmOptions& opt);
// Consumes ce.logits. dloss: the gradient of every counted row's loss (grad_scale / valid in a
// mean). dwte_local (V/p, C) +=. Returns this rank's partial dh (N, C).
Tensor vocab_parallel_ce_backward(comm::Communicator& tp, VocabParallelCE& ce, const Tensor& h,
                                  const float* wte_local, float* dwte_local,
                                  const int32_t* targets, float dloss, int64_t V,
                                  const kernels::GemmOptions& opt);

}  // namespace meshtrain::parallel
