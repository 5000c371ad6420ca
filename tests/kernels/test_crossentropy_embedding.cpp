// Cross-entropy, softmax and the embedding against double references.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/kernels/embedding.h"

using namespace meshtrain::kernels;
using namespace meshtrain::kernels::testing;

// ---- cross-entropy ----
TEST(CrossEntropy, ForwardBackwardMatchReference) {
  // Logits ~ N(0, 3) so probabilities span many decades. lse in float over V <= 50257 terms:
  // relative error ~1e-6 of lse; gradients are probabilities times dloss: atol 1e-6.
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {5, 17}, {64, 256}, {3, 50257}})
    for (int threads : {1, 2}) {
      auto logits = randn(N * V, uint32_t(V), 3.0f);
      std::vector<int32_t> tg(N);
      for (int64_t i = 0; i < N; ++i) tg[i] = int32_t((i * 7919) % V);
      if (N > 2) tg[1] = -1;  // ignored row
      auto dl = randn(N, 9);
      std::vector<float> loss(N), lse(N);
      crossentropy_forward(loss.data(), lse.data(), logits.data(), tg.data(), N, V, threads);
      std::vector<double> wloss(N), wlse(N), wgrad(N * V);
      for (int64_t i = 0; i < N; ++i) {
        double mx = -1e300, s = 0;
        for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits[i * V + j]));
        for (int64_t j = 0; j < V; ++j) s += std::exp(logits[i * V + j] - mx);
        wlse[i] = mx + std::log(s);
        wloss[i] = tg[i] < 0 ? 0.0 : wlse[i] - logits[i * V + tg[i]];
        for (int64_t j = 0; j < V; ++j)
          wgrad[i * V + j] = tg[i] < 0 ? 0.0
                                       : (std::exp(logits[i * V + j] - wlse[i]) - (j == tg[i])) * dl[i];
      }
      EXPECT_TRUE(all_close(lse, wlse, 1e-6, 1e-6));
      EXPECT_TRUE(all_close(loss, wloss, 1e-5, 1e-5));
      crossentropy_backward_inplace(logits.data(), lse.data(), tg.data(), dl.data(), N, V, threads);
      EXPECT_TRUE(all_close(logits, wgrad, 1e-5, 1e-6)) << "N=" << N << " V=" << V;
    }
}

TEST(Softmax, MatchesReferenceWithTemperature) {
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {4, 33}, {2, 50257}})
    for (float temp : {1.0f, 0.7f}) {
      auto x = randn(N * V, 5, 4.0f);
      std::vector<float> p(N * V);
      softmax_forward(p.data(), x.data(), N, V, temp, 2);
      std::vector<double> want(N * V);
      for (int64_t i = 0; i < N; ++i) {
        double mx = -1e300, s = 0;
        for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(x[i * V + j]) / temp);
        for (int64_t j = 0; j < V; ++j) s += std::exp(x[i * V + j] / double(temp) - mx);
        for (int64_t j = 0; j < V; ++j) want[i * V + j] = std::exp(x[i * V + j] / double(temp) - mx) / s;
      }
      // Probabilities <= 1; float exp and sum: relative 1e-5 plus atol 1e-7.
      EXPECT_TRUE(all_close(p, want, 1e-5, 1e-7));
    }
}

// ---- embedding ----
TEST(Embedding, ForwardBackwardWithVocabShard) {
  // Pure copies and additions: the kernel sums the same float terms per element in the same
  // order as a float reference would (up to B terms), so a tight 1e-6 tolerance applies.
  const int64_t B = 3, T = 5, C = 37, V = 11;
  std::vector<int32_t> tok(B * T);
  for (int64_t k = 0; k < B * T; ++k) tok[k] = int32_t((k * 5) % V);
  tok[2] = tok[7] = 4;  // repeated token: its gradient rows must add up
  auto wpe = randn(T * C, 2), dout = randn(B * T * C, 3);
  for (auto [vs, vn] : {std::pair<int64_t, int64_t>{0, V}, {3, 5}})  // full table, then a shard
    for (bool pos : {true, false})
      for (int threads : {1, 2}) {
        auto wte = randn(vn * C, 1);
        std::vector<float> out(B * T * C), dwte(vn * C, 0.25f), dwpe(T * C, 0.25f);
        const float* wp = pos ? wpe.data() : nullptr;
        embedding_forward(out.data(), tok.data(), wte.data(), wp, B, T, C, vs, vn, threads);
        embedding_backward(dwte.data(), pos ? dwpe.data() : nullptr, dout.data(), tok.data(), B,
                           T, C, vs, vn, threads);
        std::vector<double> wout(B * T * C, 0.0), wdwte(vn * C, 0.25), wdwpe(T * C, 0.25);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t) {
            const int64_t r = tok[b * T + t] - vs;
            const bool own = r >= 0 && r < vn;
            for (int64_t c = 0; c < C; ++c) {
              const double d = dout[(b * T + t) * C + c];
              wout[(b * T + t) * C + c] = (own ? wte[r * C + c] : 0.0) + (pos ? wpe[t * C + c] : 0.0);
              if (own) wdwte[r * C + c] += d;
              if (pos) wdwpe[t * C + c] += d;
            }
          }
        EXPECT_TRUE(all_close(out, wout, 1e-6, 1e-6));
        EXPECT_TRUE(all_close(dwte, wdwte, 1e-6, 1e-6)) << "shard " << vs << " pos " << pos;
        if (pos) {
          EXPECT_TRUE(all_close(dwpe, wdwpe, 1e-6, 1e-6));
        }
      }
}

// ---- extreme logits ----
TEST(CrossEntropy, LargeLogitsStayFinite) {
  // Logits of +-1e4 would overflow exp() without the max subtraction; the loss is then
  // known: row 0 targets the max (loss = log(1 + e^-2e4 + 298 e^-1e4) = 0), row 1 a logit
  // 2e4 below it (loss 2e4; float spacing there is 0.002, so 0.01 absolute).
  const int64_t N = 2, V = 300;
  std::vector<float> logits(N * V, 0.0f);
  logits[0 * V + 7] = 1e4f;
  logits[0 * V + 8] = -1e4f;
  logits[1 * V + 7] = 1e4f;
  logits[1 * V + 9] = -1e4f;
  std::vector<int32_t> tg = {7, 9};
  std::vector<float> loss(N), lse(N), dl = {1.0f, 1.0f};
  crossentropy_forward(loss.data(), lse.data(), logits.data(), tg.data(), N, V, 1);
  EXPECT_NEAR(loss[0], 0.0f, 1e-3f);
  EXPECT_NEAR(loss[1], 2e4f, 0.01f);
  crossentropy_backward_inplace(logits.data(), lse.data(), tg.data(), dl.data(), N, V, 1);
  for (float g : logits) EXPECT_TRUE(std::isfinite(g));
  EXPECT_NEAR(logits[0 * V + 7], 0.0f, 1e-6f);   // p = 1 at the target: 1 - 1
  EXPECT_NEAR(logits[1 * V + 7], 1.0f, 1e-6f);   // all mass on the max, not the target
  EXPECT_NEAR(logits[1 * V + 9], -1.0f, 1e-6f);  // p = 0 at the target: 0 - 1
}
