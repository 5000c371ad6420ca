#include "meshtrain/parallel/tensor/cnn_tp.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/kernels/layout.h"
#include "meshtrain/nn/conv.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/parallel/tensor/tp_regions.h"

namespace meshtrain::parallel {

namespace {

using model::Channels;
using model::ConvDef;

// (N, C, H, W) activations whose channels lie rank-major over the group: the gathered buffer is
// (p, N, C/p, H, W); the whole tensor (N, C, H, W). Copies between the two. The same copies serve
// the blocked layout nChw{B}c (kernels/layout.h) when B divides C/p: a sample's share of one rank
// is then whole channel blocks, contiguous, at the offset NCHW puts it.
void rank_major_to_channels(float* full, const float* gathered, int p, int64_t N, int64_t Cl, int64_t HW) {
  const int64_t block = Cl * HW;
  for (int r = 0; r < p; ++r)
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(full + (n * p + r) * block, gathered + (r * N + n) * block, static_cast<size_t>(block) * sizeof(float));
}

// This rank's channels [r Cl, (r+1) Cl) of a whole (N, C, H, W) tensor.
Tensor own_channels(const Tensor& full, int r, int p) {
  const int64_t N = full.dim(0), C = full.dim(1), HW = full.dim(2) * full.dim(3), Cl = C / p;
  Tensor out = Tensor::empty({N, Cl, full.dim(2), full.dim(3)});
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(out.data() + n * Cl * HW, full.data() + (n * C + r * Cl) * HW, static_cast<size_t>(Cl * HW) * sizeof(float));
  return out;
}

nn::Conv2dOptions conv_options(const ConvDef& d, nn::ShardSpec weight, nn::ShardSpec bias) {
  return {.stride = d.stride, .padding = d.padding, .bias = d.bias, .seed = d.seed, .weight_shard = weight,
          .bias_shard = bias, .input_grad = d.input_grad, .in_block = d.in_block, .out_block = d.out_block};
}

// Filter split: this rank's output channels from the whole input. `gather`: the output leaves
// whole (all-gathered along channels); otherwise split, for a channel-split layer after it.
class FilterConv : public nn::Conv2d {
 public:
  FilterConv(const ConvDef& d, std::shared_ptr<comm::Communicator> tp, bool gather)
      : nn::Conv2d(d.name, d.in, d.out, d.kernel,
                   conv_options(d, nn::ShardSpec::split(0, tp->rank(), tp->size()),
                                nn::ShardSpec::split(0, tp->rank(), tp->size()))),
        tp_(std::move(tp)), gather_(gather), input_grad_(d.input_grad) {}

  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    Tensor y = nn::Conv2d::forward(ctx, x);
    if (!gather_) return y;
    const int p = tp_->size();
    Tensor gathered = Tensor::empty({p * y.numel()});
    tp_->all_gather(std::span<const float>(y.data(), static_cast<size_t>(y.numel())),
                    std::span<float>(gathered.data(), static_cast<size_t>(gathered.numel())),
                    {.algorithm = kTPAlgorithm});
    Tensor full = Tensor::empty({y.dim(0), y.dim(1) * p, y.dim(2), y.dim(3)});
    rank_major_to_channels(full.data(), gathered.data(), p, y.dim(0), y.dim(1), y.dim(2) * y.dim(3));
    return full;
  }

  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    Tensor d = gather_ ? own_channels(dy, tp_->rank(), tp_->size()) : dy;
    Tensor dx = nn::Conv2d::backward(ctx, d);
    // Each rank's dx is its filters' share of the input's gradient: summed over the group.
    if (input_grad_) CopyToTP::backward(*tp_, dx);
    return dx;
  }

 private:
  std::shared_ptr<comm::Communicator> tp_;
  bool gather_, input_grad_;
};

