// What tensor parallelism costs: the bytes the tp group sends per training step equal the
// analytic count exactly, and the per-rank parameter bytes are the replicated part plus 1/tp of
// the split part.
#include <gtest/gtest.h>

#include <mutex>
#include <numeric>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"

using namespace meshtrain;

namespace {

// Bytes the whole group sends for one collective with the ring algorithm (kTPAlgorithm), over
// p ranks: an all-reduce of n elements sends each of its p blocks p-1 times in its
// reduce-scatter and p-1 times in its all-gather; a reduce-scatter (all-gather) of a full
// tensor of n elements is one of those halves.
uint64_t all_reduce_bytes(int p, uint64_t n, uint64_t elem) { return 2ull * (p - 1) * n * elem; }
uint64_t half_bytes(int p, uint64_t n_full, uint64_t elem) { return 1ull * (p - 1) * n_full * elem; }

// One forward + backward of GPT (N = B*T tokens, L layers, width C), group total.
//   no SP: forward  all-reduce (N, C) after the embedding and after each block half (1 + 2L),
//                   all-reduce (N) of row maxima and (2N) doubles of [sum exp | target logit];
//          backward all-reduce (N, C) before each block half (2L) and before the head (1).
//   SP:    each of those (N, C) all-reduces becomes a reduce-scatter + all-gather pair (the same
//          bytes); backward gathers each column-parallel layer's saved input shard again (2L
//          all-gathers of (N, C)); and the layernorms' partial gradients are all-reduced: 4C
//          floats per block and 2C for ln_f.
uint64_t analytic_step_bytes(int p, int64_t N, int64_t C, int64_t L, bool sp) {
  const uint64_t f = 4, d = 8;
  uint64_t b = all_reduce_bytes(p, N, f) + all_reduce_bytes(p, 2 * N, d);  // cross-entropy
  if (!sp) return b + (2 + 4 * L) * all_reduce_bytes(p, N * C, f);
  b += (4 + 8 * L + 2 * L) * half_bytes(p, N * C, f);
  b += L * all_reduce_bytes(p, 4 * C, f) + all_reduce_bytes(p, 2 * C, f);
  return b;
}

}  // namespace

TEST(TPCosts, BytesPerStepEqualTheAnalyticCount) {
  model::GPTConfig cfg = model::gpt_config("gpt-tiny");
  const int64_t B = 2, T = 32, N = B * T;
  for (int p : {2, 4})
    for (bool sp : {false, true}) {
      std::vector<uint64_t> sent(p), clip(p);
      comm::run_threads(p, [&](comm::Communicator& world) {
        parallel::DeviceMesh mesh(world, {1, p, 1});
        auto gpt = parallel::build_gpt(cfg, 5, mesh.tp_ptr(), {.sequence_parallel = sp});
        std::vector<int32_t> tok(N), tgt(N);
        for (int64_t i = 0; i < N; ++i) tok[i] = (i * 7) % 256, tgt[i] = (i * 3 + 1) % 256;
        auto& tp = mesh.tp_group();
        tp.reset_stats();
        nn::Context ctx;
        gpt->forward(ctx, tok.data(), tgt.data(), B, T);
        gpt->backward(ctx, 1.0f);
        sent[tp.rank()] = tp.stats().bytes_sent;
        parallel::tp_grad_sq(gpt->params(), tp);
        clip[tp.rank()] = tp.stats().bytes_sent - sent[tp.rank()];
      });
      const uint64_t want = analytic_step_bytes(p, N, cfg.n_embd, cfg.n_layer, sp);
      const uint64_t got = std::accumulate(sent.begin(), sent.end(), uint64_t{0});
      EXPECT_EQ(got, want) << "tp=" << p << " sp=" << sp;
      for (int r = 0; r < p; ++r) EXPECT_EQ(sent[r], want / p) << "rank " << r;  // balanced
      EXPECT_EQ(std::accumulate(clip.begin(), clip.end(), uint64_t{0}), all_reduce_bytes(p, 1, 8));
      std::printf("[ tp bytes ] gpt-tiny B=%lld T=%lld tp=%d sp=%d: %llu bytes per rank per step\n",
                  static_cast<long long>(B), static_cast<long long>(T), p, sp ? 1 : 0,
                  static_cast<unsigned long long>(want / p));
    }
}

// Per-rank parameter bytes: replicated part + split part / tp. gpt-small has 6 heads, so tp 4 is
// refused for it; its parameter shapes do not depend on the head count, so the tp 4 figure is
// taken on gpt-small's shapes with 12 heads (head size 32), and tp 2 on gpt-small itself.
TEST(TPCosts, ParameterBytesAreReplicatedPlusSplitOverTp) {
  model::GPTConfig small = model::gpt_config("gpt-small");
  EXPECT_THROW(parallel::validate_tp(small, 4, {}, small.seq), std::invalid_argument);
  const int64_t C = small.n_embd, L = small.n_layer, V = small.vocab_size;
  const int64_t replicated = small.block_size * C + 2 * C + L * (2 * C + 2 * C + C + C);
  const int64_t split = V * C + L * (C * 3 * C + 3 * C + C * C + C * 4 * C + 4 * C + 4 * C * C);
  ASSERT_EQ(replicated + split, small.num_params());
  model::GPTConfig small12 = small;
  small12.n_head = 12;
  for (auto [cfg, p] : {std::pair{small, 2}, {small12, 4}}) {
    std::vector<int64_t> bytes(p), rep(p);
    comm::run_threads(p, [&](comm::Communicator& world) {
      parallel::DeviceMesh mesh(world, {1, p, 1});
      auto gpt = parallel::build_gpt(cfg, 5, mesh.tp_ptr(), {});
      int64_t b = 0, r = 0;
      for (nn::Param* q : gpt->params()) {
        b += q->value.bytes();
        if (!q->shard.is_split()) r += q->value.bytes();
      }
      bytes[world.rank()] = b, rep[world.rank()] = r;
    });
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(bytes[r], 4 * (replicated + split / p));
      EXPECT_EQ(rep[r], 4 * replicated);
    }
    std::printf("[ tp memory ] gpt-small shapes tp=%d: %lld parameter bytes per rank "
                "(%lld replicated + %lld split / %d) vs %lld on one rank (%.3fx)\n",
                p, static_cast<long long>(bytes[0]), static_cast<long long>(4 * replicated),
                static_cast<long long>(4 * split), p, static_cast<long long>(4 * small.num_params()),
                static_cast<double>(bytes[0]) / (4.0 * small.num_params()));
  }
}
