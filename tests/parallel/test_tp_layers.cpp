// Tensor-parallel pieces, each alone against its single-rank counterpart (outputs and every
// gradient, gathered), at tp 2 and 4, with and without sequence parallelism: region ops,
// column- and row-parallel linears, the vocabulary-parallel embedding and cross-entropy;
// checkpoint shards; bad configurations.
#include <gtest/gtest.h>

#include <vector>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/kernels/embedding.h"
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/model/config.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/parallel/tensor/tp_regions.h"
#include "meshtrain/parallel/tensor/tp_vocab.h"
#include "tp_test_util.h"

using namespace meshtrain;
using namespace tp_test;
using nn::ShardSpec;

namespace {

constexpr float kTol = 1e-5f;

// Runs fn(tp) on p threads whose whole world is one tp group (a DeviceMesh with tp = p).
void run_tp(int p, const std::function<void(std::shared_ptr<comm::Communicator>)>& fn) {
  comm::run_threads(p, [&](comm::Communicator& world) {
    parallel::DeviceMesh mesh(world, {1, p, 1});
    fn(mesh.tp_ptr());
  });
}

// Sequence shard of a (B, T, C) activation: the flat token rows [r, r+1) * N/p.
Tensor seq_shard(const Tensor& full, int r, int p) {
  Shape s = parallel::sp_local_shape(full.shape(), p);
  Tensor out = Tensor::empty(s);
  std::copy(full.data() + r * out.numel(), full.data() + (r + 1) * out.numel(), out.data());
  return out;
}

}  // namespace

// ---- region ops ----

TEST(TPRegions, EachForwardAndItsBackwardMirror) {
  for (int p : {2, 4}) {
    run_tp(p, [&](std::shared_ptr<comm::Communicator> tp) {
      const int r = tp->rank();
      const int64_t B = 2, T = 8, C = 3;
      // Rank-dependent inputs: x_r = (r + 1) * x.
      Tensor x = randn({B, T, C}, "x");
      Tensor xr = x.clone();
      for (int64_t i = 0; i < xr.numel(); ++i) xr[i] *= static_cast<float>(r + 1);
      const float sum_coef = static_cast<float>(p * (p + 1) / 2);
      Tensor xsum = x.clone();
      for (int64_t i = 0; i < xsum.numel(); ++i) xsum[i] *= sum_coef;

      // CopyToTP: identity / all-reduce.
      EXPECT_EQ(parallel::CopyToTP::forward(*tp, xr).data(), xr.data());
      EXPECT_TRUE(close(parallel::CopyToTP::backward(*tp, xr.clone()), xsum, kTol, "copy bwd"));
      // ReduceFromTP: all-reduce / identity.
      EXPECT_TRUE(close(parallel::ReduceFromTP::forward(*tp, xr.clone()), xsum, kTol, "reduce"));
      EXPECT_EQ(parallel::ReduceFromTP::backward(*tp, xr).data(), xr.data());
      // ScatterToSP: own shard / all-gather.
      Tensor sh = parallel::ScatterToSP::forward(*tp, x);
      EXPECT_EQ(sh.shape(), (Shape{B, T / p, C}));
      EXPECT_TRUE(close(sh, seq_shard(x, r, p), 0.f, "scatter"));
      EXPECT_TRUE(close(parallel::ScatterToSP::backward(*tp, sh), x, 0.f, "scatter bwd"));
      // GatherFromSP: all-gather / reduce-scatter.
      EXPECT_TRUE(close(parallel::GatherFromSP::forward(*tp, sh), x, 0.f, "gather"));
      EXPECT_TRUE(close(parallel::GatherFromSP::backward(*tp, xr), seq_shard(xsum, r, p), kTol,
                        "gather bwd"));
      // ReduceScatterToSP: reduce-scatter / all-gather.
      EXPECT_TRUE(close(parallel::ReduceScatterToSP::forward(*tp, xr), seq_shard(xsum, r, p),
                        kTol, "reduce-scatter"));
      EXPECT_TRUE(close(parallel::ReduceScatterToSP::backward(*tp, sh), x, 0.f, "rs bwd"));
    });
  }
}

// ---- column- and row-parallel linears against nn::Linear ----

