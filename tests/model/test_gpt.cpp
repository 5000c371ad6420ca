// GPT structure: the named configs, GPT-2's parameter names and layouts, and the
// layout-invariant initialisation of sharded parameters.
#include <gtest/gtest.h>

#include <map>

#include "meshtrain/model/gpt.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/nn/linear.h"

using namespace meshtrain;

TEST(GPTConfig, NamedConfigs) {
  auto tiny = model::gpt_config("gpt-tiny");
  EXPECT_EQ(tiny.n_layer, 4);
  EXPECT_EQ(tiny.n_embd, 128);
  EXPECT_EQ(tiny.batch, 12);
  auto small = model::gpt_config("gpt-small");
  EXPECT_EQ(small.n_embd, 384);
  EXPECT_EQ(small.seq, 256);
  // The published GPT-2 small has 124,439,808 parameters (tied lm_head counted once).
  EXPECT_EQ(model::gpt_config("gpt2-124m").num_params(), 124439808);
  EXPECT_THROW(model::gpt_config("gpt-huge"), std::invalid_argument);
  model::GPTConfig bad = tiny;
  bad.n_head = 3;
  EXPECT_THROW(bad.validate(), std::invalid_argument);
}

TEST(GPT, ParameterNamesAndShapesFollowGPT2) {
  model::GPTConfig cfg = model::gpt_config("gpt-tiny");
  model::GPT gpt(cfg, 1);
  std::map<std::string, Shape> got;
  int64_t total = 0;
  for (nn::Param* p : gpt.params()) got[p->name] = p->value.shape(), total += p->numel();
  const int64_t C = 128;
  std::map<std::string, Shape> want = {{"wte.weight", {256, C}}, {"wpe.weight", {64, C}},
                                       {"ln_f.weight", {C}},     {"ln_f.bias", {C}}};
  for (int i = 0; i < 4; ++i) {
    std::string h = "h." + std::to_string(i) + ".";
    want[h + "ln_1.weight"] = {C};
    want[h + "ln_1.bias"] = {C};
    want[h + "attn.c_attn.weight"] = {C, 3 * C};
    want[h + "attn.c_attn.bias"] = {3 * C};
    want[h + "attn.c_proj.weight"] = {C, C};
    want[h + "attn.c_proj.bias"] = {C};
    want[h + "ln_2.weight"] = {C};
    want[h + "ln_2.bias"] = {C};
    want[h + "mlp.c_fc.weight"] = {C, 4 * C};
    want[h + "mlp.c_fc.bias"] = {4 * C};
    want[h + "mlp.c_proj.weight"] = {4 * C, C};
    want[h + "mlp.c_proj.bias"] = {C};
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(total, cfg.num_params());
}

TEST(GPT, InitialisationStatistics) {
  model::GPTConfig cfg = model::gpt_config("gpt-tiny");
  model::GPT gpt(cfg, 1);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(t[i]) * t[i];
    return std::sqrt(s / static_cast<double>(t.numel()));
  };
  EXPECT_NEAR(stddev(gpt.stage().wte.value), 0.02, 0.001);
  auto* blk = gpt.stage().h[0].get();
  auto* mlp = static_cast<model::MLPBlock*>(blk->mlp.get());
  EXPECT_NEAR(stddev(mlp->c_proj->weight.value), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(blk->ln_1.weight.value[0], 1.0f);
  EXPECT_EQ(mlp->c_fc->bias.value[5], 0.0f);
}

// Decision 1: a column shard of the fused qkv projection (groups = 3: each rank holds its
// heads' columns of q, k and v) draws exactly the values of the full tensor there.
TEST(GPT, ShardedInitialisationEqualsSliceOfFull) {
  const int64_t C = 12, tp = 2;
  nn::Linear full("h.0.attn.c_attn", C, 3 * C, {.seed = 9});
  for (int r = 0; r < tp; ++r) {
    nn::LinearOptions o{.seed = 9,
                        .weight_shard = nn::ShardSpec::split(1, r, tp, 3),
                        .bias_shard = nn::ShardSpec::split(0, r, tp, 3)};
    nn::Linear shard("h.0.attn.c_attn", C, 3 * C, o);
    ASSERT_EQ(shard.weight.value.shape(), (Shape{C, 3 * C / tp}));
    const int64_t part = C / tp;  // columns of one of q, k, v on this rank
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < 3 * part; ++j) {
        int64_t g = j / part, within = j % part;
        int64_t global_col = g * C + r * part + within;
        EXPECT_EQ(shard.weight.value[i * 3 * part + j], full.weight.value[i * 3 * C + global_col]);
      }
  }
  // A row split (row-parallel projection).
  nn::Linear proj("h.0.attn.c_proj", C, C, {.seed = 9});
  nn::Linear proj1("h.0.attn.c_proj", C, C, {.seed = 9, .weight_shard = nn::ShardSpec::split(0, 1, 3)});
  for (int64_t i = 0; i < C / 3; ++i)
    for (int64_t j = 0; j < C; ++j)
      EXPECT_EQ(proj1.weight.value[i * C + j], proj.weight.value[(C / 3 + i) * C + j]);
  EXPECT_THROW(nn::ShardSpec::split(1, 0, 5).local_shape({4, 12}), std::invalid_argument);
}

TEST(GPT, LossAtInitIsNearUniform) {
  model::GPTConfig cfg = model::gpt_config("gpt-tiny");
  model::GPT gpt(cfg, 1);
  std::vector<int32_t> tok(2 * 64), tgt(2 * 64);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(i * 37 % 256), tgt[i] = static_cast<int32_t>(i * 11 % 256);
  nn::Context ctx(1, false);
  float loss = gpt.forward(ctx, tok.data(), tgt.data(), 2, 64);
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
  EXPECT_THROW(gpt.forward(ctx, tok.data(), tgt.data(), 1, 65), std::invalid_argument);
}
