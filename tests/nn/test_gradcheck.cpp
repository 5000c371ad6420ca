// Gradient checks of every nn/ module against finite differences (tolerance: gradcheck.h).
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/model/mlp.h"
#include "meshtrain/nn/attention.h"
#include "meshtrain/nn/gelu.h"
#include "meshtrain/nn/layernorm.h"
#include "meshtrain/nn/linear.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

constexpr double kTol = 2e-2;

// Checks d/dx and d/dparam of L = sum(layer(x) * R) for a Layer.
void check_layer(nn::Layer& layer, Tensor x, const char* what) {
  Tensor y0;
  {
    nn::Context ctx(1, false);
    y0 = layer.forward(ctx, x);
  }
  Tensor R = random_tensor(y0.shape(), 99, "R");
  auto objective = [&] {
    nn::Context ctx(1, false);
    return dot(layer.forward(ctx, x), R);
  };
  layer.zero_grad();
  nn::Context ctx(1, true);
  layer.forward(ctx, x);
  Tensor dx = layer.backward(ctx, R);
  EXPECT_EQ(ctx.saved_bytes(), 0) << what << ": backward left saved tensors behind";

  auto r = check_gradient(x.data(), dx.data(), x.numel(), objective);
  EXPECT_LT(r.rel_error, kTol) << what << ": input gradient";
  EXPECT_GT(r.analytic_norm, 0.0) << what << ": input gradient is zero";
  for (nn::Param* p : layer.params()) {
    auto rp = check_gradient(p->value.data(), p->grad.data(), p->numel(), objective);
    EXPECT_LT(rp.rel_error, kTol) << what << ": gradient of " << p->name;
    EXPECT_GT(rp.analytic_norm, 0.0) << what << ": gradient of " << p->name << " is zero";
  }
}

}  // namespace

TEST(GradCheck, Linear) {
  nn::Linear lin("lin", 7, 5, {.init_std = 0.5f, .seed = 3});
  for (int i = 0; i < 5; ++i) lin.bias.value[i] = 0.1f * i;
  check_layer(lin, random_tensor({2, 3, 7}, 1, "x"), "Linear");
}

TEST(GradCheck, LayerNorm) {
  nn::LayerNorm ln("ln", 9);
  for (int i = 0; i < 9; ++i) ln.weight.value[i] = 1.0f + 0.1f * i, ln.bias.value[i] = 0.05f * i;
  check_layer(ln, random_tensor({4, 9}, 2, "x"), "LayerNorm");
}

TEST(GradCheck, Gelu) {
  nn::Gelu g;
  check_layer(g, random_tensor({3, 11}, 3, "x", 2.0f), "Gelu");
}

TEST(GradCheck, CausalSelfAttention) {
  // T = 13 is not a multiple of any tile size; 3 heads of size 4.
  nn::CausalSelfAttention attn("attn", 12, 3, {.seed = 5, .init_std = 0.3f, .proj_init_std = 0.3f});
  check_layer(attn, random_tensor({2, 13, 12}, 4, "x"), "CausalSelfAttention");
}

TEST(GradCheck, MLP) {
  model::MLP mlp({6, 10, 4}, 11);
  for (nn::Param* p : mlp.params()) nn::init_normal(*p, 12, 0.4f);
  check_layer(mlp, random_tensor({5, 6}, 6, "x"), "MLP");
}

TEST(GradCheck, TransformerBlock) {
  model::GPTConfig cfg;
  cfg.n_layer = 1, cfg.n_embd = 8, cfg.n_head = 2, cfg.vocab_size = 11, cfg.block_size = 8;
  model::Block block("h.0", cfg, 21);
  for (nn::Param* p : block.params()) nn::init_normal(*p, 22, 0.3f);
  check_layer(block, random_tensor({2, 5, 8}, 7, "x"), "Block");
}

// The whole model: every parameter's gradient of the mean cross-entropy.
TEST(GradCheck, WholeGPT) {
  model::GPTConfig cfg;
  cfg.name = "gradcheck";
  cfg.n_layer = 2, cfg.n_embd = 8, cfg.n_head = 2, cfg.vocab_size = 13, cfg.block_size = 6;
  model::GPT gpt(cfg, 31);
  for (nn::Param* p : gpt.params())
    if (p->name.find("ln") == std::string::npos) nn::init_normal(*p, 32, 0.3f);
  const int64_t B = 2, T = 6;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % 13, tgt[i] = (i * 5 + 1) % 13;
  auto objective = [&] {
    nn::Context ctx(1, false);
    return static_cast<double>(gpt.forward(ctx, tok.data(), tgt.data(), B, T));
  };
  gpt.zero_grad();
  nn::Context ctx(1, true);
  gpt.forward(ctx, tok.data(), tgt.data(), B, T);
  gpt.backward(ctx);
  EXPECT_EQ(ctx.saved_bytes(), 0);
  for (nn::Param* p : gpt.params()) {
    // The mean loss is O(1) and its float32 round-off ~1e-7: a larger step keeps the
    // difference quotient above it.
    auto r = check_gradient(p->value.data(), p->grad.data(), p->numel(), objective, 3e-2);
    EXPECT_LT(r.rel_error, 3e-2) << "gradient of " << p->name;
    EXPECT_GT(r.analytic_norm, 0.0) << p->name;
  }
}
