// Image classifiers as a model family (model/model.h): a layer graph (model/graph.h), the
// user's or a named model's file (models/*.json), compiled into units of nn/'s layers through
// the layout's layer factory (cnn_layout.h) and cut into pipeline stages between units.
//
// A unit is a piece of the graph with one tensor in and one out (a conv-BN-ReLU-pool block, a
// residual block, an Inception block, the classifier), and at most one more (a skip, graph.h
// unit_skips) that crosses its boundaries when a residual block is cut: the stage keeps that
// tensor while its units run, hands it to the unit that reads it, and sends it to a later stage
// in a portal (nn::Portal) when the block is cut between stages. A stage holds units [first, end), the
// first stage reads the images (N, C, H, W) and the last gives the cross-entropy over the
// classes and the number of correct predictions. The compiler folds a ReLU into the batch norm
// or the sum before it (one pass fewer, the same numbers), builds a concat of branches from one
// source as a block of parallel branches (placed on ranks by the branch layout), pairs
// convolutions for the filter/channel split (graph.h: channel_splits), and keeps oneDNN's
// blocked activations where every layer takes them (graph.h: graph_takes_blocked).
//
// Named models (Fashion-MNIST's 1 x 28 x 28 images, 10 classes; docs/models.md):
//   cnn-small        conv 3x3 32, bn, relu, maxpool 2; conv 3x3 64, bn, relu, maxpool 2;
//                    flatten, fc1 3136 -> 128, relu, fc2 128 -> 10
//   resnet-small     a 3x3 stem of 32, three basic residual blocks of 32, 64 (stride 2) and
//                    128 (stride 2, projection shortcuts), global average pool, fc 128 -> 10
//   inception-small  a 3x3 stem of 32 and a 2x2 max pool, two Inception blocks of four branches
//                    (1x1; 1x1 then 3x3; 1x1 then two 3x3; 3x3 max pool then 1x1), global
//                    average pool, fc -> 10
// Parameter and buffer names are PyTorch state-dict names (conv1.weight (OC, IC, KH, KW),
// bn1.running_mean, layer2.0.downsample.0.weight, ...); fully connected weights are stored
// (in, out) as nn::Linear keeps them (model::torch_layout says which to transpose for PyTorch).
//
// Batch normalisation: each stage's BatchNorm2d layers take a statistics reduction
// (set_batch_stats_reduce) that the trainer points at the data-parallel group, so dp N computes
// the statistics of the whole batch as one rank does (synchronised batch norm); the layout adds
// its own group's where it splits a sample (image regions).
//
// Layouts (cnn_layout.h): the same definitions are built split over the intra-layer group —
// convolutions by filters and channels, feature maps by row bands, Inception blocks by branch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/model/cnn_layout.h"
#include "meshtrain/model/graph.h"
#include "meshtrain/model/model.h"
#include "meshtrain/nn/batchnorm.h"

