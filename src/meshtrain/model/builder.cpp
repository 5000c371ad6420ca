#include "meshtrain/model/builder.h"

#include <utility>

namespace meshtrain::model {

GraphBuilder::GraphBuilder(std::string name, const Shape& image, int64_t classes, int64_t batch) {
  j_ = {{"name", std::move(name)},
        {"input", {{"image", image}, {"classes", classes}}},
        {"batch", batch},
        {"layers", nlohmann::json::array()}};
}

GraphBuilder& GraphBuilder::layer(nlohmann::json l, const std::string& from) {
  if (!from.empty()) l["from"] = from;
  if (!unit_.empty()) l["unit"] = unit_;
  j_["layers"].push_back(std::move(l));
  return *this;
}

GraphBuilder& GraphBuilder::conv2d(const std::string& name, const Conv2dArgs& a, const std::string& from) {
  return layer({{"name", name}, {"op", "conv2d"}, {"out_channels", a.out_channels}, {"kernel_size", a.kernel_size},
                {"stride", a.stride}, {"padding", a.padding}, {"bias", a.bias}},
               from);
}

GraphBuilder& GraphBuilder::batchnorm2d(const std::string& name, const BatchNorm2dArgs& a, const std::string& from) {
  return layer({{"name", name}, {"op", "batchnorm2d"}, {"eps", a.eps}, {"momentum", a.momentum}}, from);
}

GraphBuilder& GraphBuilder::relu(const std::string& name, const std::string& from) {
  return layer({{"name", name}, {"op", "relu"}}, from);
}

GraphBuilder& GraphBuilder::maxpool2d(const std::string& name, const Pool2dArgs& a, const std::string& from) {
  return layer({{"name", name}, {"op", "maxpool2d"}, {"kernel_size", a.kernel_size},
                {"stride", a.stride > 0 ? a.stride : a.kernel_size}, {"padding", a.padding}},
               from);
}

GraphBuilder& GraphBuilder::avgpool2d(const std::string& name, const Pool2dArgs& a, const std::string& from) {
  return layer({{"name", name}, {"op", "avgpool2d"}, {"kernel_size", a.kernel_size},
                {"stride", a.stride > 0 ? a.stride : a.kernel_size}, {"padding", a.padding}},
               from);
}

GraphBuilder& GraphBuilder::gelu(const std::string& name, const std::string& approximate, const std::string& from) {
  return layer({{"name", name}, {"op", "gelu"}, {"approximate", approximate}}, from);
}

GraphBuilder& GraphBuilder::layernorm(const std::string& name, double eps, const std::string& from) {
  return layer({{"name", name}, {"op", "layernorm"}, {"eps", eps}}, from);
}

GraphBuilder& GraphBuilder::dropout(const std::string& name, double p, const std::string& from) {
  return layer({{"name", name}, {"op", "dropout"}, {"p", p}}, from);
}

GraphBuilder& GraphBuilder::global_avgpool2d(const std::string& name, const std::string& from) {
  return layer({{"name", name}, {"op", "global_avgpool2d"}}, from);
}

GraphBuilder& GraphBuilder::flatten(const std::string& name, const std::string& from) {
  return layer({{"name", name}, {"op", "flatten"}}, from);
}

GraphBuilder& GraphBuilder::linear(const std::string& name, const LinearArgs& a, const std::string& from) {
  return layer({{"name", name}, {"op", "linear"}, {"out_features", a.out_features}, {"bias", a.bias}}, from);
}

GraphBuilder& GraphBuilder::add(const std::string& name, const std::vector<std::string>& from) {
  nlohmann::json l = {{"name", name}, {"op", "add"}, {"from", from}};
  return layer(std::move(l), "");
}

GraphBuilder& GraphBuilder::concat(const std::string& name, const std::vector<std::string>& from) {
  nlohmann::json l = {{"name", name}, {"op", "concat"}, {"from", from}};
  return layer(std::move(l), "");
}

GraphBuilder& GraphBuilder::unit(const std::string& unit) {
  unit_ = unit;
  return *this;
}

std::shared_ptr<const Graph> GraphBuilder::build() const {
  return std::make_shared<const Graph>(parse_graph(j_, "graph " + j_["name"].get<std::string>() + " (built in code)"));
}

}  // namespace meshtrain::model
