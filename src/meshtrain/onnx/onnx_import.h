// Reading a network exported from PyTorch as ONNX (`torch.onnx.export(module, x, "net.onnx",
// training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)`) as a meshtrain layer
// graph (model/graph.h, docs/models.md) and its step-0 weights.
//
// The file is parsed by Debian's ONNX protobuf library (libonnx-dev: onnx::ModelProto); what
// this file adds is the mapping of ONNX nodes onto the layer vocabulary:
//   Conv -> conv2d            BatchNormalization -> batchnorm2d   Relu -> relu
//   MaxPool -> maxpool2d      AveragePool -> avgpool2d            GlobalAveragePool -> global_avgpool2d
//   Flatten (axis 1) -> flatten   Gemm, MatMul (+ Add of a bias) -> linear
//   Add -> add                Concat (channels) -> concat         Dropout -> dropout
//   Gelu, and the exact form PyTorch writes below opset 20 (Div by sqrt 2, Erf, Add 1, Mul, Mul 0.5) -> gelu
//   LayerNormalization, and the form PyTorch writes below opset 17 (ReduceMean, Sub, Pow,
//   ReduceMean, Add eps, Sqrt, Div, Mul weight, Add bias) -> layernorm
//   Pad before an AveragePool (PyTorch writes one, of zeros) -> the pool's padding
//   Identity, Constant: nothing of their own.
// A layer with parameters is named by its initializers' common prefix, so `conv1.weight` stays
// `conv1.weight` (the module's state-dict names); other layers by their node's scope
// (`/block/pool/MaxPool` -> `block.pool`) or their op.
//
// Weights: the initializers are the step-0 values, under the module's names. Linear weights are
// stored (in, out) by meshtrain (nn/linear.h) and (out, in) by PyTorch (Gemm transB = 1): they
// are transposed here. Batch norm's running statistics come along; `num_batches_tracked` is not
// exported by PyTorch (and not kept by meshtrain: `checkpoint convert` writes the step count).
//
// Refusals (OnnxError, a std::invalid_argument: the CLI exits 2) name the file and, where there
// is one, the node, its op and what meshtrain supports: a file that is not ONNX or is truncated;
// an op outside the vocabulary (LSTM, Reshape, ...); an attribute meshtrain cannot honour
// (grouped or dilated convolutions, asymmetric padding, ceil_mode, count_include_pad = 0); an
// input whose channel, height or width is not a fixed number (a dynamic axis meshtrain cannot
// fix: the batch may be dynamic); weights that are not float32 initializers under the layer's
// name (a constant-folded export).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/model/graph.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::onnx_import {

class OnnxError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Imported {
  nlohmann::json graph;                                 // the layer graph (docs/models.md)
  std::vector<std::pair<std::string, Tensor>> weights;  // step-0 values by parameter name
};

// Reads `path`; throws OnnxError (see the header comment).
Imported import_onnx(const std::string& path);

// import_onnx as a model::Graph carrying its weights (Graph::initial): what `--model net.onnx`
// reads. Throws OnnxError, or std::invalid_argument from the graph's own checks.
model::Graph read_onnx_graph(const std::string& path);

// Makes model_spec("FILE.onnx") read ONNX files (model/spec.h): the program and the Python
// module call it once at start.
void register_onnx_reader();

}  // namespace meshtrain::onnx_import
