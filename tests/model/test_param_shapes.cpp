// gpt_param_shapes(cfg) lists, without allocating, exactly the parameters GPT(cfg) holds:
// the same names, in the same order, with the same shapes. Loaders compare checkpoints with it.
#include <gtest/gtest.h>

#include "meshtrain/model/gpt.h"

using namespace meshtrain;

TEST(GptParamShapes, MatchTheBuiltModel) {
  model::GPTConfig small;
  small.n_layer = 3, small.n_embd = 24, small.n_head = 3, small.vocab_size = 50, small.block_size = 10;
  for (const model::GPTConfig& cfg : {small, model::gpt_config("gpt-tiny")}) {
    model::GPT gpt(cfg, 1);
    const auto params = gpt.params();
    const auto shapes = model::gpt_param_shapes(cfg);
    ASSERT_EQ(shapes.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(shapes[i].first, params[i]->name) << i;
      EXPECT_EQ(shapes[i].second, params[i]->value.shape()) << params[i]->name;
    }
  }
}
