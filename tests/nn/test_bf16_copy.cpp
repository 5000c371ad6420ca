// The bf16 copy of a weight (nn::Param::bf16_value): a step's products read one copy made at the
// first use and give exactly what converting the weight at every product gives; a new step (a
// new Context::weights_epoch) converts the updated weight again, and evaluation (epoch -1)
// converts at every product.
#include <gtest/gtest.h>

#include <cstring>

#include "gradcheck.h"
#include "meshtrain/kernels/bf16.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/optim/optimizer.h"

using namespace meshtrain;
using namespace meshtrain::testing;

namespace {

struct Pass {
  Tensor y, dx, dw;
};

// Forward and backward of `lin` at precision bf16 with the given weights epoch.
Pass run(nn::Linear& lin, const Tensor& x, const Tensor& dy, int64_t epoch) {
  nn::Context ctx(1, true, kernels::Precision::bf16);
  ctx.weights_epoch = epoch;
  lin.zero_grad();
  Pass p;
  p.y = lin.forward(ctx, x);
  p.dx = lin.backward(ctx, dy);
  p.dw = lin.weight.grad.clone();
  return p;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
}

TEST(Bf16WeightCopy, OneCopyPerStepGivesTheSameBitsAsConvertingAtEveryProduct) {
  nn::Linear lin("l", 48, 40, {.seed = 7});
  Tensor x = random_tensor({3, 8, 48}, 1, "x"), dy = random_tensor({3, 8, 40}, 2, "dy");

  const Pass per_call = run(lin, x, dy, -1);
  EXPECT_EQ(lin.weight.bf16_epoch, -1) << "evaluation-style passes keep no copy";
  EXPECT_TRUE(lin.weight.value_bf16.empty());

  const Pass cached = run(lin, x, dy, 5);
  EXPECT_EQ(lin.weight.bf16_epoch, 5);
  EXPECT_EQ(lin.weight.value_bf16.size(), static_cast<size_t>(lin.weight.value.numel()));
  EXPECT_TRUE(same(per_call.y, cached.y));
  EXPECT_TRUE(same(per_call.dx, cached.dx));
  EXPECT_TRUE(same(per_call.dw, cached.dw)) << "dW's B operand is dy, never the weight's copy";

  // The copy is reused within the step: change the float32 weight (as no one may mid-step) and
  // the same epoch still reads the copy made before, so the output does not move.
  const Tensor w0 = lin.weight.value.clone();
  for (int64_t i = 0; i < lin.weight.value.numel(); ++i) lin.weight.value.data()[i] *= 1.5f;
  const Pass stale = run(lin, x, dy, 5);
  EXPECT_TRUE(same(stale.y, cached.y)) << "the step's copy was converted again";

  // The next step converts the updated weight: equal to converting at every product.
  const Pass next = run(lin, x, dy, 6);
  const Pass next_per_call = run(lin, x, dy, -1);
  EXPECT_EQ(lin.weight.bf16_epoch, 6);
  EXPECT_FALSE(same(next.y, cached.y));
  EXPECT_TRUE(same(next.y, next_per_call.y));
  EXPECT_TRUE(same(next.dx, next_per_call.dx));

  lin.weight.drop_bf16();  // what ZeRO-3 does when it releases a unit
  EXPECT_TRUE(lin.weight.value_bf16.empty());
  EXPECT_EQ(lin.weight.bf16_epoch, -1);
  lin.weight.value.copy_from(w0);
  EXPECT_TRUE(same(run(lin, x, dy, 6).y, per_call.y)) << "after a drop the copy is made anew";
}

TEST(Bf16WeightCopy, TheOptimizerWritesTheNextStepsCopyAsItUpdates) {
  // Two equal layers: one whose products read its copy in step 3 (the optimizer then writes the
  // copy for step 4 in its pass), one that converted at every product (no copy: the optimizer
  // writes none).
  nn::Linear a("l", 48, 40, {.seed = 7}), b("l", 48, 40, {.seed = 7});
  ASSERT_TRUE(same(a.weight.value, b.weight.value));
  Tensor x = random_tensor({2, 8, 48}, 1, "x"), dy = random_tensor({2, 8, 40}, 2, "dy");
  run(a, x, dy, 3);
  run(b, x, dy, -1);
  ASSERT_TRUE(same(a.weight.grad, b.weight.grad));
  train::OptimizerConfig cfg;
  train::AdamW oa({&a.weight}, cfg, 1), ob({&b.weight}, cfg, 1);
  oa.step(3);
  ob.step(3);
  EXPECT_TRUE(same(a.weight.value, b.weight.value)) << "the fused pass changed the update";
  EXPECT_EQ(a.weight.bf16_epoch, 4);
  EXPECT_EQ(b.weight.bf16_epoch, -1);
  EXPECT_TRUE(b.weight.value_bf16.empty());
  std::vector<uint16_t> expect(a.weight.value.numel());
  kernels::to_bf16(a.weight.value.data(), expect.data(), a.weight.value.numel(), 1);
  EXPECT_EQ(a.weight.value_bf16, expect);
  // Step 4 reads that copy as it is; the result equals converting the updated weight.
  const Pass fused = run(a, x, dy, 4);
  const Pass converted = run(a, x, dy, -1);
  EXPECT_TRUE(same(fused.y, converted.y));
}

}  // namespace
