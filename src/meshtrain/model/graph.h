// A model as data: a layer graph the user writes in JSON (docs/models.md), read strictly,
// its shapes inferred layer by layer. The named image models are such files too
// (models/*.json, built into the program), so a user's graph and ours take one path: the
// graph is compiled into pipeline units of nn/ layers by model/cnn.cpp, through the layout's
// layer factory (model/cnn_layout.h).
//
//   {"name": "vgg-mini",
//    "input": {"image": [1, 28, 28], "classes": 10},
//    "layers": [
//      {"name": "features.0", "op": "conv2d", "out_channels": 32, "kernel_size": 3, "padding": 1},
//      {"name": "features.1", "op": "batchnorm2d"},
//      {"name": "features.2", "op": "relu"},
//      {"name": "skip", "op": "conv2d", "out_channels": 32, "kernel_size": 1, "bias": false,
//       "from": "features.2"},
//      {"name": "sum", "op": "add", "from": ["features.2", "skip"]},
//      {"name": "flat", "op": "flatten"},
//      {"name": "fc", "op": "linear", "out_features": 10}]}
//
// A layer takes the previous layer's output unless "from" names an earlier one (or several, for
// add and concat); names are unique and are the PyTorch state-dict prefixes of the layer's
// parameters and buffers. The last layer's output is the logits, trained with cross-entropy.
// Field names follow PyTorch's constructor arguments. An optional "unit" groups consecutive
// layers into one pipeline unit (a pipeline cuts only between units; ZeRO-3 gathers a unit's
// parameters together); without it a layer is a unit of its own where a cut can fall after it,
// else it joins the next. A cut can fall after layer i where, besides layer i's output (the
// main tensor), at most one earlier tensor (a skip: the input of a residual block) is read
// after it, and not inside a block of parallel branches; where two or more are, it cannot.
// Units the file gives are kept as given; where one ends and the next given one begins, only
// the first's last output may be read later.
//
// Refusals throw std::invalid_argument with one sentence naming the file, the layer and the
// field (the CLI exits 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/nn/module.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::model {

enum class Op {
  conv2d, batchnorm2d, relu, maxpool2d, avgpool2d, global_avgpool2d, flatten, linear, add, concat,
  // Token models (a transformer): matched to the GPT pattern by model/config.cpp.
  embedding, position_embedding, causal_self_attention,
  // Both: layernorm (image models: over features, after a flatten), gelu, dropout.
  layernorm, gelu, dropout
};

const char* op_name(Op op);

struct GraphLayer {
  std::string name;
  Op op = Op::relu;
  std::vector<int> from;  // indices of the layers it reads; -1: the model's input
  std::string unit;       // "" when not given
  // conv2d: out_channels, kernel_size, stride, padding, bias; maxpool2d, avgpool2d: kernel_size,
  // stride, padding (avgpool2d: PyTorch's count_include_pad, the padding counted in the
  // divisor); linear: out_features (in out_channels), bias; batchnorm2d: eps, momentum;
  // layernorm: eps.
  int64_t out_channels = 0, kernel = 1, stride = 1, padding = 0;
  bool bias = true;
  double eps = 1e-5, momentum = 0.1;
  // Token models. embedding, position_embedding: num_embeddings (rows) and embedding_dim (in
  // out_channels); causal_self_attention: heads; linear: tied, the embedding whose weight it
  // shares (-1: its own); gelu: tanh, PyTorch's approximate="tanh" (else the exact erf form,
  // PyTorch's default).
  int64_t num_embeddings = 0, heads = 0;
  int tied = -1;
  bool tanh = false;
  double p = 0.5;  // dropout: the probability an element is zeroed in training
};

struct Graph {
  std::string name;
  // The input: images, or tokens.
  Shape image;            // (C, H, W) of a sample as the file gives it
  int64_t classes = 0;
  int64_t seq = 0;        // tokens: a sample's length (the recommended --seq)
  int64_t vocab = 0;      // tokens: the vocabulary
  bool tokens() const { return vocab > 0; }
  int64_t batch = 64;     // the recommended global batch
  std::vector<GraphLayer> layers;
  nlohmann::json source;  // the file's JSON, as read (recorded in checkpoints)
  // Step-0 values that came with the graph (an ONNX file's initializers, onnx/onnx_import.h):
  // whole tensors by parameter or buffer name, linear weights (in, out). Null: --seed's draws.
  std::shared_ptr<const std::vector<std::pair<std::string, Tensor>>> initial;
};

