// Vocabulary-parallel embedding and cross-entropy (tp_vocab.h). Rows are independent, so the
// cross-entropy loops split rows over the rank's thread budget.
#include "meshtrain/parallel/tensor/tp_vocab.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "meshtrain/kernels/embedding.h"
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/parallel/tensor/tp_regions.h"

namespace meshtrain::parallel {

VocabShard vocab_shard(int64_t V, const comm::Communicator& tp) {
  const int64_t Vl = (V + tp.size() - 1) / tp.size(), start = tp.rank() * Vl;
  return {start, Vl, std::clamp<int64_t>(V - start, 0, Vl)};
}

// ---- embedding: partial lookup, then ReduceFromTP (or ReduceScatterToSP) ----

Tensor vocab_parallel_embedding_forward(comm::Communicator& tp, const int32_t* tokens,
                                        const float* wte_local, const float* wpe, int64_t B,
                                        int64_t T, int64_t C, int64_t V, bool sequence_parallel,
                                        int threads) {
  const VocabShard vs = vocab_shard(V, tp);
  Tensor x = Tensor::empty({B, T, C});  // partial: own tokens (+ positions on rank 0)
  kernels::embedding_forward(x.data(), tokens, wte_local, tp.rank() == 0 ? wpe : nullptr, B, T,
                             C, vs.start, vs.size, threads);
  return sequence_parallel ? ReduceScatterToSP::forward(tp, x) : ReduceFromTP::forward(tp, x);
}

void vocab_parallel_embedding_backward(comm::Communicator& tp, const Tensor& dx,
                                       const int32_t* tokens, float* dwte_local, float* dwpe,
                                       int64_t B, int64_t T, int64_t C, int64_t V,
                                       bool sequence_parallel, int threads) {
  const VocabShard vs = vocab_shard(V, tp);
  Tensor dfull = sequence_parallel ? ReduceScatterToSP::backward(tp, dx)
                                   : ReduceFromTP::backward(tp, dx);  // (B, T, C)
  kernels::embedding_backward(dwte_local, dwpe, dfull.data(), tokens, B, T, C, vs.start, vs.size,
                              threads);
}

// ---- cross-entropy ----

VocabParallelCE vocab_parallel_ce_forward(comm::Communicator& tp, const Tensor& h,
                                          const float* wte_local, const int32_t* targets,
                                          int64_t V, const kernels::GemmOptions& opt) {
  const int threads = opt.threads;
  const VocabShard vs = vocab_shard(V, tp);
  const int64_t C = h.dim(-1), N = h.numel() / C, Vl = vs.size, Vr = vs.valid;
  VocabParallelCE ce;
  ce.logits = Tensor::empty({N, Vl});
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, N, Vl, C, 1.f, h.data(), C, wte_local, C,
                0.f, ce.logits.data(), Vl, opt);
  const float* lg = ce.logits.data();

  // Row maxima over the whole vocabulary.
  std::vector<float> mx(N);
#pragma omp parallel for num_threads(threads) if (threads > 1 && N * Vl > (1 << 14))
  for (int64_t i = 0; i < N; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    const float* x = lg + i * Vl;
    for (int64_t j = 0; j < Vr; ++j) m = x[j] > m ? x[j] : m;  // padding columns left out
    mx[i] = m;
  }
  tp.all_reduce(std::span<float>(mx), {.op = comm::ReduceOp::max, .algorithm = kTPAlgorithm});

  // [sum exp (N) | target logit (N)], summed over ranks (only the owner adds the target).
  std::vector<double> sz(2 * N, 0.0);
#pragma omp parallel for num_threads(threads) if (threads > 1 && N * Vl > (1 << 14))
  for (int64_t i = 0; i < N; ++i) {
    const float* x = lg + i * Vl;
    double s = 0;
    for (int64_t j = 0; j < Vr; ++j) s += std::exp(static_cast<double>(x[j] - mx[i]));
    sz[i] = s;
    const int64_t t = static_cast<int64_t>(targets[i]) - vs.start;
    if (targets[i] >= 0 && t >= 0 && t < Vl) sz[N + i] = x[t];
  }
  tp.all_reduce(std::span<double>(sz), {.algorithm = kTPAlgorithm});

  ce.lse = Tensor::empty({N});
  for (int64_t i = 0; i < N; ++i) {
    const double lse = static_cast<double>(mx[i]) + std::log(sz[i]);
    ce.lse[i] = static_cast<float>(lse);
    if (targets[i] >= 0) ce.loss_sum += lse - sz[N + i], ++ce.valid;
  }
  return ce;
}

Tensor vocab_parallel_ce_backward(comm::Communicator& tp, VocabParallelCE& ce, const Tensor& h,
                                  const float* wte_local, float* dwte_local,
                                  const int32_t* targets, float dloss, int64_t V,
                                  const kernels::GemmOptions& opt) {
  const int threads = opt.threads;
  const VocabShard vs = vocab_shard(V, tp);
  const int64_t C = h.dim(-1), N = h.numel() / C, Vl = vs.size, Vr = vs.valid;
  float* g = ce.logits.data();  // (N, V/p): logits in, dlogits out
#pragma omp parallel for num_threads(threads) if (threads > 1 && N * Vl > (1 << 14))
  for (int64_t i = 0; i < N; ++i) {
    float* x = g + i * Vl;
    if (targets[i] < 0) {
      for (int64_t j = 0; j < Vl; ++j) x[j] = 0.f;
      continue;
    }
    const float l = ce.lse[i];
    for (int64_t j = 0; j < Vr; ++j) x[j] = std::exp(x[j] - l) * dloss;
    for (int64_t j = Vr; j < Vl; ++j) x[j] = 0.f;  // padding: no gradient
    const int64_t t = static_cast<int64_t>(targets[i]) - vs.start;
    if (t >= 0 && t < Vl) x[t] -= dloss;
  }
  // dwte_local (V/p, C) += dlogits^T h;  dh (N, C) = dlogits wte_local (partial over ranks).
  // In bf16 the local logits' gradient is converted once for both products.
  thread_local std::vector<kernels::bf16_t> g16;
  kernels::GemmOptions dw = opt, dx = opt;
  dw.b16 = nullptr;  // B is h here, not the token table
  dw.a16 = dx.a16 = kernels::bf16_operand(g, N * Vl, g16, opt);
  kernels::gemm(kernels::Trans::T, kernels::Trans::N, Vl, C, N, 1.f, g, Vl, h.data(), C, 1.f,
                dwte_local, C, dw);
  Tensor dh = Tensor::empty(h.shape());
  kernels::gemm(kernels::Trans::N, kernels::Trans::N, N, C, Vl, 1.f, g, Vl, wte_local, C, 0.f,
                dh.data(), C, dx);
  ce.logits = Tensor();
  return dh;
}

}  // namespace meshtrain::parallel