// Channel split: this rank's input channels, a partial sum of every output channel, summed over
// the group. A bias (replicated) is added once, after the sum.
class ChannelConv : public nn::Conv2d {
 public:
  ChannelConv(const ConvDef& d, std::shared_ptr<comm::Communicator> tp)
      : nn::Conv2d(d.name, d.in, d.out, d.kernel,
                   conv_options(d, nn::ShardSpec::split(1, tp->rank(), tp->size()), {})),
        tp_(std::move(tp)) {
    add_bias_in_forward = false;
  }

  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    Tensor y = ReduceFromTP::forward(*tp_, nn::Conv2d::forward(ctx, x));
    if (has_bias) {
      const int64_t N = y.dim(0), C = y.dim(1), HW = y.dim(2) * y.dim(3);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const float b = bias.value[c];
          for (int64_t i = 0; i < HW; ++i) y.data()[kernels::activation_offset(n, c, i, C, HW, out_block)] += b;
        }
    }
    return y;
  }
  // Backward: the whole dy (equal on every rank) gives this rank's input channels' gradient, its
  // weight shard's and the whole bias's; no communication (ReduceFromTP's backward is identity).

 private:
  std::shared_ptr<comm::Communicator> tp_;
};

class TPLayout : public model::CNNLayout {
 public:
  explicit TPLayout(std::shared_ptr<comm::Communicator> tp) : tp_(std::move(tp)) {}

  std::unique_ptr<nn::Layer> conv(const ConvDef& d) const override {
    if (d.input == Channels::split && d.output == Channels::split)
      throw std::invalid_argument(d.name + ": a convolution cannot take split channels and leave them split");
    if (d.input == Channels::split) return std::make_unique<ChannelConv>(d, tp_);
    if (d.output == Channels::full && !model::filter_split_pays(d.in, d.out, d.kernel, d.stride, d.input_grad, tp_->size()))
      return model::CNNLayout::conv(d);  // replicated: the split would move more than it saves
    return std::make_unique<FilterConv>(d, tp_, /*gather=*/d.output == Channels::full);
  }

  // A linear pair is Megatron's: column (output features split), then row (input features
  // split, partial outputs all-reduced); an unpaired linear layer is replicated.
  std::unique_ptr<nn::Layer> linear(const model::LinearDef& d) const override {
    if (d.input == Channels::split && d.output == Channels::split)
      throw std::invalid_argument(d.name + ": a linear layer cannot take split features and leave them split");
    const ParallelLinearOptions o{.bias = d.bias, .init_std = d.init_std, .seed = d.seed};
    if (d.output == Channels::split) return std::make_unique<ColumnParallelLinear>(d.name, d.in, d.out, tp_, o);
    if (d.input == Channels::split) return std::make_unique<RowParallelLinear>(d.name, d.in, d.out, tp_, o);
    return model::CNNLayout::linear(d);
  }

  std::unique_ptr<nn::BatchNorm2d> batch_norm(const std::string& name, int64_t channels, Channels c) const override {
    nn::BatchNormOptions o;
    if (c == Channels::split) o.shard = nn::ShardSpec::split(0, tp_->rank(), tp_->size());
    return std::make_unique<nn::BatchNorm2d>(name, channels, o);
  }

  std::string describe() const override {
    return "convolutions split by filters and channels over tp " + std::to_string(tp_->size());
  }
  // The single rank's block where every rank's share of the channels is whole blocks: the
  // gathers and splits above then copy blocks as they copy NCHW planes, and no convolution
  // converts. Otherwise NCHW.
  int activation_block(int64_t channels) const override {
    const int b = model::CNNLayout::activation_block(channels);
    return b > 0 && channels % (static_cast<int64_t>(b) * tp_->size()) == 0 ? b : 0;
  }
  Shape split_share(const Shape& s) const override {
    Shape out = s;
    out[0] /= tp_->size();
    return out;
  }

 private:
  std::shared_ptr<comm::Communicator> tp_;
};

// The convolutions and linear layers of `cfg` as its builders define them, in order.
class RecordingLayout : public model::CNNLayout {
 public:
  std::unique_ptr<nn::Layer> conv(const ConvDef& d) const override {
    defs.push_back(d);
    return model::CNNLayout::conv(d);
  }
  std::unique_ptr<nn::Layer> linear(const model::LinearDef& d) const override {
    linears.push_back(d);
    return model::CNNLayout::linear(d);
  }
  mutable std::vector<ConvDef> defs;
  mutable std::vector<model::LinearDef> linears;
};

