// Conv2d: y(N, OC, OH, OW) = conv(x(N, IC, H, W), weight(OC, IC, K, K)) + bias(OC), square
// kernel K, one stride and one padding for both axes, dilation 1, groups 1 (kernels/conv.h:
// the computation, layouts and limits; OH = (H + 2 padding - K) / stride + 1).
// Parameters "<name>.weight" (OC, IC, K, K) and "<name>.bias" (OC), PyTorch's names and
// layouts, so torchvision-style checkpoints map name for name.
//
// Initialisation, PyTorch's default distribution (not its values): weight and bias uniform in
// [-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = IC * K * K (kaiming_uniform_ with a = sqrt(5)
// reduces to that bound), drawn from the counter-based stream (seed, parameter name) at each
// element's global index (nn/param.h), so a shard holds what the full tensor holds there.
// A shard spec on the weight and bias splits the layer over tensor-parallel ranks: along dim 0
// (filters, with the bias along dim 0) each rank computes its own output channels; along dim
// 1 (input channels) each computes a partial sum the caller reduces (and the bias must then
// be added once: set add_bias_in_forward false on all but one rank). The communication lives in
// parallel/, not here.
//
// Gradients: weight and bias accumulate (+=), the input gradient is written; with
// ctx.defer_weight_grads the weight and bias gradients are deferred to the W action (as
// Linear); with ctx.grad_slices every kernel runs slice by slice and the weight and bias
// gradients go to Param::grad_exact (nn/context.h). Convolutions run in float32 whatever
// ctx.precision says.
#pragma once

#include "meshtrain/kernels/conv.h"
#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;  // zeros on each side
  // Rows of zeros above and below where they differ from `padding` (-1: padding). A row band
  // whose halo rows are exchanged pads its columns only (parallel/spatial/cnn_spatial.h).
  int64_t row_padding = -1;
  bool bias = true;
  uint64_t seed = 0;
  ShardSpec weight_shard = {};  // global weight is (OC, IC, K, K)
  ShardSpec bias_shard = {};    // global bias is (OC)
  // false: nothing reads the input's gradient (a model's first layer, on the images), so
  // backward computes none and returns an empty tensor.
  bool input_grad = true;
  // The memory layouts of the input (and its gradient) and of the output (and its gradient):
  // kernels/layout.h, 0 NCHW, B oneDNN's nChw{B}c. A convolution between two layers that take
  // the blocked layout reads and writes it directly, without converting.
  int in_block = 0, out_block = 0;
};

class Conv2d : public Layer {
 public:
  Conv2d(std::string name, int64_t in_channels, int64_t out_channels, int64_t kernel, const Conv2dOptions& opt = {});

  Tensor forward(Context& ctx, const Tensor& x) override;    // (N, IC, H, W) -> (N, OC, OH, OW)
  Tensor backward(Context& ctx, const Tensor& dy) override;  // (N, OC, OH, OW) -> (N, IC, H, W)
  void collect_params(std::vector<Param*>& out) override;

  // The kernel's shape for input x (local channel counts); throws naming the layer when x is
  // not (N, IC, H, W) or the image is smaller than the kernel.
  kernels::Conv2dShape shape_for(const Tensor& x) const;
  int64_t in_local() const { return weight.local_shape()[1]; }
  int64_t out_local() const { return weight.local_shape()[0]; }

  Param weight;  // (OC, IC, K, K), local part
  Param bias;    // (OC), local part; empty when bias = false
  bool has_bias;
  bool add_bias_in_forward = true;
  bool input_grad;
  int in_block, out_block;  // activation layouts, see Conv2dOptions
  int64_t kernel, stride, padding, row_padding;  // row_padding: Conv2dOptions', resolved

 private:
  void add_weight_grads(Context& ctx, const Tensor& x, const Tensor& dy);
};

}  // namespace meshtrain::nn
