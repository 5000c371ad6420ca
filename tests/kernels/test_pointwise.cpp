// GELU, element-wise helpers and AdamW against double references (GELU's backward also
// against finite differences of the double forward).
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "meshtrain/kernels/adamw.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/kernels/gelu.h"

using namespace meshtrain::kernels;
using namespace meshtrain::kernels::testing;

namespace {
double gelu_ref(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
}  // namespace

// ---- gelu ----
TEST(Gelu, ForwardBackwardMatchReference) {
  // Inputs span [-12, 12] (tails where tanh saturates) plus N(0, 2). The kernel's tanh has
  // ~1e-7 absolute error, so outputs are within ~1e-6 * (1 + |x|): atol 2e-6, rtol 1e-5.
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(100003)})
    for (int threads : {1, 2}) {
      auto x = randn(n, 7, 2.0f);
      for (int64_t i = 0; i < n && i < 25; ++i) x[i] = -12.0f + i;
      auto dy = randn(n, 8);
      std::vector<float> y(n), dx(n, 99.0f);
      gelu_forward(y.data(), x.data(), n, threads);
      gelu_backward(dx.data(), x.data(), dy.data(), n, threads);
      std::vector<double> wy(n), wdx(n);
      for (int64_t i = 0; i < n; ++i) {
        const double h = 1e-5;  // central difference of the double forward: error ~1e-10
        wy[i] = gelu_ref(x[i]);
        wdx[i] = (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h) * dy[i];
      }
      EXPECT_TRUE(all_close(y, wy, 1e-5, 2e-6)) << "n=" << n;
      EXPECT_TRUE(all_close(dx, wdx, 1e-5, 1e-5)) << "n=" << n;
    }
}

// The exact form against x Phi(x) in double (std::erf), and its backward against finite
// differences of that double forward; each element alone, so 1 and 2 threads agree bit for bit.
TEST(Gelu, ExactErfFormMatchesReference) {
  auto ref = [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); };
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(100003)}) {
    auto x = randn(n, 9, 2.0f);
    for (int64_t i = 0; i < n && i < 25; ++i) x[i] = -12.0f + i;
    auto dy = randn(n, 10);
    std::vector<float> y1(n), y2(n), dx1(n, 99.0f), dx2(n, 99.0f);
    gelu_erf_forward(y1.data(), x.data(), n, 1);
    gelu_erf_forward(y2.data(), x.data(), n, 2);
    gelu_erf_backward(dx1.data(), x.data(), dy.data(), n, 1);
    gelu_erf_backward(dx2.data(), x.data(), dy.data(), n, 2);
    std::vector<double> wy(n), wdx(n);
    for (int64_t i = 0; i < n; ++i) {
      const double h = 1e-5;
      wy[i] = ref(x[i]);
      wdx[i] = (ref(x[i] + h) - ref(x[i] - h)) / (2 * h) * dy[i];
    }
    EXPECT_TRUE(all_close(y1, wy, 1e-5, 2e-6)) << "n=" << n;
    EXPECT_TRUE(all_close(dx1, wdx, 1e-5, 1e-5)) << "n=" << n;
    EXPECT_EQ(y1, y2);
    EXPECT_EQ(dx1, dx2);
    // Not the tanh form: at x = 1 the two differ by ~1.6e-4, far above the tolerance.
    float t = 0, e = 0, one = 1.0f;
    gelu_forward(&t, &one, 1, 1);
    gelu_erf_forward(&e, &one, 1, 1);
    EXPECT_GT(std::abs(t - e), 1e-4f);
  }
}

// ---- elementwise ----
TEST(Elementwise, AddAccumulateScale) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(19), int64_t(70001)})
    for (int threads : {1, 2}) {
      auto a = randn(n, 1), b = randn(n, 2);
      std::vector<float> out(n), y = a;
      add(out.data(), a.data(), b.data(), n, threads);
      accumulate(y.data(), b.data(), n, threads);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], a[i] + b[i]);  // one rounding, exactly as the reference
        ASSERT_EQ(y[i], a[i] + b[i]);
      }
      scale(y.data(), 0.5f, n, threads);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (a[i] + b[i]) * 0.5f);
    }
}

// ---- adamw ----
TEST(AdamW, ThreeStepsMatchReference) {
  // Double reference of three steps; per-element float error ~1e-7 relative per step, and
  // the update divides by sqrt(v) so near-zero gradients amplify it: rtol 1e-5, atol 1e-6.
  for (int64_t n : {int64_t(1), int64_t(33), int64_t(50001)})
    for (int threads : {1, 2}) {
      auto p = randn(n, 1);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
      AdamWParams hp;
      hp.lr = 1e-2f;
      hp.weight_decay = 0.1f;
      hp.grad_scale = 0.5f;
      for (int64_t step = 1; step <= 3; ++step) {
        auto g = randn(n, 10 + uint32_t(step));
        hp.step = step;
        adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp, threads);
        const double b1 = hp.beta1, b2 = hp.beta2;
        for (int64_t i = 0; i < n; ++i) {
          const double gi = double(g[i]) * hp.grad_scale;
          rm[i] = b1 * rm[i] + (1 - b1) * gi;
          rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
          const double mh = rm[i] / (1 - std::pow(b1, step)), vh = rv[i] / (1 - std::pow(b2, step));
          rp[i] -= double(hp.lr) * (mh / (std::sqrt(vh) + double(hp.eps)) + double(hp.weight_decay) * rp[i]);
        }
      }
      EXPECT_TRUE(all_close(p, rp, 1e-5, 1e-6));
      EXPECT_TRUE(all_close(m, rm, 1e-5, 1e-7));
      EXPECT_TRUE(all_close(v, rv, 1e-5, 1e-8));
    }
}

TEST(AdamW, SumSquares) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(1001), int64_t(300007)})
    for (int threads : {1, 2}) {
      auto x = randn(n, 3);
      double want = 0;
      for (float v : x) want += double(v) * v;
      // Double accumulation of float squares: only summation-order differences, ~1e-15.
      EXPECT_NEAR(sum_squares(x.data(), n, threads), want, 1e-12 * (1 + want));
    }
}
