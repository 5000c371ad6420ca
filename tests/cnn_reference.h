// Float64 references of the CNN layers, written as the definitions read (direct loops, no
// tricks), for tests/kernels and tests/nn; and the strict gradient check built on them:
// central differences of the reference objective L = sum(y * R) in float64 for EVERY element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/kernels/conv.h"
#include "meshtrain/kernels/pool.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::testing::ref {

using Vec = std::vector<double>;

inline Vec to_double(const Tensor& t) { return Vec(t.data(), t.data() + t.numel()); }
inline Vec to_double(const float* p, int64_t n) { return Vec(p, p + n); }

// ---- convolution ----
// y(N, OC, OH, OW); b empty: no bias.
inline Vec conv2d(const Vec& x, const Vec& w, const Vec& b, const kernels::Conv2dShape& s) {
  const int64_t OH = s.OH(), OW = s.OW();
  Vec y(static_cast<size_t>(s.N * s.OC * OH * OW));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.OC; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b.empty() ? 0.0 : b[o];
          for (int64_t c = 0; c < s.IC; ++c)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t h = oh * s.stride_h - s.pad_h + kh, v = ow * s.stride_w - s.pad_w + kw;
                if (h < 0 || h >= s.H || v < 0 || v >= s.W) continue;
                acc += x[((n * s.IC + c) * s.H + h) * s.W + v] * w[((o * s.IC + c) * s.KH + kh) * s.KW + kw];
              }
          y[((n * s.OC + o) * OH + oh) * OW + ow] = acc;
        }
  return y;
}

// The analytic gradients of conv2d in float64 (for shapes too large for finite differences):
// dx = sum over the windows that read x of dy * w; dw = sum of dy * x; db = sum of dy.
inline void conv2d_backward(Vec& dx, Vec& dw, Vec& db, const Vec& dy, const Vec& x, const Vec& w,
                            const kernels::Conv2dShape& s) {
  const int64_t OH = s.OH(), OW = s.OW();
  dx.assign(static_cast<size_t>(s.N * s.IC * s.H * s.W), 0.0);
  dw.assign(static_cast<size_t>(s.OC * s.IC * s.KH * s.KW), 0.0);
  db.assign(static_cast<size_t>(s.OC), 0.0);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.OC; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const double g = dy[((n * s.OC + o) * OH + oh) * OW + ow];
          db[o] += g;
          for (int64_t c = 0; c < s.IC; ++c)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t h = oh * s.stride_h - s.pad_h + kh, v = ow * s.stride_w - s.pad_w + kw;
                if (h < 0 || h >= s.H || v < 0 || v >= s.W) continue;
                const int64_t xi = ((n * s.IC + c) * s.H + h) * s.W + v, wi = ((o * s.IC + c) * s.KH + kh) * s.KW + kw;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
}

// ---- pooling ----
inline Vec maxpool2d(const Vec& x, const kernels::Pool2dShape& s) {
  const int64_t OH = s.OH(), OW = s.OW();
  Vec y(static_cast<size_t>(s.N * s.C * OH * OW));
  for (int64_t p = 0; p < s.N * s.C; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < s.KH; ++i)
          for (int64_t j = 0; j < s.KW; ++j) {
            const int64_t h = oh * s.stride_h - s.pad_h + i, v = ow * s.stride_w - s.pad_w + j;
            if (h >= 0 && h < s.H && v >= 0 && v < s.W) m = std::max(m, x[(p * s.H + h) * s.W + v]);
          }
        y[(p * OH + oh) * OW + ow] = m;
      }
  return y;
}