// A convolution every rank of tp runs whole (TPLayout::conv).
bool replicated(const ConvDef& d, int tp) {
  return d.input == Channels::full && d.output == Channels::full &&
         !model::filter_split_pays(d.in, d.out, d.kernel, d.stride, d.input_grad, tp);
}

RecordingLayout recorded(const model::CNNConfig& cfg) {
  RecordingLayout rec;
  model::build_cnn_units(cfg, 0, rec);
  return rec;
}


}  // namespace

void validate_cnn_tp(const model::CNNConfig& cfg, int tp) {
  if (tp < 1) throw std::invalid_argument("--tp must be at least 1");
  if (tp == 1) return;
  // Every channel count a split cuts: a filter split's outputs, a channel split's inputs.
  int64_t g = 0;
  std::string first_bad;
  const RecordingLayout rec = recorded(cfg);
  std::string what = "convolutions";
  for (const ConvDef& d : rec.defs) {
    if (replicated(d, tp)) continue;
    const int64_t n = d.input == Channels::split ? d.in : d.out;
    g = std::gcd(g, n);
    if (first_bad.empty() && n % tp != 0)
      first_bad = d.name + " (" + std::to_string(n) + (d.input == Channels::split ? " input" : " output") + " channels)";
  }
  for (const model::LinearDef& d : rec.linears) {
    if (d.output != Channels::split) continue;  // a pair's column layer splits its output features
    g = std::gcd(g, d.out);
    if (first_bad.empty() && d.out % tp != 0) {
      first_bad = d.name + " (" + std::to_string(d.out) + " output features)";
      what = "linear layers";
    }
  }
  if (first_bad.empty()) return;
  std::string ok;
  for (int64_t t = 2; t <= g; ++t)
    if (g % t == 0) ok += (ok.empty() ? "" : ", ") + std::to_string(t);
  throw std::invalid_argument("--tp " + std::to_string(tp) + " cannot split " + cfg.name + "'s " + what + ": " +
                              first_bad + " do not divide by " + std::to_string(tp) + "; --tp " + ok +
                              " divide every split channel count");
}

std::shared_ptr<const model::CNNLayout> cnn_tp_layout(std::shared_ptr<comm::Communicator> tp) {
  return std::make_shared<TPLayout>(std::move(tp));
}

uint64_t cnn_tp_bytes_per_microbatch(const model::CNNConfig& cfg, int tp, int64_t rows) {
  if (tp < 2) return 0;
  const double p = tp, share = (p - 1) / p;
  double floats = 0;
  const RecordingLayout rec = recorded(cfg);
  for (const model::LinearDef& d : rec.linears) {
    if (d.output == Channels::split) floats += 2 * share * static_cast<double>(rows * d.in);  // column: dx's all-reduce
    if (d.input == Channels::split) floats += 2 * share * static_cast<double>(rows * d.out);  // row: y's all-reduce
  }
  for (const ConvDef& d : rec.defs) {
    if (replicated(d, tp)) continue;
    const double oh = static_cast<double>((d.height + 2 * d.padding - d.kernel) / d.stride + 1);
    const double ow = static_cast<double>((d.width + 2 * d.padding - d.kernel) / d.stride + 1);
    const double x = static_cast<double>(rows * d.in * d.height * d.width), y = rows * d.out * oh * ow;
    if (d.input == Channels::split) {
      floats += 2 * share * y;  // forward: the partial outputs' all-reduce
      continue;
    }
    if (d.output == Channels::full) floats += share * y;  // forward: all-gather along channels
    if (d.input_grad) floats += 2 * share * x;             // backward: dx's all-reduce
  }
  return static_cast<uint64_t>(floats * sizeof(float) + 0.5);
}

}  // namespace meshtrain::parallel