namespace {

void check_column(int p, bool sp, int groups) {
  const int64_t B = 2, T = 8, C = 12, OC = 24;  // divisible by groups * p
  nn::Linear ref("blk.c_attn", C, OC, {.seed = 3});
  Tensor x = randn({B, T, C}, "x"), dy = randn({B, T, OC}, "dy");
  nn::Context rctx;
  Tensor y_ref = ref.forward(rctx, x);
  Tensor dx_ref = ref.backward(rctx, dy);
  run_tp(p, [&](std::shared_ptr<comm::Communicator> tp) {
    const int r = tp->rank();
    parallel::ColumnParallelLinear col("blk.c_attn", C, OC, tp,
                                       {.seed = 3, .groups = groups, .sequence_parallel = sp});
    EXPECT_EQ(col.weight.shard.str(), ShardSpec::split(1, r, p, groups).str());
    nn::Context ctx;
    Tensor y = col.forward(ctx, sp ? seq_shard(x, r, p) : x);
    EXPECT_TRUE(close(y, shard_of(y_ref, ShardSpec::split(2, r, p, groups)), kTol, "column y"));
    Tensor dx = col.backward(ctx, shard_of(dy, ShardSpec::split(2, r, p, groups)));
    EXPECT_TRUE(close(dx, sp ? seq_shard(dx_ref, r, p) : dx_ref, kTol, "column dx"));
    EXPECT_TRUE(close(full_grad(col.weight, *tp), ref.weight.grad, kTol, "column dW"));
    EXPECT_TRUE(close(full_grad(col.bias, *tp), ref.bias.grad, kTol, "column db"));
  });
}

void check_row(int p, bool sp) {
  const int64_t B = 2, T = 8, C = 24, OC = 12;
  nn::Linear ref("blk.c_proj", C, OC, {.seed = 4});
  for (int64_t i = 0; i < OC; ++i) ref.bias.value[i] = 0.1f * static_cast<float>(i);
  Tensor x = randn({B, T, C}, "x"), dy = randn({B, T, OC}, "dy");
  nn::Context rctx;
  Tensor y_ref = ref.forward(rctx, x);
  Tensor dx_ref = ref.backward(rctx, dy);
  run_tp(p, [&](std::shared_ptr<comm::Communicator> tp) {
    const int r = tp->rank();
    parallel::RowParallelLinear row("blk.c_proj", C, OC, tp, {.seed = 4, .sequence_parallel = sp});
    EXPECT_TRUE(row.weight.shard.is_split());
    EXPECT_FALSE(row.bias.shard.is_split());
    for (int64_t i = 0; i < OC; ++i) row.bias.value[i] = 0.1f * static_cast<float>(i);
    nn::Context ctx;
    Tensor y = row.forward(ctx, shard_of(x, ShardSpec::split(2, r, p)));
    EXPECT_TRUE(close(y, sp ? seq_shard(y_ref, r, p) : y_ref, kTol, "row y"));
    Tensor dx = row.backward(ctx, sp ? seq_shard(dy, r, p) : dy);
    EXPECT_TRUE(close(dx, shard_of(dx_ref, ShardSpec::split(2, r, p)), kTol, "row dx"));
    EXPECT_TRUE(close(full_grad(row.weight, *tp), ref.weight.grad, kTol, "row dW"));
    EXPECT_TRUE(close(full_grad(row.bias, *tp), ref.bias.grad, kTol, "row db"));
  });
}

}  // namespace

TEST(TPLinear, ColumnParallelMatchesLinear) {
  for (int p : {2, 4})
    for (bool sp : {false, true})
      for (int groups : {1, 3}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " sp=" + std::to_string(sp) +
                     " groups=" + std::to_string(groups));
        check_column(p, sp, groups);
      }
}

TEST(TPLinear, RowParallelMatchesLinear) {
  for (int p : {2, 4})
    for (bool sp : {false, true}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " sp=" + std::to_string(sp));
      check_row(p, sp);
    }
}

// ---- vocabulary-parallel embedding ----

// The table's split: equal slices, or (V not divisible) ceil(V/p) rows with padding at the end.
ShardSpec vocab_spec(int64_t V, int r, int p) {
  return V % p ? ShardSpec::split_padded(0, r, p) : ShardSpec::split(0, r, p);
}