inline Vec avgpool2d(const Vec& x, const kernels::Pool2dShape& s, bool count_include_pad) {
  const int64_t OH = s.OH(), OW = s.OW();
  Vec y(static_cast<size_t>(s.N * s.C * OH * OW));
  for (int64_t p = 0; p < s.N * s.C; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double sum = 0;
        int64_t inside = 0;
        for (int64_t i = 0; i < s.KH; ++i)
          for (int64_t j = 0; j < s.KW; ++j) {
            const int64_t h = oh * s.stride_h - s.pad_h + i, v = ow * s.stride_w - s.pad_w + j;
            if (h >= 0 && h < s.H && v >= 0 && v < s.W) sum += x[(p * s.H + h) * s.W + v], ++inside;
          }
        y[(p * OH + oh) * OW + ow] = sum / static_cast<double>(count_include_pad ? s.KH * s.KW : inside);
      }
  return y;
}

// ---- batch norm ----
// Training: batch statistics over (N, HW) per channel, biased variance.
inline Vec batchnorm_train(const Vec& x, const Vec& w, const Vec& b, int64_t N, int64_t C, int64_t HW,
                           double eps = 1e-5) {
  Vec y(x.size());
  const double M = static_cast<double>(N * HW);
  for (int64_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) mean += x[(n * C + c) * HW + i];
    mean /= M;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) var += (x[(n * C + c) * HW + i] - mean) * (x[(n * C + c) * HW + i] - mean);
    var /= M;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const size_t k = static_cast<size_t>((n * C + c) * HW + i);
        y[k] = (x[k] - mean) / std::sqrt(var + eps) * w[c] + b[c];
      }
  }
  return y;
}

inline Vec batchnorm_eval(const Vec& x, const Vec& w, const Vec& b, const Vec& rmean, const Vec& rvar, int64_t N,
                          int64_t C, int64_t HW, double eps = 1e-5) {
  Vec y(x.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) {
        const size_t k = static_cast<size_t>((n * C + c) * HW + i);
        y[k] = (x[k] - rmean[c]) / std::sqrt(rvar[c] + eps) * w[c] + b[c];
      }
  return y;
}

// ---- the strict gradient check ----
inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// dL/dv[i] for every i by central differences of `objective` (which reads v), step h.
inline Vec numeric_gradient(Vec& v, const std::function<double()>& objective, double h) {
  Vec g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double orig = v[i];
    v[i] = orig + h;
    const double fp = objective();
    v[i] = orig - h;
    const double fm = objective();
    v[i] = orig;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// Every |got[i] - want[i]| <= tol * max(1, |want[i]|); on failure names the worst element.
inline ::testing::AssertionResult close_elementwise(const float* got, const Vec& want, double tol) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double excess = std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(want[i]));
    if (std::isnan(excess) || excess > worst) worst = std::isnan(excess) ? 1e300 : excess, at = i;
  }
  if (worst <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << " of " << want.size() << ": got " << got[at]
                                       << ", want " << want[at] << " (scaled error " << worst << " > " << tol
                                       << ")";
}
inline ::testing::AssertionResult close_elementwise(const Tensor& got, const Vec& want, double tol) {
  if (got.numel() != static_cast<int64_t>(want.size()))
    return ::testing::AssertionFailure() << "size " << got.numel() << " vs " << want.size();
  return close_elementwise(got.data(), want, tol);
}

// Every |got[i] - want[i]| <= tol * max(1, rms(want)): for elements that are long sums, whose
// float32 round-off scales with the size of the terms rather than with the (possibly
// cancelled) value.
inline ::testing::AssertionResult close_scaled(const float* got, const Vec& want, double tol) {
  double sq = 0;
  for (double w : want) sq += w * w;
  const double scale = std::max(1.0, std::sqrt(sq / static_cast<double>(std::max<size_t>(1, want.size()))));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]);
    if (std::isnan(e) || e > worst) worst = std::isnan(e) ? 1e300 : e, at = i;
  }
  if (worst <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << " of " << want.size() << ": got " << got[at]
                                       << ", want " << want[at] << " (error " << worst << " > " << tol << " * "
                                       << scale << ")";
}

// Largest |got - want| (forward checks).
inline double max_abs_error(const Tensor& got, const Vec& want) {
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i) m = std::max(m, std::fabs(got[static_cast<int64_t>(i)] - want[i]));
  return m;
}

}  // namespace meshtrain::testing::ref
