#include "meshtrain/model/cnn_layout.h"

#include <stdexcept>
#include <string>

#include "meshtrain/kernels/layout.h"
#include "meshtrain/nn/conv.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/nn/shape.h"

namespace meshtrain::model {

// ---- LayerSequence ----

Tensor LayerSequence::forward(nn::Context& ctx, const Tensor& x) {
  Tensor y = x;
  for (auto& l : layers_) y = l->forward(ctx, y);
  return y;
}

Tensor LayerSequence::backward(nn::Context& ctx, const Tensor& dy) {
  Tensor d = dy;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) d = (*it)->backward(ctx, d);
  return d;
}

void LayerSequence::collect_params(std::vector<nn::Param*>& out) {
  for (auto& l : layers_) l->collect_params(out);
}

void LayerSequence::collect_buffers(std::vector<nn::Param*>& out) {
  for (auto& l : layers_) l->collect_buffers(out);
}

// ---- the single-rank layout ----

std::unique_ptr<nn::Layer> CNNLayout::conv(const ConvDef& d) const {
  return std::make_unique<nn::Conv2d>(
      d.name, d.in, d.out, d.kernel,
      nn::Conv2dOptions{.stride = d.stride, .padding = d.padding, .bias = d.bias, .seed = d.seed,
                        .input_grad = d.input_grad, .in_block = d.in_block, .out_block = d.out_block});
}

std::unique_ptr<nn::Layer> CNNLayout::linear(const LinearDef& d) const {
  return std::make_unique<nn::Linear>(d.name, d.in, d.out,
                                      nn::LinearOptions{.bias = d.bias, .init_std = d.init_std, .seed = d.seed});
}

std::unique_ptr<nn::BatchNorm2d> CNNLayout::batch_norm(const std::string& name, int64_t channels, Channels) const {
  return std::make_unique<nn::BatchNorm2d>(name, channels);
}

std::unique_ptr<nn::Layer> CNNLayout::max_pool(int64_t kernel, const Shape&, const nn::Pool2dOptions& opt) const {
  return std::make_unique<nn::MaxPool2d>(kernel, opt);
}

std::unique_ptr<nn::Layer> CNNLayout::avg_pool(int64_t kernel, const Shape&, const nn::Pool2dOptions& opt) const {
  return std::make_unique<nn::AvgPool2d>(kernel, opt);
}

std::unique_ptr<nn::Layer> CNNLayout::global_pool(const Shape&, int block) const {
  return std::make_unique<nn::GlobalAvgPool>(block);
}

bool filter_split_pays(int64_t in, int64_t out, int64_t kernel, int64_t stride, bool input_grad, int p) {
  if (p < 2) return false;
  const double share = static_cast<double>(p - 1) / p;
  // Per output value: the FLOPs of each pass, and the floats a rank sends (its gather share, and
  // the input gradient's all-reduce over the input values behind one output value).
  const double passes = input_grad ? 3 : 2;
  const double saved = share * passes * 2.0 * static_cast<double>(in * kernel * kernel);
  const double in_per_out = static_cast<double>(in * stride * stride) / static_cast<double>(out);
  const double bytes = 4.0 * share * (1.0 + (input_grad ? 2.0 * in_per_out : 0.0));
  return saved >= kFilterSplitFlopsPerByte * bytes;
}

int CNNLayout::activation_block(int64_t channels) const {
  const int b = kernels::conv_activation_block();
  return b > 0 && channels % b == 0 ? b : 0;
}

Tensor BranchJoin::input_grad_exact(nn::Context&, std::vector<double> sum, const Shape& shape) {
  Tensor dx = Tensor::empty(shape);
  if (static_cast<int64_t>(sum.size()) != dx.numel())
    throw std::logic_error("branch join: an exact input gradient of " + std::to_string(sum.size()) +
                           " values for a tensor of " + std::to_string(dx.numel()));
  for (int64_t i = 0; i < dx.numel(); ++i) dx[i] = static_cast<float>(sum[static_cast<size_t>(i)]);
  return dx;
}

namespace {
// Every branch on this rank: the plain concatenation.
class ConcatJoin : public BranchJoin {
 public:
  Tensor forward(nn::Context& ctx, std::span<const Tensor> outs) override { return concat_.forward(ctx, outs); }
  std::vector<Tensor> backward(nn::Context& ctx, const Tensor& dy) override { return concat_.backward(ctx, dy); }
  Tensor input_grad(nn::Context&, Tensor dx) override { return dx; }

 private:
  nn::ConcatChannels concat_;
};
}  // namespace

std::unique_ptr<BranchJoin> CNNLayout::branch_join(const std::vector<int64_t>&, const std::vector<bool>&) const {
  return std::make_unique<ConcatJoin>();
}

std::shared_ptr<const CNNLayout> single_rank_cnn_layout() {
  static const auto layout = std::make_shared<const CNNLayout>();
  return layout;
}

}  // namespace meshtrain::model
