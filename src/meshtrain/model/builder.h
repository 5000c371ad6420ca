// A layer graph built in code, with calls that mirror the JSON fields of a model file
// (model/graph.h, docs/models.md): the C++ way to write your own model.
//
//   meshtrain::model::GraphBuilder g("my-net", {1, 28, 28}, 10);
//   g.conv2d("stem", {.out_channels = 16, .kernel_size = 3, .padding = 1})
//       .batchnorm2d("stem_bn")
//       .relu("stem_relu")
//       .flatten("flat")
//       .linear("fc", {.out_features = 10});
//   std::shared_ptr<const Graph> graph = g.build();  // train::TrainOptions::graph
//
// Each call appends a layer reading the previous one, or the layers `from` names ("input": the
// images). build() reads the JSON the calls made through parse_graph, so a graph built in code
// passes every check a model file passes and is refused with the same sentences.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/model/graph.h"

namespace meshtrain::model {

struct Conv2dArgs {
  int64_t out_channels = 0, kernel_size = 1, stride = 1, padding = 0;
  bool bias = true;
};
struct BatchNorm2dArgs {
  double eps = 1e-5, momentum = 0.1;
};
struct Pool2dArgs {
  int64_t kernel_size = 1, stride = 0, padding = 0;  // stride 0: kernel_size (PyTorch's default)
};
struct LinearArgs {
  int64_t out_features = 0;
  bool bias = true;
};

class GraphBuilder {
 public:
  // A model of `image` (C, H, W) inputs and `classes` classes; `batch`: its default global batch.
  GraphBuilder(std::string name, const Shape& image, int64_t classes, int64_t batch = 64);

  // `from`: the layer it reads (empty: the previous layer).
  GraphBuilder& conv2d(const std::string& name, const Conv2dArgs& a, const std::string& from = "");
  GraphBuilder& batchnorm2d(const std::string& name, const BatchNorm2dArgs& a = {}, const std::string& from = "");
  GraphBuilder& relu(const std::string& name, const std::string& from = "");
  GraphBuilder& maxpool2d(const std::string& name, const Pool2dArgs& a, const std::string& from = "");
  GraphBuilder& avgpool2d(const std::string& name, const Pool2dArgs& a, const std::string& from = "");
  // approximate: "none" (the exact erf form, PyTorch's default) or "tanh".
  GraphBuilder& gelu(const std::string& name, const std::string& approximate = "none", const std::string& from = "");
  // Over features (after a flatten).
  GraphBuilder& layernorm(const std::string& name, double eps = 1e-5, const std::string& from = "");
  GraphBuilder& dropout(const std::string& name, double p = 0.5, const std::string& from = "");
  GraphBuilder& global_avgpool2d(const std::string& name, const std::string& from = "");
  GraphBuilder& flatten(const std::string& name, const std::string& from = "");
  GraphBuilder& linear(const std::string& name, const LinearArgs& a, const std::string& from = "");
  GraphBuilder& add(const std::string& name, const std::vector<std::string>& from);
  GraphBuilder& concat(const std::string& name, const std::vector<std::string>& from);
  // The layers added from now on form pipeline unit `unit` (empty: each its own, docs/models.md).
  GraphBuilder& unit(const std::string& unit);

  // The model file these calls describe.
  const nlohmann::json& json() const { return j_; }
  // The graph, checked as a model file is; throws std::invalid_argument naming the layer.
  std::shared_ptr<const Graph> build() const;

 private:
  GraphBuilder& layer(nlohmann::json l, const std::string& from);
  nlohmann::json j_;
  std::string unit_;
};

}  // namespace meshtrain::model
