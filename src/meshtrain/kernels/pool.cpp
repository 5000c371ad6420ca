// Pooling: loops over (n, c) planes, one plane per iteration of an OpenMP loop. A window is
// clipped to the image once ([h0, h1) x [w0, w1)), so the inner loops test nothing. Max pooling
// takes the windows the image does not clip a row at a time, as selects over fixed-count loops
// that the compiler vectorises (the 2x2 and 3x3 windows; a branch per element costs 10-25x
// here: a window's maximum is unpredictable).
#include "meshtrain/kernels/pool.h"
#include "meshtrain/kernels/layout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace meshtrain::kernels {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements of input

// The window of output (oh, ow) clipped to the image.
struct Window {
  int64_t h0, h1, w0, w1;
};

Window window(const Pool2dShape& s, int64_t oh, int64_t ow) {
  const int64_t hs = oh * s.stride_h - s.pad_h, ws = ow * s.stride_w - s.pad_w;
  return {std::max<int64_t>(hs, 0), std::min(hs + s.KH, s.H), std::max<int64_t>(ws, 0), std::min(ws + s.KW, s.W)};
}

float divisor(const Pool2dShape& s, const Window& w, bool count_include_pad) {
  // With floor output sizes and padding at most half the window, a window never reaches past
  // the padded image, so "including padding" is always the full window.
  return count_include_pad ? static_cast<float>(s.KH * s.KW) : static_cast<float>((w.h1 - w.h0) * (w.w1 - w.w0));
}

bool split_planes(const Pool2dShape& s, int threads) { return threads > 1 && s.N * s.C * s.H * s.W > kParallelMin; }

}  // namespace

void Pool2dShape::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("pool2d: " + what);
  };
  need(N >= 0 && C > 0 && H > 0 && W > 0, "input sizes must be positive (N may be 0)");
  need(KH > 0 && KW > 0, "window height and width must be positive");
  need(stride_h > 0 && stride_w > 0, "strides must be positive");
  need(pad_h >= 0 && pad_w >= 0, "paddings must not be negative");
  need(2 * pad_h <= KH && 2 * pad_w <= KW, "padding must be at most half the window (" + std::to_string(KH) +
                                               " x " + std::to_string(KW) + ")");
  need(H + 2 * pad_h >= KH && W + 2 * pad_w >= KW, "the padded image is smaller than the window");
  need(H * W <= INT32_MAX, "a plane of more than 2^31 elements does not fit the int32 argmax");
}

// ---- max ----
namespace {

// The running maximum takes u when it is larger or NaN (PyTorch's rule: a NaN propagates, the
// last NaN of a window is its argmax); ties keep the first position in row-major order. Written
// as selects, without branches, so that a row of windows vectorises.
inline void take_max(float u, int32_t iu, float& v, int32_t& iv) {
  const bool take = (u > v) | (u != u);
  v = take ? u : v;
  iv = take ? iu : iv;
}

// Windows [lo, hi) of one output row whose rows [h, h + kh) and columns [ow * sw - pw, + kw)
// all lie inside the image.
void max_row_any(const float* x, int64_t W, int64_t h, int64_t kh, int64_t kw, int64_t sw, int64_t pw, int64_t lo,
                 int64_t hi, float* y, int32_t* am) {
  for (int64_t ow = lo; ow < hi; ++ow) {
    const int64_t c = h * W + ow * sw - pw;  // the window's top-left position
    float v = x[c];
    int32_t i = static_cast<int32_t>(c);
    for (int64_t a = 0; a < kh; ++a)
      for (int64_t b = a == 0 ? 1 : 0; b < kw; ++b) take_max(x[c + a * W + b], static_cast<int32_t>(c + a * W + b), v, i);
    y[ow] = v;
    if (am) am[ow] = i;
  }
}

// The same for a K x K window at stride S, fixed at compile time, V outputs from ow0: the
// window's rows are K pointers and every loop has a fixed count, so the compiler turns the V
// outputs into vector selects (the window's (0, 0) is compared with itself once more: a tie,
// or its own NaN, keeps it).
template <int K, int S, int V, bool kArgmax>
void max_chunk(const float* const* r, int32_t first, int32_t W32, int64_t ow0, float* __restrict y,
               int32_t* __restrict am) {
  for (int j = 0; j < V; ++j) {
    const int32_t ow = static_cast<int32_t>(ow0) + j;
    float v = r[0][S * ow];
    int32_t i = first + S * ow;
    for (int a = 0; a < K; ++a)
      for (int b = 0; b < K; ++b) take_max(r[a][S * ow + b], first + a * W32 + S * ow + b, v, i);
    y[ow] = v;
    if constexpr (kArgmax) am[ow] = i;
  }
}

// A row in chunks of V outputs, the last chunk ending at `hi` (it overlaps the one before when
// V does not divide the row: those outputs are written twice, the same both times).
template <int K, int S, int V, bool kArgmax>
void max_row_k(const float* x, int64_t W, int64_t h, int64_t pw, int64_t lo, int64_t hi, float* y, int32_t* am) {
  const float* r[K];
  for (int a = 0; a < K; ++a) r[a] = x + (h + a) * W - pw;
  const int32_t first = static_cast<int32_t>(h * W - pw), W32 = static_cast<int32_t>(W);
  for (int64_t ow = lo;; ow += V) {
    ow = std::min(ow, hi - V);
    max_chunk<K, S, V, kArgmax>(r, first, W32, ow, y, am);
    if (ow + V >= hi) break;
  }
}

template <int K, int S>
void max_row(const float* x, int64_t W, int64_t h, int64_t, int64_t, int64_t, int64_t pw, int64_t lo, int64_t hi,
             float* y, int32_t* am) {
  const int64_t n = hi - lo;
  if (n >= 16)
    am ? max_row_k<K, S, 16, true>(x, W, h, pw, lo, hi, y, am) : max_row_k<K, S, 16, false>(x, W, h, pw, lo, hi, y, am);
  else if (n >= 8)
    am ? max_row_k<K, S, 8, true>(x, W, h, pw, lo, hi, y, am) : max_row_k<K, S, 8, false>(x, W, h, pw, lo, hi, y, am);
  else if (n >= 4)
    am ? max_row_k<K, S, 4, true>(x, W, h, pw, lo, hi, y, am) : max_row_k<K, S, 4, false>(x, W, h, pw, lo, hi, y, am);
  else
    max_row_any(x, W, h, K, K, S, pw, lo, hi, y, am);
}

using MaxRow = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*,
                        int32_t*);

