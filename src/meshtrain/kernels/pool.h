// Pooling over NCHW activations, window by window on each (n, c) plane, as PyTorch's
// MaxPool2d / AvgPool2d (ceil_mode false) and AdaptiveAvgPool2d(1) compute it:
//   max:     out(n, c, oh, ow) = max of inp(n, c, oh*SH - PH + i, ow*SW - PW + j) over the
//            window's positions inside the image (padding never wins); argmax saves where.
//   average: out = sum over the window's positions inside the image / divisor, the divisor
//            KH*KW (count_include_pad, PyTorch's default: padding counts as zeros) or the
//            number of positions inside the image.
//   global average: out(n, c) = mean of inp(n, c, :, :).
// Backward writes dinp (=): each output gradient goes back to its argmax (max) or, divided by
// the divisor, to every position of its window (average); windows that overlap add up.
// OH = (H + 2 PH - KH) / SH + 1 (floor), likewise OW; PH <= KH / 2 and PW <= KW / 2 (as
// PyTorch requires), so every window holds at least one position of the image.
// Ties in a max window go to the first position in row-major order; a NaN wins (propagates;
// of two NaNs the later one, as PyTorch's CPU kernel).
// Planes are split over the `threads` budget; each output is computed by one thread in a fixed
// order, so results do not depend on the budget.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

struct Pool2dShape {
  int64_t N = 1, C = 1, H = 1, W = 1;  // input (N, C, H, W)
  int64_t KH = 1, KW = 1;              // window
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;

  int64_t OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int64_t OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  // Throws std::invalid_argument naming the field when a size is not positive or a padding is
  // negative or more than half its window.
  void validate() const;
};

// ---- max ----
// argmax (N, C, OH, OW): the flat index h * W + w of the winning input in its plane; may be
// null (evaluation: nothing saved for backward).
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, const Pool2dShape& s, int threads);
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, const Pool2dShape& s,
                        int threads);

// ---- average ----
void avgpool2d_forward(float* out, const float* inp, const Pool2dShape& s, bool count_include_pad,
                       int threads);
void avgpool2d_backward(float* dinp, const float* dout, const Pool2dShape& s, bool count_include_pad,
                        int threads);

// ---- global average ----
// inp (NC, HW) -> out (NC); backward spreads dout(i) / HW over row i.
void global_avgpool_forward(float* out, const float* inp, int64_t NC, int64_t HW, int threads);
void global_avgpool_backward(float* dinp, const float* dout, int64_t NC, int64_t HW, int threads);
// The same over inp (N, C, HW) in the blocked layout nChw{block}c (kernels/layout.h; block 8 or
// 16, dividing C): out (N, C) holds the same values as the NCHW kernel gives (each channel
// summed position by position in the same order).
void global_avgpool_blocked_forward(float* out, const float* inp, int64_t N, int64_t C, int64_t HW, int block,
                                    int threads);
void global_avgpool_blocked_backward(float* dinp, const float* dout, int64_t N, int64_t C, int64_t HW, int block,
                                     int threads);

}  // namespace meshtrain::kernels