namespace meshtrain::model {

struct CNNConfig {
  std::string name = "cnn-small";  // the model's name (a named model's, or a user graph's "name")
  // The layer graph (model/graph.h): a named model's file, or the user's.
  std::shared_ptr<const Graph> graph = named_graph("cnn-small");
  int64_t channels = 1, height = 28, width = 28;  // input images
  // The data set's images upsampled this many times each way make the input (a config's
  // "scale": height and width are the data set's times it). Asked for, never inferred.
  int64_t scale = 1;
  int64_t classes = 10;
  int64_t batch = 64;  // recommended global batch
  nlohmann::json to_json() const;
};

// The named CNNs (models/*.json); throws std::invalid_argument listing the names otherwise.
CNNConfig cnn_config(const std::string& name);
// A user's layer graph: its input, classes and batch.
CNNConfig cnn_config(std::shared_ptr<const Graph> graph);
std::vector<std::string> cnn_config_names();

// A unit of a CNN: a layer graph with its own output shape (C, H, W) for an input (C, H, W).
class CNNUnit : public nn::Layer {
 public:
  virtual Shape out_chw(const Shape& in_chw) const = 0;
  // Every batch-norm layer of the unit (for the statistics reduction).
  virtual void collect_batch_norms(std::vector<nn::BatchNorm2d*>& out) = 0;
  // A block of parallel branches (an Inception block): its name and the branches built here,
  // in branch order (all of them under the single-rank layout). Others: empty.
  virtual std::string block_name() const { return ""; }
  virtual std::vector<nn::Layer*> branch_layers() { return {}; }
  // That block's input, (C, H, W) of a sample (the source its branches read).
  virtual Shape branch_input() const { return {}; }
  // A skip across the unit's boundaries (graph.h: unit_skips): the unit reads one made before
  // its input (reads_side), or makes one besides its output that a later unit reads
  // (makes_side). A unit with neither runs forward(ctx, x) and backward(ctx, dy) alone.
  virtual bool reads_side() const { return false; }
  virtual bool makes_side() const { return false; }
  // Forward given the skip it reads (empty: none); the skip it makes goes to *side_out.
  virtual Tensor forward_side(nn::Context& ctx, const Tensor& x, const Tensor& side_in, Tensor* side_out);
  // Backward given the gradient of the skip it makes (empty: none); the gradient of the skip it
  // reads goes to *dside_in.
  virtual Tensor backward_side(nn::Context& ctx, const Tensor& dy, const Tensor& dside_out, Tensor* dside_in);
};

// The units of a named CNN, built for `seed` (layout-invariant initialisation by name) with the
// layers `layout` makes (cnn_layout.h).
std::vector<std::unique_ptr<CNNUnit>> build_cnn_units(const CNNConfig& cfg, uint64_t seed, const CNNLayout& layout);
// Number of units, and the (C, H, W) after each unit (entry 0: the input image).
int64_t cnn_num_units(const CNNConfig& cfg);
std::vector<Shape> cnn_unit_shapes(const CNNConfig& cfg);
// Names and shapes of every parameter and every buffer of the whole model, in stage order.
std::vector<std::pair<std::string, Shape>> cnn_param_shapes(const CNNConfig& cfg);
std::vector<std::pair<std::string, Shape>> cnn_buffer_shapes(const CNNConfig& cfg);
// The measured forward + backward seconds of each branch of each block of parallel branches
// (inception-small's Inception blocks), by block name: every branch run alone on `rows` random
// images of its input's shape with `threads` kernel threads, the median of `reps` runs after one
// untimed. Empty for a model without such blocks.
std::map<std::string, std::vector<double>> measure_branch_costs(const CNNConfig& cfg, int64_t rows, int threads,
                                                                int reps = 3);
// The blocks of parallel branches and their number of branches, by block name.
std::map<std::string, size_t> cnn_branch_blocks(const CNNConfig& cfg);
// Each block's input (C, H, W), by block name.
std::map<std::string, Shape> cnn_branch_inputs(const CNNConfig& cfg);
// Forward + backward FLOPs of one image per unit: each convolution and linear layer's forward
// (2 per multiply-add at its output size) times 3 (times 2 for a first layer on the images).
std::vector<double> cnn_unit_flops(const CNNConfig& cfg);

class CNNStage : public Stage {
 public:
  // Units [first_unit, end_unit) (-1: all); `first` reads the images, `last` gives the loss;
  // the layers as `layout` lays them out (null: one rank).
  CNNStage(const CNNConfig& cfg, uint64_t seed, int64_t first_unit, int64_t end_unit, bool first, bool last,
           std::shared_ptr<const CNNLayout> layout = nullptr);

  bool first() const override { return first_; }
  bool last() const override { return last_; }
  Tensor forward(nn::Context& ctx, const Tensor& x, const MicroBatch& mb, StageResult* result,
                 nn::Portal* portal) override;
  Tensor backward(nn::Context& ctx, const Tensor& dy, float grad_scale, nn::Portal* portal) override;
  Shape input_shape(int64_t rows, int64_t T) const override;
  Shape output_shape(int64_t rows, int64_t T) const override;
  // A skip crossing the stage's first or last boundary (graph.h skip_portals): this rank's part.
  Shape portal_shape(int64_t rows, int64_t T) const override;
  bool sends_portal() const override { return sends_ != kNoSkip; }
  bool takes_portal() const override { return takes_ != kNoSkip; }
  std::vector<StageUnit> units() override;
  void collect_params(std::vector<nn::Param*>& out) override;
  void collect_buffers(std::vector<nn::Param*>& out) override;
  // Every batch norm of the stage reduces its statistics with `reduce` (null: local).
  void set_batch_stats_reduce(const std::function<void(std::span<double>)>& reduce) override;

  const CNNConfig& config() const { return cfg_; }
  std::vector<int32_t> predictions() const override { return predicted_; }

 private:
  CNNConfig cfg_;
  std::shared_ptr<const CNNLayout> layout_;
  int64_t first_unit_, end_unit_;
  bool first_, last_;
  std::vector<std::unique_ptr<CNNUnit>> units_;
  // What crosses boundary `unit` (the input of that unit) on this rank, for `rows` samples.
  Shape boundary_shape(int64_t unit, int64_t rows) const;
  // The output of graph layer k (-1: the images) on this rank, for `rows` samples.
  Shape layer_shape(int k, int64_t rows) const;

  std::vector<Shape> shapes_;  // (C, H, W) after each unit of the whole model, [0]: the input
  std::vector<bool> split_at_;  // per unit boundary: a pair's split tensor crosses it
  std::vector<int> starts_;     // graph.h unit_starts
  std::vector<int> skips_;      // per unit boundary: the skip crossing it (graph.h unit_skips)
  std::vector<Shape> layer_chw_;  // (C, H, W) or (F) of every graph layer's output
  std::vector<bool> layer_split_;  // per graph layer: its output leaves channel-split
  // The skip this stage takes from an earlier stage's portal, and the one it sends to a later
  // stage's (graph layers; kNoSkip: none).
  int takes_ = kNoSkip, sends_ = kNoSkip;
  std::vector<int32_t> predicted_;  // the last forward's argmax per sample (last stage)
  struct Head {};  // key of the loss's saved tensors
  Head head_;
};

}  // namespace meshtrain::model