MaxRow max_row_for(const Pool2dShape& s) {
  if (s.KH == 2 && s.KW == 2 && s.stride_w == 2) return max_row<2, 2>;
  if (s.KH == 3 && s.KW == 3 && s.stride_w == 1) return max_row<3, 1>;
  if (s.KH == 3 && s.KW == 3 && s.stride_w == 2) return max_row<3, 2>;
  return max_row_any;
}

// One output position whose window the image clips.
template <bool kArgmax>
void max_window(const float* x, const Pool2dShape& s, int64_t oh, int64_t ow, float* y, int32_t* am) {
  const Window w = window(s, oh, ow);
  int32_t best = static_cast<int32_t>(w.h0 * s.W + w.w0);
  float v = x[best];
  for (int64_t h = w.h0; h < w.h1; ++h)
    for (int64_t c = h == w.h0 ? w.w0 + 1 : w.w0; c < w.w1; ++c)
      take_max(x[h * s.W + c], static_cast<int32_t>(h * s.W + c), v, best);
  *y = v;
  if constexpr (kArgmax) *am = best;
}

template <bool kArgmax>
void max_plane(const float* x, float* y, int32_t* am, const Pool2dShape& s, MaxRow row) {
  const int64_t OH = s.OH(), OW = s.OW();
  // Columns whose whole window is inside the image: ow * SW - PW >= 0 and ow * SW - PW + KW <= W.
  const int64_t lo = std::min(OW, (s.pad_w + s.stride_w - 1) / s.stride_w);
  const int64_t hi = std::clamp((s.W + s.pad_w - s.KW) / s.stride_w + 1, lo, OW);
  for (int64_t oh = 0; oh < OH; ++oh) {
    float* yr = y + oh * OW;
    int32_t* ar = kArgmax ? am + oh * OW : nullptr;
    const int64_t h = oh * s.stride_h - s.pad_h;
    const bool rows_inside = h >= 0 && h + s.KH <= s.H;
    for (int64_t ow = 0; ow < OW; ++ow) {
      if (rows_inside && ow == lo && lo < hi) {
        row(x, s.W, h, s.KH, s.KW, s.stride_w, s.pad_w, lo, hi, yr, ar);
        ow = hi - 1;
        continue;
      }
      max_window<kArgmax>(x, s, oh, ow, yr + ow, kArgmax ? ar + ow : nullptr);
    }
  }
}

}  // namespace

void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, const Pool2dShape& s, int threads) {
  s.validate();
  const int64_t OH = s.OH(), OW = s.OW(), planes = s.N * s.C;
  const MaxRow row = max_row_for(s);
#pragma omp parallel for num_threads(threads) if (parallel : split_planes(s, threads))
  for (int64_t p = 0; p < planes; ++p) {
    const float* x = inp + p * s.H * s.W;  // (H, W)
    float* y = out + p * OH * OW;          // (OH, OW)
    if (argmax)
      max_plane<true>(x, y, argmax + p * OH * OW, s, row);
    else
      max_plane<false>(x, y, nullptr, s, row);
  }
}

void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, const Pool2dShape& s,
                        int threads) {
  s.validate();
  const int64_t OH = s.OH(), OW = s.OW(), planes = s.N * s.C;
#pragma omp parallel for num_threads(threads) if (parallel : split_planes(s, threads))
  for (int64_t p = 0; p < planes; ++p) {
    float* dx = dinp + p * s.H * s.W;
    const float* dy = dout + p * OH * OW;
    const int32_t* am = argmax + p * OH * OW;
    std::fill(dx, dx + s.H * s.W, 0.0f);
    for (int64_t o = 0; o < OH * OW; ++o) dx[am[o]] += dy[o];
  }
}

