// CNNLayout: the layer factory of the convolutional networks (DESIGN decision 8), the CNNs'
// counterpart of GPTLayout. The named CNNs (model/cnn.h) are written once, in terms of what a
// layer *is* (a 3x3 convolution from 32 to 64 channels, a batch norm, a 2x2 max pool, four
// Inception branches joined along channels); the layout decides how each is laid out over the
// mesh's intra-layer group and inserts the communication at its edges. The single-rank layout
// (this file's defaults) builds the plain nn/ layers; parallel/ fills in the others:
//
//   layout                 flag                 what a rank holds and computes
//   single rank            (none)               everything
//   filters / channels     --tp N               a convolution's output channels (filter split) or
//                                               its input channels (channel split), paired as
//                                               column and row are (parallel/tensor/cnn_tp.h)
//   image regions          --spatial N          a band of every feature map's rows, with halos
//                                               exchanged before each window (parallel/spatial/cnn_spatial.h)
//   branches               --branch-parallel N  some of each Inception block's branches
//                                               (parallel/branch/cnn_branch.h)
//
// Channel pairing. A model marks each convolution with how its input arrives and its output
// leaves: `full` (every channel on every rank) or `split` (this rank's share of the channels,
// under a layout that splits channels; the others treat split as full). A filter split of a
// convolution whose output stays split is the column-parallel layer of the transformer; the
// convolution after it takes a channel split (row-parallel), and its partial outputs are summed.
// The batch norm and ReLU between them act per channel and need no communication. Linear layers
// pair the same way (column, then row; a ReLU between them acts on the rank's features). The named
// models keep every unit's input and output full, so pipeline stages, skip connections and the
// classifier never see a split tensor.
//
// Parameters a layout splits carry a shard spec (nn/param.h), so checkpoints hold full tensors
// and a run resumes at any other layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/nn/batchnorm.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/nn/pool.h"

namespace meshtrain::model {

// Layers run one after the other.
class LayerSequence : public nn::Layer {
 public:
  template <class L>
  L* add(std::unique_ptr<L> layer) {
    L* raw = layer.get();
    layers_.push_back(std::move(layer));
    return raw;
  }
  Tensor forward(nn::Context& ctx, const Tensor& x) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy) override;
  void collect_params(std::vector<nn::Param*>& out) override;
  void collect_buffers(std::vector<nn::Param*>& out) override;
  bool empty() const { return layers_.empty(); }

 private:
  std::vector<std::unique_ptr<nn::Layer>> layers_;
};

// How an activation's channels lie over the layout's ranks.
enum class Channels { full, split };

// A convolution as the model defines it: the full (unsplit) channel counts.
struct ConvDef {
  std::string name;  // parameter prefix ("layer1.0.conv1")
  int64_t in = 0, out = 0, kernel = 1, stride = 1, padding = 0;
  int64_t height = 0, width = 0;  // of its input (a sample's feature map)
  bool bias = false;
  uint64_t seed = 0;
  Channels input = Channels::full, output = Channels::full;
  bool input_grad = true;  // false: the model's first layer, whose input (the images) needs no gradient
  // The input's and output's memory layouts (kernels/layout.h), each 0 or what
  // CNNLayout::activation_block gave for its channels.
  int in_block = 0, out_block = 0;
};

// A fully connected layer as the model defines it: the full feature counts, and how its input
// arrives and its output leaves (a pair of linear layers is column then row, as Megatron's).
struct LinearDef {
  std::string name;
  int64_t in = 0, out = 0;
  bool bias = true;
  float init_std = 0.02f;
  uint64_t seed = 0;
  Channels input = Channels::full, output = Channels::full;
};

// The join of parallel branches (an Inception block): forward takes the outputs of the branches
// this rank computes, in branch order, and returns the whole concatenation along channels (every
// channel of every branch); backward takes that tensor's gradient and returns the gradients of
// this rank's branch outputs. input_grad(dx) turns the sum of this rank's branches' input
// gradients into the whole input gradient (the single-rank join: dx itself).
class BranchJoin : public nn::Module {
 public:
  virtual Tensor forward(nn::Context& ctx, std::span<const Tensor> outs) = 0;
  virtual std::vector<Tensor> backward(nn::Context& ctx, const Tensor& dy) = 0;
  virtual Tensor input_grad(nn::Context& ctx, Tensor dx) = 0;
  // The same for exact sums (nn::Context::grad_slices): `sum` is this rank's branches' input
  // gradients added in float64; the whole one (summed over the ranks in float64) is rounded to
  // float32 once, as `shape`. The single-rank join: `sum` rounded.
  virtual Tensor input_grad_exact(nn::Context& ctx, std::vector<double> sum, const Shape& shape);
  void collect_params(std::vector<nn::Param*>&) override {}
};

class CNNLayout {
 public:
  virtual ~CNNLayout() = default;

