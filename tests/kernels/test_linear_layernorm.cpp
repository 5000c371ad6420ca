// Linear and LayerNorm against double references; the LayerNorm reference backward is itself
// checked against central finite differences of the reference forward, so the float kernel is
// compared with a gradient that is known to be right.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "meshtrain/kernels/layernorm.h"
#include "meshtrain/kernels/linear.h"

using namespace meshtrain::kernels;
using namespace meshtrain::kernels::testing;

// ---- linear ----
TEST(Linear, ForwardBackwardMatchReference) {
  // Sums of <= 40 products of N(0,1) values in float32: relative error ~1e-6 of |terms|;
  // atol 1e-4 is far below the O(1) error of any indexing mistake.
  for (auto [N, C, OC] : {std::tuple<int64_t, int64_t, int64_t>{1, 3, 5}, {7, 17, 33}, {40, 24, 36}})
    for (int threads : {1, 2}) {
      auto inp = randn(N * C, 1), w = randn(C * OC, 2), bias = randn(OC, 3), dout = randn(N * OC, 4);
      std::vector<float> out(N * OC);
      linear_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC, threads);
      std::vector<double> want(N * OC);
      for (int64_t i = 0; i < N; ++i)
        for (int64_t o = 0; o < OC; ++o) {
          double s = bias[o];
          for (int64_t c = 0; c < C; ++c) s += double(inp[i * C + c]) * w[c * OC + o];
          want[i * OC + o] = s;
        }
      EXPECT_TRUE(all_close(out, want, 1e-5, 1e-4));

      // Gradients: dinp written (start from garbage), dweight/dbias accumulate onto 1.0.
      std::vector<float> dinp(N * C, 123.0f), dw(C * OC, 1.0f), db(OC, 1.0f);
      linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                      OC, threads);
      std::vector<double> wdinp(N * C, 0.0), wdw(C * OC, 1.0), wdb(OC, 1.0);
      for (int64_t i = 0; i < N; ++i)
        for (int64_t o = 0; o < OC; ++o) {
          const double d = dout[i * OC + o];
          wdb[o] += d;
          for (int64_t c = 0; c < C; ++c) {
            wdinp[i * C + c] += d * w[c * OC + o];
            wdw[c * OC + o] += d * inp[i * C + c];
          }
        }
      EXPECT_TRUE(all_close(dinp, wdinp, 1e-5, 1e-4));
      EXPECT_TRUE(all_close(dw, wdw, 1e-5, 1e-4));
      EXPECT_TRUE(all_close(db, wdb, 1e-5, 1e-4));

      // No bias, no dinp.
      linear_forward(out.data(), inp.data(), w.data(), nullptr, N, C, OC, threads);
      for (int64_t i = 0; i < N; ++i)
        for (int64_t o = 0; o < OC; ++o) want[i * OC + o] -= bias[o];
      EXPECT_TRUE(all_close(out, want, 1e-5, 1e-4));
      linear_backward(nullptr, dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC,
                      threads);
    }
}

// ---- layernorm reference ----
namespace {
struct LnRef {
  std::vector<double> out, mean, rstd;
};
LnRef ln_ref(const std::vector<double>& x, const std::vector<double>& w,
             const std::vector<double>& b, int64_t N, int64_t C) {
  LnRef r{std::vector<double>(N * C), std::vector<double>(N), std::vector<double>(N)};
  for (int64_t i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int64_t c = 0; c < C; ++c) r.out[i * C + c] = (x[i * C + c] - m) * rs * w[c] + b[c];
    r.mean[i] = m;
    r.rstd[i] = rs;
  }
  return r;
}
// Written from the chain rule term by term (not the simplified formula the kernel uses).
void ln_ref_backward(std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& db,
                     const std::vector<double>& dy, const std::vector<double>& x,
                     const std::vector<double>& w, int64_t N, int64_t C) {
  auto r = ln_ref(x, w, std::vector<double>(C, 0.0), N, C);
  for (int64_t i = 0; i < N; ++i) {
    const double m = r.mean[i], rs = r.rstd[i];
    // y_c = xhat_c w_c + b_c; dxhat_c = dy_c w_c
    // dvar = sum dxhat_c (x_c - m) * (-1/2) rs^3; dmean = -rs sum dxhat_c
    // dx_c = dxhat_c rs + dvar 2 (x_c - m) / C + dmean / C
    double dvar = 0, dmean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double dxh = dy[i * C + c] * w[c];
      dvar += dxh * (x[i * C + c] - m) * -0.5 * rs * rs * rs;
      dmean += -dxh * rs;
    }
    for (int64_t c = 0; c < C; ++c) {
      const double dxh = dy[i * C + c] * w[c];
      dx[i * C + c] += dxh * rs + dvar * 2 * (x[i * C + c] - m) / C + dmean / C;
      dw[c] += dy[i * C + c] * (x[i * C + c] - m) * rs;
      db[c] += dy[i * C + c];
    }
  }
}
}  // namespace

