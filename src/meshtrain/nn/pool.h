// Pooling layers over NCHW tensors (kernels/pool.h: the computation and its limits): no
// parameters; backward writes the input gradient.
//   MaxPool2d(K, stride, padding):    (N, C, H, W) -> (N, C, OH, OW); saves the argmax of every
//                                      window (int32, in a tensor's storage) and the input shape.
//   AvgPool2d(K, stride, padding):    the same shapes; count_include_pad as PyTorch (default
//                                      true: padding counts in the divisor); saves the shape.
//   GlobalAvgPool(block):             (N, C, H, W) -> (N, C, 1, 1), PyTorch's
//                                      AdaptiveAvgPool2d(1); saves the shape. `block`: the
//                                      input's layout (kernels/layout.h; 0 NCHW); the output
//                                      (one value a channel) is the same in every layout.
// OH = (H + 2 padding - K) / stride + 1 (floor, PyTorch's ceil_mode false); padding <= K / 2.
// stride 0 means stride = K (PyTorch's default). An evaluation Context saves nothing.
#pragma once

#include "meshtrain/kernels/pool.h"
#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

struct Pool2dOptions {
  int64_t stride = 0;  // 0: the kernel size
  int64_t padding = 0;
  bool count_include_pad = true;  // AvgPool2d only
};

class MaxPool2d : public Layer {
 public:
  explicit MaxPool2d(int64_t kernel, const Pool2dOptions& opt = {});
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
  int64_t kernel, stride, padding;
};

class AvgPool2d : public Layer {
 public:
  explicit AvgPool2d(int64_t kernel, const Pool2dOptions& opt = {});
  Tensor forward(Context& ctx, const Tensor& x) override;
  Tensor backward(Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<Param*>&) override {}
  int64_t kernel, stride, padding;
  bool count_include_pad;
};

class GlobalAvgPool : public Layer {
 public:
  explicit GlobalAvgPool(int block = 0) : block(block) {}
  Tensor forward(Context& ctx, const Tensor& x) override;   // (N, C, H, W) -> (N, C, 1, 1)
  Tensor backward(Context& ctx, const Tensor& dy) override; // (N, C, 1, 1) -> (N, C, H, W)
  void collect_params(std::vector<Param*>&) override {}
  int block;
};

}  // namespace meshtrain::nn