// ---- average ----
void avgpool2d_forward(float* out, const float* inp, const Pool2dShape& s, bool count_include_pad,
                       int threads) {
  s.validate();
  const int64_t OH = s.OH(), OW = s.OW(), planes = s.N * s.C;
#pragma omp parallel for num_threads(threads) if (parallel : split_planes(s, threads))
  for (int64_t p = 0; p < planes; ++p) {
    const float* x = inp + p * s.H * s.W;
    float* y = out + p * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Window w = window(s, oh, ow);
        float sum = 0.0f;
        for (int64_t h = w.h0; h < w.h1; ++h)
          for (int64_t c = w.w0; c < w.w1; ++c) sum += x[h * s.W + c];
        y[oh * OW + ow] = sum / divisor(s, w, count_include_pad);
      }
  }
}

void avgpool2d_backward(float* dinp, const float* dout, const Pool2dShape& s, bool count_include_pad,
                        int threads) {
  s.validate();
  const int64_t OH = s.OH(), OW = s.OW(), planes = s.N * s.C;
#pragma omp parallel for num_threads(threads) if (parallel : split_planes(s, threads))
  for (int64_t p = 0; p < planes; ++p) {
    float* dx = dinp + p * s.H * s.W;
    const float* dy = dout + p * OH * OW;
    std::fill(dx, dx + s.H * s.W, 0.0f);
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Window w = window(s, oh, ow);
        const float g = dy[oh * OW + ow] / divisor(s, w, count_include_pad);
        for (int64_t h = w.h0; h < w.h1; ++h)
          for (int64_t c = w.w0; c < w.w1; ++c) dx[h * s.W + c] += g;
      }
  }
}

// ---- global average ----
void global_avgpool_forward(float* out, const float* inp, int64_t NC, int64_t HW, int threads) {
  if (HW <= 0) throw std::invalid_argument("global_avgpool: the plane must not be empty");
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && NC * HW > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    const float* x = inp + i * HW;
    float sum = 0.0f;
    for (int64_t j = 0; j < HW; ++j) sum += x[j];
    out[i] = sum / static_cast<float>(HW);
  }
}

void global_avgpool_backward(float* dinp, const float* dout, int64_t NC, int64_t HW, int threads) {
  if (HW <= 0) throw std::invalid_argument("global_avgpool: the plane must not be empty");
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && NC * HW > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    const float g = dout[i] / static_cast<float>(HW);
    float* dx = dinp + i * HW;
    for (int64_t j = 0; j < HW; ++j) dx[j] = g;
  }
}

namespace {
template <int B>
void global_avg_blocked(float* out, const float* inp, int64_t N, int64_t C, int64_t HW, int threads) {
  const int64_t CB = C / B;
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && N * C * HW > kParallelMin)
  for (int64_t g = 0; g < N * CB; ++g) {  // g = n CB + cb
    const float* x = inp + g * HW * B;
    float sum[B] = {};
    for (int64_t i = 0; i < HW; ++i)
#pragma omp simd
      for (int j = 0; j < B; ++j) sum[j] += x[i * B + j];
    const int64_t n = g / CB, cb = g % CB;
    for (int j = 0; j < B; ++j) out[n * C + cb * B + j] = sum[j] / static_cast<float>(HW);
  }
}

template <int B>
void global_avg_blocked_backward(float* dinp, const float* dout, int64_t N, int64_t C, int64_t HW, int threads) {
  const int64_t CB = C / B;
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && N * C * HW > kParallelMin)
  for (int64_t g = 0; g < N * CB; ++g) {
    const int64_t n = g / CB, cb = g % CB;
    float v[B];
    for (int j = 0; j < B; ++j) v[j] = dout[n * C + cb * B + j] / static_cast<float>(HW);
    float* dx = dinp + g * HW * B;
    for (int64_t i = 0; i < HW; ++i)
#pragma omp simd
      for (int j = 0; j < B; ++j) dx[i * B + j] = v[j];
  }
}

}  // namespace

void global_avgpool_blocked_forward(float* out, const float* inp, int64_t N, int64_t C, int64_t HW, int block,
                                    int threads) {
  if (HW <= 0) throw std::invalid_argument("global_avgpool: the plane must not be empty");
  with_block(block, C, "global_avgpool",
             [&]<int B>() { global_avg_blocked<B>(out, inp, N, C, HW, threads); });
}

void global_avgpool_blocked_backward(float* dinp, const float* dout, int64_t N, int64_t C, int64_t HW, int block,
                                     int threads) {
  if (HW <= 0) throw std::invalid_argument("global_avgpool: the plane must not be empty");
  with_block(block, C, "global_avgpool",
             [&]<int B>() { global_avg_blocked_backward<B>(dinp, dout, N, C, HW, threads); });
}

}  // namespace meshtrain::kernels
