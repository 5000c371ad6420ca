// Memory layouts of (N, C, H, W) activations.
//
//   block 0   NCHW: element (n, c, h, w) at ((n C + c) H + h) W + w.
//   block B   oneDNN's nChw{B}c ("aBcd16b" for B = 16): the channels in groups of B, the B
//             channels of a group innermost: element (n, c, h, w) at
//             (((n C/B + c/B) H + h) W + w) B + c mod B. Needs C divisible by B; then it holds
//             exactly the NCHW elements, permuted.
//
// oneDNN's direct convolutions run on a blocked layout (16 channels on AVX-512 machines, 8 on
// AVX2); a convolution on NCHW tensors converts its input into it and its output back on every
// call, forward and backward. A model whose layers between two convolutions (batch norm, ReLU,
// sums, global pooling) take the blocked layout keeps its activations blocked and skips those
// conversions (model/cnn_layout.h: CNNLayout::activation_block). Layers that do not take it see
// NCHW only.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace meshtrain::kernels {

// The channel block of the layout oneDNN's convolutions choose for activations on this machine
// (asked once, of a 3x3 convolution from 32 to 32 channels): 16, 8, or 0 where they prefer NCHW.
int conv_activation_block();

// Offset of element (n, c, i) of an (N, C, HW) activation (i = h W + w) in layout `block`.
inline int64_t activation_offset(int64_t n, int64_t c, int64_t i, int64_t C, int64_t HW, int block) {
  if (block == 0) return (n * C + c) * HW + i;
  return ((n * (C / block) + c / block) * HW + i) * block + c % block;
}

// Converts between NCHW and layout `block` (out and inp must not overlap). Throws
// std::invalid_argument when block is not 0 and does not divide C.
void to_activation_layout(float* out, const float* nchw, int64_t N, int64_t C, int64_t HW, int block);
void from_activation_layout(float* nchw, const float* inp, int64_t N, int64_t C, int64_t HW, int block);
// Throws std::invalid_argument naming `who` when a layout of block `block` cannot hold C channels.
void check_activation_block(int block, int64_t C, const char* who);

// For the kernels written per block size: calls f.template operator()<B>() with B = block, the
// blocked kernels being instantiated for 8 and 16 (AVX2's and AVX-512's); throws
// std::invalid_argument naming `who` for another block or one that does not divide C.
template <class F>
void with_block(int block, int64_t C, const char* who, F&& f) {
  check_activation_block(block, C, who);
  if (block == 16) return f.template operator()<16>();
  if (block == 8) return f.template operator()<8>();
  throw std::invalid_argument(std::string(who) + ": no kernel for " + std::to_string(block) +
                              "-channel blocks (8 or 16)");
}

}  // namespace meshtrain::kernels
