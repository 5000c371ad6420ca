// ModelSpec: a model family's description, what the trainer, checkpoints, validation and the
// memory estimate ask of a model before any stage exists (model/model.h has the Stage it
// builds). GPT (model/stage.h) and the CNNs (model/cnn.h) implement it; `model_spec` picks one
// by the model's name, or by a config file's "family" field.
//
// What only one family has yet stays visible as such: gpt() is the transformer's config, which
// tensor parallelism's transformer layers, sequence parallelism and sampling use; code that needs
// it asks for it and refuses other families with a sentence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/model/cnn.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/cost.h"
#include "meshtrain/model/stage.h"

namespace meshtrain::model {

// The layer factories a stage is built with (DESIGN decision 8): how the transformer's layers,
// and the convolutional networks' (cnn_layout.h), are split over the layout (null: single-rank
// layers).
struct StageFactories {
  std::shared_ptr<const GPTLayout> transformer;
  std::shared_ptr<const CNNLayout> conv;
};

class ModelSpec {
 public:
  virtual ~ModelSpec() = default;
  virtual std::string name() const = 0;
  virtual std::string family() const = 0;  // "gpt", "cnn"
  virtual InputKind input() const = 0;
  // Recorded in checkpoints; a resume must match it.
  virtual nlohmann::json to_json() const = 0;
  // The units a pipeline may cut between (GPT: transformer blocks; a CNN: its units).
  virtual int64_t num_units() const = 0;
  // Stage `spec` (units [first_layer, end_layer); embedding: the first stage; head: the last).
  virtual std::unique_ptr<Stage> make_stage(const StageSpec& spec, uint64_t seed, const StageFactories& f) const = 0;
  // Names and full shapes of every parameter and every buffer of the whole model.
  virtual std::vector<std::pair<std::string, Shape>> param_shapes() const = 0;
  virtual std::vector<std::pair<std::string, Shape>> buffer_shapes() const { return {}; }
  // Forward + backward FLOPs of one sample (a sequence of T tokens, or an image).
  virtual double flops_per_sample(int64_t T) const = 0;
  virtual int64_t default_batch() const = 0;
  virtual int64_t default_seq() const { return 1; }
  // Image models: the sample's (C, H, W) and the number of classes.
  virtual Shape sample_shape() const { return {}; }
  virtual int64_t classes() const { return 0; }
  // ---- what the planner asks (model/cost.h) ----
  // The layers of stage `spec` (units [first_layer, end_layer), with the embedding and the head
  // when it has them) for one micro-batch on one rank of an intra-layer group of q.tp, in
  // forward order.
  virtual std::vector<OpCost> op_costs(const StageSpec& spec, const CostQuery& q) const = 0;
  // Parameter elements one rank of the intra-layer group holds of stage `spec` (a tied copy is
  // counted on each stage that holds one).
  virtual double stage_param_elements(const StageSpec& spec, int tp) const = 0;
  // Bytes of the activation entering unit `unit` (unit 0: the model's input) for `rows` samples
  // on one rank: what a pipeline stage boundary sends.
  virtual double boundary_bytes(int64_t unit, int64_t rows, int64_t T, int tp) const = 0;
  // Bytes of the skip tensor crossing the same boundary for `rows` samples (what a portal
  // carries, graph.h unit_skips); 0 where none crosses it.
  virtual double skip_bytes(int64_t unit, int64_t rows) const { return 0; }
  virtual const GPTConfig* gpt() const { return nullptr; }
  virtual const CNNConfig* cnn() const { return nullptr; }
};

std::shared_ptr<const ModelSpec> gpt_spec(const GPTConfig& cfg);
std::shared_ptr<const ModelSpec> cnn_spec(const CNNConfig& cfg);
// A named model of any family (gpt-tiny, ..., cnn-small, ...); throws std::invalid_argument
// listing every name otherwise.
std::shared_ptr<const ModelSpec> model_spec(const std::string& name);
// A config file: {"family": "cnn", "name": "resnet-small"} for a CNN; without "family" (or
// "family": "gpt") a GPT config as gpt_config_from_file reads it.
std::shared_ptr<const ModelSpec> model_spec_from_file(const std::string& path);
bool is_cnn_name(const std::string& name);

// An image classifier's state as PyTorch's module.state_dict() holds it: every parameter and
// buffer under its name in PyTorch's shape (a linear layer's weight (out, in), `transposed` from
// meshtrain's (in, out)), and after each batch norm's running_var its num_batches_tracked, a
// 0-d int64 (`counter`: the number of training steps). What `model show` lists and `checkpoint
// convert --to-single` writes.
struct TorchEntry {
  std::string name;
  Shape shape;
  bool transposed = false;
  bool counter = false;
};
std::vector<TorchEntry> torch_state_dict(const ModelSpec& spec);

// Reads an ONNX file as a graph with its weights (onnx/onnx_import.h registers it: model/ does
// not link the ONNX library). Until one is set, model_spec refuses .onnx files with a sentence.
void set_onnx_reader(Graph (*reader)(const std::string& path));
bool is_onnx_path(const std::string& name);

}  // namespace meshtrain::model