TEST(TPVocab, EmbeddingMatchesFullTable) {
  for (const int64_t V : {32, 30}) {  // 30: padded over 4 ranks (8, 8, 8, 6 real rows)
  SCOPED_TRACE("V=" + std::to_string(V));
  const int64_t B = 2, T = 8, C = 16;
  Tensor wte = randn({V, C}, "wte"), wpe = randn({T, C}, "wpe"), dout = randn({B, T, C}, "dout");
  std::vector<int32_t> tok(B * T);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 7 + 3) % V);
  Tensor x_ref = Tensor::empty({B, T, C}), dwte_ref({V, C}), dwpe_ref({T, C});
  kernels::embedding_forward(x_ref.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 0, V, 1);
  kernels::embedding_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tok.data(), B, T, C,
                              0, V, 1);
  for (int p : {2, 4})
    for (bool sp : {false, true})
      run_tp(p, [&](std::shared_ptr<comm::Communicator> tp) {
        const int r = tp->rank();
        nn::Param w("wte.weight", {V, C}, vocab_spec(V, r, p));
        parallel::load_full_tensor(w, wte);
        Tensor x = parallel::vocab_parallel_embedding_forward(*tp, tok.data(), w.value.data(),
                                                              wpe.data(), B, T, C, V, sp, 1);
        EXPECT_TRUE(close(x, sp ? seq_shard(x_ref, r, p) : x_ref, kTol, "embedding"));
        Tensor dwpe({T, C});
        parallel::vocab_parallel_embedding_backward(*tp, sp ? seq_shard(dout, r, p) : dout,
                                                    tok.data(), w.grad.data(), dwpe.data(), B, T,
                                                    C, V, sp, 1);
        EXPECT_TRUE(close(full_grad(w, *tp), dwte_ref, kTol, "dwte"));
        EXPECT_TRUE(close(dwpe, dwpe_ref, kTol, "dwpe"));
      });
  }
}

// ---- vocabulary-parallel cross-entropy fused with the tied projection ----

TEST(TPVocab, CrossEntropyMatchesFullLogits) {
  for (const int64_t V : {64, 61}) {  // 61: padded (2 ranks: 31 + 30 real; 4: 16, 16, 16, 13)
  SCOPED_TRACE("V=" + std::to_string(V));
  const int64_t N = 24, C = 16;
  Tensor h = randn({N, C}, "h"), wte = randn({V, C}, "wte", 0.5f);
  std::vector<int32_t> tgt(N);
  for (int64_t i = 0; i < N; ++i) tgt[i] = static_cast<int32_t>((i * 13 + 5) % V);
  tgt[4] = -1;  // ignored row
  const float dloss = 0.7f / static_cast<float>(N - 1);
  // Reference: full logits, kernels' cross-entropy, tied projection backward.
  Tensor logits = Tensor::empty({N, V}), losses = Tensor::empty({N}), lse = Tensor::empty({N});
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, N, V, C, 1.f, h.data(), C, wte.data(), C,
                0.f, logits.data(), V, {1});
  kernels::crossentropy_forward(losses.data(), lse.data(), logits.data(), tgt.data(), N, V, 1);
  double loss_ref = 0;
  for (int64_t i = 0; i < N; ++i) loss_ref += losses[i];
  Tensor dl = Tensor::empty({N});
  dl.fill(dloss);
  kernels::crossentropy_backward_inplace(logits.data(), lse.data(), tgt.data(), dl.data(), N, V, 1);
  Tensor dwte_ref({V, C}), dh_ref = Tensor::empty({N, C});
  kernels::gemm(kernels::Trans::T, kernels::Trans::N, V, C, N, 1.f, logits.data(), V, h.data(), C,
                1.f, dwte_ref.data(), C, {1});
  kernels::gemm(kernels::Trans::N, kernels::Trans::N, N, C, V, 1.f, logits.data(), V, wte.data(),
                C, 0.f, dh_ref.data(), C, {1});
  for (int p : {2, 4})
    run_tp(p, [&](std::shared_ptr<comm::Communicator> tp) {
      nn::Param w("wte.weight", {V, C}, vocab_spec(V, tp->rank(), p));
      parallel::load_full_tensor(w, wte);
      auto ce = parallel::vocab_parallel_ce_forward(*tp, h, w.value.data(), tgt.data(), V, 1);
      EXPECT_EQ(ce.valid, N - 1);
      EXPECT_NEAR(ce.loss_sum, loss_ref, 1e-5 * loss_ref);
      EXPECT_TRUE(close(ce.lse, lse, kTol, "lse"));
      Tensor dh = parallel::vocab_parallel_ce_backward(*tp, ce, h, w.value.data(), w.grad.data(),
                                                       tgt.data(), dloss, V, 1);
      dh = parallel::CopyToTP::backward(*tp, dh);
      EXPECT_TRUE(close(dh, dh_ref, kTol, "dh"));
      EXPECT_TRUE(close(full_grad(w, *tp), dwte_ref, kTol, "dwte"));
      // Padding rows get no gradient (so AdamW leaves them at zero).
      const int64_t real = w.shard.real_rows(w.global_shape);
      for (int64_t i = real * C; i < w.grad.numel(); ++i) ASSERT_EQ(w.grad[i], 0.f);
    });
  }
}