TEST(LayerNorm, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, C = 7;
  auto x = to_double(randn(N * C, 1)), w = to_double(randn(C, 2)), b = to_double(randn(C, 3));
  auto dy = to_double(randn(N * C, 4));
  std::vector<double> dx(N * C, 0), dw(C, 0), db(C, 0);
  ln_ref_backward(dx, dw, db, dy, x, w, N, C);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    auto r = ln_ref(xx, ww, b, N, C);
    double s = 0;
    for (int64_t k = 0; k < N * C; ++k) s += r.out[k] * dy[k];
    return s;
  };
  const double h = 1e-6;  // central differences in double: error ~h^2 + 1e-16/h ~ 1e-10
  for (int64_t k = 0; k < N * C; ++k) {
    auto xp = x, xm = x;
    xp[k] += h;
    xm[k] -= h;
    EXPECT_NEAR(dx[k], (loss(xp, w) - loss(xm, w)) / (2 * h), 1e-6);
  }
  for (int64_t c = 0; c < C; ++c) {
    auto wp = w, wm = w;
    wp[c] += h;
    wm[c] -= h;
    EXPECT_NEAR(dw[c], (loss(x, wp) - loss(x, wm)) / (2 * h), 1e-6);
  }
}

TEST(LayerNorm, ForwardBackwardMatchReference) {
  // Inputs N(1, 2): a non-zero mean exercises the centring. Float32 row statistics over
  // C <= 100 values: relative error ~1e-6; rtol 1e-4 / atol 1e-4 keeps a margin while any
  // formula error (e.g. missing mean(g xhat) term) is O(0.1).
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 5}, {9, 17}, {64, 100}, {300, 64}})
    for (int threads : {1, 2}) {
      auto xf = randn(N * C, 1, 2.0f);
      for (auto& v : xf) v += 1.0f;
      auto wf = randn(C, 2), bf = randn(C, 3), dyf = randn(N * C, 4);
      std::vector<float> out(N * C), mean(N), rstd(N);
      layernorm_forward(out.data(), mean.data(), rstd.data(), xf.data(), wf.data(), bf.data(), N,
                        C, threads);
      auto r = ln_ref(to_double(xf), to_double(wf), to_double(bf), N, C);
      EXPECT_TRUE(all_close(out, r.out, 1e-4, 1e-4));
      EXPECT_TRUE(all_close(mean, r.mean, 1e-5, 1e-5));
      EXPECT_TRUE(all_close(rstd, r.rstd, 1e-5, 1e-6));

      // All three gradients accumulate: start from 0.5.
      std::vector<float> dx(N * C, 0.5f), dw(C, 0.5f), db(C, 0.5f);
      layernorm_backward(dx.data(), dw.data(), db.data(), dyf.data(), xf.data(), wf.data(),
                         mean.data(), rstd.data(), N, C, threads);
      std::vector<double> wdx(N * C, 0.5), wdw(C, 0.5), wdb(C, 0.5);
      ln_ref_backward(wdx, wdw, wdb, to_double(dyf), to_double(xf), to_double(wf), N, C);
      EXPECT_TRUE(all_close(dx, wdx, 1e-4, 1e-4)) << "N=" << N << " C=" << C;
      EXPECT_TRUE(all_close(dw, wdw, 1e-4, 1e-3)) << "N=" << N << " C=" << C;
      EXPECT_TRUE(all_close(db, wdb, 1e-4, 1e-3)) << "N=" << N << " C=" << C;
    }
}