  // A convolution (no activation, no norm) laid out over the group.
  virtual std::unique_ptr<nn::Layer> conv(const ConvDef& d) const;
  // A fully connected layer (its features laid out as d.input and d.output) laid out over the group.
  virtual std::unique_ptr<nn::Layer> linear(const LinearDef& d) const;
  // A batch norm over `channels` (the full count) of an activation laid out as `c`.
  virtual std::unique_ptr<nn::BatchNorm2d> batch_norm(const std::string& name, int64_t channels, Channels c) const;
  // `in_chw`: the whole (C, H, W) of a sample's input, for layouts that cut it (row bands).
  virtual std::unique_ptr<nn::Layer> max_pool(int64_t kernel, const Shape& in_chw,
                                              const nn::Pool2dOptions& opt = {}) const;
  // The same for an average pool (padding counted in the divisor, PyTorch's default).
  virtual std::unique_ptr<nn::Layer> avg_pool(int64_t kernel, const Shape& in_chw,
                                              const nn::Pool2dOptions& opt = {}) const;
  // (N, C, H, W) -> (N, C, 1, 1), the mean over the whole feature map; `block`: the input's
  // memory layout (activation_block).
  virtual std::unique_ptr<nn::Layer> global_pool(const Shape& in_chw, int block) const;
  // Before a layer that needs the whole feature map of every channel (flatten then linear):
  // null when this rank holds it already.
  virtual std::unique_ptr<nn::Layer> whole_map(const Shape& in_chw) const { return nullptr; }

  // The memory layout (kernels/layout.h) in which a model may keep an activation of `channels`
  // channels between layers that take it (convolutions, batch norms, sums, global pooling):
  // the single-rank layout (also dp's and pp's) the block oneDNN's convolutions run on where it
  // divides the channels, so that no convolution converts its input and output; 0 (NCHW) where
  // it does not. Row bands keep the single rank's layouts (their halos move rows of blocked
  // planes); filter and channel splits keep them where every rank's share is whole blocks (their
  // gathers copy blocks); branches use NCHW (their joins gather NCHW channels). A model asks it
  // per activation and builds its layers with it.
  virtual int activation_block(int64_t channels) const;

  // This rank's part of an activation whose whole per-sample shape is chw (C, H, W): what
  // crosses a pipeline stage boundary. The single-rank layout: all of it.
  virtual Shape local_chw(const Shape& chw) const { return chw; }
  // This rank's share of a per-sample activation (C, H, W) or (F) whose channels or features a
  // pair leaves split (the channel layout: C / ranks); the others: all of it.
  virtual Shape split_share(const Shape& s) const { return s; }
  // The first layer's input: this rank's part of a micro-batch's images (N, C, H, W).
  virtual Tensor input(const Tensor& images) const { return images; }

  // Batch-norm statistics: the reduction each batch norm runs, given the data-parallel one (null:
  // none). A layout that splits a sample over ranks sums over its group first.
  virtual std::function<void(std::span<double>)> stats_reduce(std::function<void(std::span<double>)> dp) const {
    return dp;
  }
  // Runs a unit's backward (`body`): a layout under which the unit's parameter gradients are
  // partial sums over its group reduces them there (and only then reports them ready).
  virtual void unit_backward(nn::Context& ctx, const std::vector<nn::Param*>& params,
                             const std::function<void()>& body) const {
    body();
  }

  // Parallel branches of block `name` with these forward+backward costs (FLOPs per sample): which
  // this rank computes (the others are not built), and the join of their outputs, whose channel
  // counts are `channels`.
  virtual std::vector<bool> branches_here(const std::string& name, const std::vector<double>& costs) const {
    return std::vector<bool>(costs.size(), true);
  }
  virtual std::unique_ptr<BranchJoin> branch_join(const std::vector<int64_t>& channels,
                                                  const std::vector<bool>& here) const;

  // One line for the run's header ("filters and channels over tp 2"); empty for one rank.
  virtual std::string describe() const { return ""; }
};

// The single-rank layout (every default above), shared.
std::shared_ptr<const CNNLayout> single_rank_cnn_layout();

// Whether --tp p splits by filters a convolution whose input and output are both full (not one
// of a pair). Such a split gathers its output along channels and all-reduces its input gradient,
// so it pays only where the convolution does much arithmetic per value it moves: it is split when
// the FLOPs it saves a rank (forward, weights, and data where input_grad) reach
// kFilterSplitFlopsPerByte per byte a rank then sends; otherwise every rank runs it whole
// (replicated, as a transformer's layer norms). A stem on one image channel (9 multiply-adds per
// output value) and a strided 1x1 projection do not pay; a 3x3 convolution of 32 channels does.
// The bound is a machine balance: a core's convolution rate (~200 GFLOP/s here) over the
// threads backend's collective bandwidth (~10-20 GB/s), doubled for the synchronisation.
inline constexpr double kFilterSplitFlopsPerByte = 32;
bool filter_split_pays(int64_t in, int64_t out, int64_t kernel, int64_t stride, bool input_grad, int p);

}  // namespace meshtrain::model
