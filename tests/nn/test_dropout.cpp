// Dropout (nn/dropout.h): the fraction dropped, the scale of what is kept, backward through the
// same mask, the identity in evaluation, and the mask a function of (step, global sample,
// element): the same samples drawn in one call or split over two (as data-parallel ranks or
// micro-batches hold them) give the same output.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/nn/context.h"
#include "meshtrain/nn/dropout.h"

namespace meshtrain::nn {
namespace {

Tensor ones(Shape s) {
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = 1.f + 0.001f * static_cast<float>(i % 97);
  return t;
}

TEST(Dropout, DropsAboutPAndScalesTheRestAndBackwardUsesTheSameMask) {
  Dropout d("drop", 0.3, 1337);
  Context ctx;
  ctx.step = 5, ctx.first_sample = 0;
  const Tensor x = ones({64, 500});
  const Tensor y = d.forward(ctx, x);
  int64_t dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (y.data()[i] == 0.f) ++dropped;
    else EXPECT_FLOAT_EQ(y.data()[i], x.data()[i] / 0.7f);
  }
  const double frac = static_cast<double>(dropped) / static_cast<double>(x.numel());
  EXPECT_NEAR(frac, 0.3, 0.01);  // 32,000 draws: 5 standard deviations is 0.013
  const Tensor dy = ones({64, 500});
  const Tensor dx = d.backward(ctx, dy);
  for (int64_t i = 0; i < x.numel(); ++i)
    EXPECT_FLOAT_EQ(dx.data()[i], y.data()[i] == 0.f ? 0.f : dy.data()[i] / 0.7f) << i;
}

TEST(Dropout, TheMaskDependsOnTheGlobalSampleNotOnHowTheBatchIsSplit) {
  Dropout d("drop", 0.5, 7);
  const Tensor x = ones({8, 40});
  Context whole;
  whole.step = 3, whole.first_sample = 16;
  const Tensor all = d.forward(whole, x);
  // Samples 16..19 and 20..23 of the step, as two ranks hold them.
  for (int half = 0; half < 2; ++half) {
    Tensor part = Tensor::empty({4, 40});
    for (int64_t i = 0; i < part.numel(); ++i) part.data()[i] = x.data()[half * 160 + i];
    Context c;
    c.step = 3, c.first_sample = 16 + 4 * half;
    const Tensor y = d.forward(c, part);
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data()[i], all.data()[half * 160 + i]) << half << " " << i;
  }
  // Another step draws another mask; another sample index too.
  Context later;
  later.step = 4, later.first_sample = 16;
  const Tensor other = d.forward(later, x);
  int differ = 0;
  for (int64_t i = 0; i < x.numel(); ++i) differ += other.data()[i] != all.data()[i];
  EXPECT_GT(differ, 50);
}

TEST(Dropout, EvaluationPassesTheInputThrough) {
  Dropout d("drop", 0.5, 7);
  Context eval(1, /*training=*/false);  // step -1: no step, no mask
  const Tensor x = ones({4, 10});
  const Tensor y = d.forward(eval, x);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y.data()[i], x.data()[i]);
}

}  // namespace
}  // namespace meshtrain::nn
