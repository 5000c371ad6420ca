// 2-D convolution (cross-correlation, as every framework computes it) through oneDNN's
// convolution primitives, on NCHW activations and PyTorch's weight layout:
//   forward:  out(N, OC, OH, OW) = sum over (ic, kh, kw) of
//               inp(n, ic, oh*SH - PH + kh, ow*SW - PW + kw) * weight(oc, ic, kh, kw)  + bias(oc)
//             (input positions outside the image read as zero: padding)
//   backward: dinp(N, IC, H, W) (=), dweight(OC, IC, KH, KW) (+=), dbias(OC) (+=)
// Gradient rule (nn/module.h): parameter gradients accumulate, activation gradients are written.
// OH = (H + 2 PH - KH) / SH + 1 (floor), likewise OW; padding is symmetric; dilation is 1;
// groups are 1. Float32 only (Context::precision bf16 does not reach convolutions yet).
//
// oneDNN picks the memory formats it runs fastest (format_tag::any: blocked nChw16c-style
// activations and blocked weights on AVX-512 machines); each call converts the caller's arrays
// (activations in the layouts the shape names, weights OIHW) into them and the result back, at
// most once per tensor and call, and not at all where the caller's layout is the primitive's
// (activations kept in conv_activation_block()'s layout, kernels/layout.h). The primitives
// and those conversions are built once per (shape, bias, thread budget) and kept in a cache
// per calling thread (ranks are threads; no locking), as kernels/gemm.cpp keeps its matmuls.
//
// `threads` is the call's thread budget, applied as the calling thread's OpenMP setting the
// way kernels/gemm.h describes. Determinism: for a fixed budget a call gives bit-identical
// results every time (tested); under another budget the weight gradient's sums over the
// batch are split differently, so results differ by float32 round-off only.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

struct Conv2dShape {
  int64_t N = 1, IC = 1, H = 1, W = 1;  // input (N, IC, H, W)
  int64_t OC = 1, KH = 1, KW = 1;       // weight (OC, IC, KH, KW)
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;         // zeros added on each side
  // The activations' memory layouts (kernels/layout.h): 0 NCHW, B oneDNN's nChw{B}c. src_block
  // is inp's and dinp's, dst_block out's and dout's; a block must divide its channel count.
  int src_block = 0, dst_block = 0;

  int64_t OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int64_t OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  // Throws std::invalid_argument naming the field when a size is not positive, a padding is
  // negative or the padded image is smaller than the kernel.
  void validate() const;
};

// bias may be null (no bias).
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, int threads);

// Any of dinp, dweight, dbias may be null: that gradient is not computed (dinp null: the input
// needs no gradient; dweight and dbias null: the weight gradient is deferred, split backward).
// inp is read only for dweight/dbias, weight only for dinp.
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, const Conv2dShape& s, int threads);

}  // namespace meshtrain::kernels
