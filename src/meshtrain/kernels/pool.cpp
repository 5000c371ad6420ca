// Pooling: plain loops over (n, c) planes, one plane per iteration of an OpenMP loop. A window
// is clipped to the image once ([h0, h1) x [w0, w1)), so the inner loops test nothing.
#include "meshtrain/kernels/pool.h"

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
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, const Pool2dShape& s, int threads) {
  s.validate();
  const int64_t OH = s.OH(), OW = s.OW(), planes = s.N * s.C;
#pragma omp parallel for num_threads(threads) if (parallel : split_planes(s, threads))
  for (int64_t p = 0; p < planes; ++p) {
    const float* x = inp + p * s.H * s.W;  // (H, W)
    float* y = out + p * OH * OW;          // (OH, OW)
    int32_t* am = argmax ? argmax + p * OH * OW : nullptr;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Window w = window(s, oh, ow);
        int64_t best = w.h0 * s.W + w.w0;
        float v = x[best];
        for (int64_t h = w.h0; h < w.h1; ++h)
          for (int64_t c = w.w0; c < w.w1; ++c) {
            const float u = x[h * s.W + c];
            if (u > v || (std::isnan(u) && !std::isnan(v))) v = u, best = h * s.W + c;
          }
        y[oh * OW + ow] = v;
        if (am) am[oh * OW + ow] = static_cast<int32_t>(best);
      }
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

}  // namespace meshtrain::kernels