// ---- checkpoint shards ----

TEST(TPCheckpoint, FullTensorAndLoadRoundTripEveryLayout) {
  const Shape g{6, 36};
  Tensor full = randn(g, "full");
  for (int p : {2, 3})
    for (auto [dim, groups] : {std::pair{0, 1}, {1, 1}, {1, 3}})
      run_tp(p, [&](std::shared_ptr<comm::Communicator> tp) {
        nn::Param w("w", g, ShardSpec::split(dim, tp->rank(), p, groups));
        parallel::load_full_tensor(w, full);
        // The shard holds, element by element, the full tensor at the spec's global index.
        for (int64_t i = 0; i < w.numel(); ++i)
          ASSERT_EQ(w.value[i], full[w.shard.global_index(g, i)]);
        EXPECT_TRUE(close(parallel::full_tensor(w, *tp), full, 0.f, "gathered"));
        // Any tensor laid out like the parameter (an optimizer moment) round-trips too.
        Tensor m = parallel::local_shard(w, full);
        EXPECT_TRUE(close(m, w.value, 0.f, "local_shard"));
        EXPECT_TRUE(close(parallel::full_tensor(w, m, *tp), full, 0.f, "moment gathered"));
      });
}

// A padded split (a dimension the ranks do not divide): the padding holds zeros, has no global
// index, and is dropped from the gathered tensor.
TEST(TPCheckpoint, PaddedSplitRoundTrips) {
  for (const Shape& g : {Shape{7, 36}, Shape{6, 35}})
    for (int p : {2, 3, 4})
      run_tp(p, [&](std::shared_ptr<comm::Communicator> tp) {
        const int dim = g[0] == 7 ? 0 : 1;
        Tensor full = randn(g, "full");
        nn::Param w("w", g, ShardSpec::split_padded(dim, tp->rank(), p));
        ASSERT_EQ(w.value.dim(dim), (g[dim] + p - 1) / p);
        w.value.fill(1.f);
        nn::init_normal(w, 5, 1.f);  // padding initialised to zero
        for (int64_t i = 0; i < w.numel(); ++i) {
          if (w.shard.global_index(g, i) < 0) {
            ASSERT_EQ(w.value[i], 0.f);
          }
        }
        parallel::load_full_tensor(w, full);
        int64_t padding = 0;
        for (int64_t i = 0; i < w.numel(); ++i) {
          const int64_t gi = w.shard.global_index(g, i);
          if (gi < 0) {
            ++padding;
            ASSERT_EQ(w.value[i], 0.f);
          } else {
            ASSERT_EQ(w.value[i], full[gi]);
          }
        }
        const int64_t other = shape_numel(g) / g[dim];
        EXPECT_EQ(padding, (w.value.dim(dim) - w.shard.real_rows(g)) * other);
        EXPECT_TRUE(close(parallel::full_tensor(w, *tp), full, 0.f, "gathered"));
      });
}

// ---- bad configurations: a sentence saying what to change ----

TEST(TPValidate, RefusesShapesThatDoNotSplit) {
  model::GPTConfig cfg = model::gpt_config("gpt-small");  // 6 heads, d 384, vocab 256
  parallel::TPOptions sp{.sequence_parallel = true};
  EXPECT_NO_THROW(parallel::validate_tp(cfg, 2, {}, 256));
  auto message = [&](const model::GPTConfig& c, int tp, parallel::TPOptions o, int64_t seq) {
    try {
      parallel::validate_tp(c, tp, o, seq);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(cfg, 4, {}, 256).find("attention heads do not divide"), std::string::npos);
  EXPECT_NE(message(cfg, 8, {}, 256).find("larger than the model's 6 attention heads"),
            std::string::npos);
  model::GPTConfig c2 = cfg;
  c2.n_head = 4, c2.n_embd = 130;  // (an invalid model: caught here all the same)
  EXPECT_NE(message(c2, 4, {}, 256).find("hidden size 130"), std::string::npos);
  c2 = cfg;
  c2.vocab_size = 50257;
  EXPECT_NE(message(c2, 2, {}, 256).find("vocabulary of 50257"), std::string::npos);
  EXPECT_NE(message(c2, 2, {}, 256).find("--pad-vocab"), std::string::npos);
  EXPECT_EQ(message(c2, 2, {.pad_vocab = true}, 256), "");
  EXPECT_NE(message(cfg, 2, sp, 255).find("--seq 255"), std::string::npos);
  EXPECT_EQ(message(cfg, 2, sp, 256), "");
  EXPECT_NE(message(cfg, 0, {}, 256).find("at least 1"), std::string::npos);
}