// Sets every parameter and buffer of `m` (a stage, or any module) to its part of the whole tensor
// of the same name in `weights`, through its shard spec (so any layout takes its own slice).
// Throws std::invalid_argument naming a tensor `weights` lacks or holds in another shape.
void load_initial(nn::Module& m, const std::vector<std::pair<std::string, Tensor>>& weights,
                  const std::string& source);

// Reads a graph from its JSON; `source` names it in refusals ("model file m.json").
Graph parse_graph(const nlohmann::json& j, const std::string& source);
// The file at `path`, read strictly (io/json.h).
Graph read_graph_file(const std::string& path);
// Whether a JSON object is a layer graph (it has "layers").
bool is_graph_json(const nlohmann::json& j);

// The named models shipped as files (models/*.json), by name; null when `name` is none of them.
std::shared_ptr<const Graph> named_graph(const std::string& name);
std::vector<std::string> named_graph_names();

// The per-sample output shape of every layer for an input of (C, H, W) (the file's, or scaled):
// (C, H, W) or (F); of a token model for the input (T): (T, C). Refuses shapes that do not meet,
// naming the layer.
std::vector<Shape> infer_shapes(const Graph& g, const Shape& chw);

// Forward FLOPs of layer i for one sample, 2 per multiply-add of a convolution or a linear layer
// (their bias and every element-wise layer: 0), as kernels/flops.h counts the calls; `shapes`
// from infer_shapes for an input of `chw` (a token model's: (T)). Attention: its two projections
// (GEMMs) and its two products over the causal triangle (its own kernel, not counted).
double forward_flops(const Graph& g, const std::vector<Shape>& shapes, const Shape& chw, size_t i);

// Where a pipeline may cut: unit u is layers [starts[u], starts[u + 1]) (starts.back() is the
// layer count). After a unit, the output of its last layer is read, and at most one other
// tensor made before it (unit_skips; none between two units the file gives).
std::vector<int> unit_starts(const Graph& g);

// The skip crossing each unit boundary: skips[u] (u = 0 .. units) is the layer whose output is
// read at or after unit u's first layer, though made before the layer just before it (-1: the
// input images; kNoSkip: none). skips[0] and skips.back() are kNoSkip. A skip that crosses a
// pipeline cut travels in a portal (nn::Portal) from the stage that has it to the one that
// reads it.
inline constexpr int kNoSkip = -2;
std::vector<int> unit_skips(const Graph& g);

// The portals a pipeline's stages need: stage s holds units [first_unit[s], first_unit[s + 1])
// (first_unit[0] = 0; the last stage ends at the last unit). to[s]: the stage the skip tensor
// leaving stage s goes to; from[s]: the stage whose skip tensor stage s reads (-1: none); skip
// layers of each (kNoSkip: none). The executor carries one portal out of and one into a stage
// (of one shape), so a skip read by two later stages, or a stage that takes one skip and sends
// another of a different shape (`shapes`: infer_shapes of the run's input, with the channel
// splits), is refused (std::invalid_argument naming the layers and suggesting --pp-cuts).
struct SkipPortals {
  std::vector<int> to, from;
  std::vector<int> sent, taken;  // the skip's layer, per stage
};
SkipPortals skip_portals(const Graph& g, const std::vector<Shape>& shapes, const std::vector<int64_t>& first_unit);

// Channel pairing (model/cnn_layout.h): a convolution whose output reaches exactly one other
// convolution through per-channel layers only (batch norm, ReLU, max pooling), each read once,
// leaves its output split and that convolution takes it split (filters, then channels; average
// pooling and GELU are per-channel too); a linear layer whose output reaches exactly one other
// linear layer through ReLUs or GELUs only pairs
// the same way (column, then row). Per layer: whether its input arrives split, whether its
// output leaves split.
struct ChannelSplits {
  std::vector<bool> in_split, out_split;
};
ChannelSplits channel_splits(const Graph& g);

// Whether every layer after the input can keep oneDNN's blocked activation layout
// (convolution, batch norm, ReLU, GELU, add, global average pooling, and a flatten or linear after
// the global pool): the graph then keeps it where the layout gives one (no convolution
// converts); otherwise (a max or average pool, a concat, a flatten of a feature map, dropout on
// a feature map) every activation is NCHW.
bool graph_takes_blocked(const Graph& g);

}  // namespace meshtrain::model
