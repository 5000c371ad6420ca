// ONNX files as layer graphs (onnx_import.h).
#include "meshtrain/onnx/onnx_import.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "meshtrain/model/spec.h"

namespace meshtrain::onnx_import {

namespace {

const char* kSupported =
    "Conv, BatchNormalization, Relu, Gelu (or its Erf form), MaxPool, AveragePool (and the Pad before it), "
    "GlobalAveragePool, Flatten, Gemm, MatMul (+ Add), Add, Concat, Dropout, LayerNormalization (or its ReduceMean "
    "form), Identity and Constant";

// A constant or initializer's values as doubles (float, double, integer and bool tensors).
std::vector<double> values_of(const onnx::TensorProto& t) {
  std::vector<double> v;
  const std::string& raw = t.raw_data();
  auto from_raw = [&](auto zero) {
    using T = decltype(zero);
    const size_t n = raw.size() / sizeof(T);
    for (size_t i = 0; i < n; ++i) {
      T x;
      std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
      v.push_back(static_cast<double>(x));
    }
  };
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      if (t.has_raw_data()) from_raw(0.f);
      for (float x : t.float_data()) v.push_back(x);
      break;
    case onnx::TensorProto::DOUBLE:
      if (t.has_raw_data()) from_raw(0.0);
      for (double x : t.double_data()) v.push_back(x);
      break;
    case onnx::TensorProto::INT64:
      if (t.has_raw_data()) from_raw(int64_t{0});
      for (int64_t x : t.int64_data()) v.push_back(static_cast<double>(x));
      break;
    case onnx::TensorProto::INT32:
      if (t.has_raw_data()) from_raw(int32_t{0});
      for (int32_t x : t.int32_data()) v.push_back(x);
      break;
    case onnx::TensorProto::BOOL:
      if (t.has_raw_data()) from_raw(uint8_t{0});
      for (int32_t x : t.int32_data()) v.push_back(x);
      break;
    default:
      break;
  }
  return v;
}

// A 2-D tensor's transpose.
Tensor transposed(const Tensor& w) {
  const int64_t r = w.shape()[0], c = w.shape()[1];
  Tensor t(Shape{c, r});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t.data()[j * r + i] = w.data()[i * c + j];
  return t;
}

class Importer {
 public:
  Importer(const std::string& path, const onnx::ModelProto& m) : path_(path), g_(m.graph()) {}

  Imported run();

 private:
  // ---- refusals ----
  [[noreturn]] void refuse_node(const onnx::NodeProto& n, const std::string& why) const {
    throw OnnxError(path_ + ": node '" + n.name() + "' (op " + n.op_type() + ") " + why);
  }

  // ---- graph bookkeeping ----
  const onnx::NodeProto* single_consumer(const std::string& tensor) const {
    auto it = consumers_.find(tensor);
    if (it == consumers_.end() || it->second.size() != 1) return nullptr;
    return &g_.node(it->second[0]);
  }
  size_t consumer_count(const std::string& tensor) const {
    auto it = consumers_.find(tensor);
    return it == consumers_.end() ? 0 : it->second.size();
  }
  bool is_constant(const std::string& name) const { return constants_.count(name) || initializers_.count(name); }
  // A scalar constant's value, if `name` is one.
  bool scalar(const std::string& name, double* out) const {
    const onnx::TensorProto* t = nullptr;
    if (auto it = constants_.find(name); it != constants_.end()) t = it->second;
    if (auto it = initializers_.find(name); it != initializers_.end()) t = it->second;
    if (!t) return false;
    const std::vector<double> v = values_of(*t);
    if (v.size() != 1) return false;
    *out = v[0];
    return true;
  }
  // The layer (or "input") that produces activation `tensor`.
  std::string source(const onnx::NodeProto& n, const std::string& tensor) const {
    auto it = producer_.find(tensor);
    if (it == producer_.end()) {
      if (is_constant(tensor))
        refuse_node(n, "takes the constant or weight '" + tensor + "' where meshtrain needs the output of a layer; " +
                           "meshtrain maps " + kSupported);
      refuse_node(n, "reads '" + tensor + "', which no node meshtrain mapped produces");
    }
    return it->second;
  }

  // ---- attributes ----
  static const onnx::AttributeProto* attr(const onnx::NodeProto& n, const std::string& name) {
    for (const auto& a : n.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  static int64_t attr_int(const onnx::NodeProto& n, const std::string& name, int64_t dflt) {
    const auto* a = attr(n, name);
    return a ? a->i() : dflt;
  }
  static double attr_float(const onnx::NodeProto& n, const std::string& name, double dflt) {
    const auto* a = attr(n, name);
    return a ? a->f() : dflt;
  }
  static std::vector<int64_t> attr_ints(const onnx::NodeProto& n, const std::string& name) {
    const auto* a = attr(n, name);
    if (!a) return {};
    return {a->ints().begin(), a->ints().end()};
  }
  // Square kernel, equal strides and symmetric equal pads of a 2-D window op; refuses the rest.
  void window(const onnx::NodeProto& n, int64_t* k, int64_t* s, int64_t* p) const;

  // ---- weights ----
  // The initializer `name` as float32, refusing anything else.
  Tensor weight(const onnx::NodeProto& n, const std::string& name) const;
  // The layer name of parameters `names` (their common prefix before ".weight", ".bias", ...);
  // refuses names that are not a module's state-dict names.
  std::string param_layer(const onnx::NodeProto& n, const std::vector<std::pair<std::string, std::string>>& names) const;
  // A name for a layer without parameters, from the node's scope, unique in the graph.
  std::string plain_layer(const onnx::NodeProto& n, const std::string& op);
  std::string unique(std::string name);

  void emit(nlohmann::json layer, const std::vector<std::string>& from, const std::string& out) {
    const std::string name = layer["name"];
    if (from.size() == 1)
      layer["from"] = from[0];
    else
      layer["from"] = from;
    layers_.push_back(std::move(layer));
    producer_[out] = name;
    last_output_ = out;
  }

  // ---- the ops ----
  void conv(const onnx::NodeProto& n);
  void batchnorm(const onnx::NodeProto& n);
  void gemm(const onnx::NodeProto& n);
  bool matmul(const onnx::NodeProto& n);
  bool erf_gelu(const onnx::NodeProto& n);
  bool layernorm_pattern(const onnx::NodeProto& n);
  void layernorm(const onnx::NodeProto& n);
  void dropout(const onnx::NodeProto& n);
  void pool(const onnx::NodeProto& n, bool max);
  void pad(const onnx::NodeProto& n);

  std::string path_;
  const onnx::GraphProto& g_;
  std::map<std::string, const onnx::TensorProto*> initializers_, constants_;
  std::map<std::string, std::vector<int>> consumers_;
  std::map<std::string, std::string> producer_;
  std::map<std::string, int64_t> folded_pad_;  // a Pad's output an AveragePool reads: its padding
  std::set<const onnx::NodeProto*> done_;
  std::set<std::string> names_;
  std::vector<nlohmann::json> layers_;
  std::vector<std::pair<std::string, Tensor>> weights_;
  std::string last_output_;
};

void Importer::window(const onnx::NodeProto& n, int64_t* k, int64_t* s, int64_t* p) const {
  const std::vector<int64_t> ks = attr_ints(n, "kernel_shape");
  if (ks.size() != 2 || ks[0] != ks[1])
    refuse_node(n, "has kernel_shape " + nlohmann::json(ks).dump() + "; meshtrain's 2-D windows are square");
  *k = ks[0];
  std::vector<int64_t> ss = attr_ints(n, "strides");
  if (ss.empty()) ss = {1, 1};
  if (ss.size() != 2 || ss[0] != ss[1])
    refuse_node(n, "has strides " + nlohmann::json(ss).dump() + "; meshtrain needs the same stride both ways");
  *s = ss[0];
  std::vector<int64_t> ps = attr_ints(n, "pads");
  if (ps.empty()) ps = {0, 0, 0, 0};
  if (ps.size() != 4 || ps[0] != ps[1] || ps[0] != ps[2] || ps[0] != ps[3])
    refuse_node(n, "has pads " + nlohmann::json(ps).dump() + "; meshtrain pads all four sides alike");
  *p = ps[0];
  if (const auto* a = attr(n, "auto_pad"); a && a->s() != "NOTSET")
    refuse_node(n, "has auto_pad " + a->s() + "; export with explicit padding (PyTorch does)");
  for (int64_t d : attr_ints(n, "dilations"))
    if (d != 1) refuse_node(n, "is dilated; meshtrain's convolutions and pools are not");
}

Tensor Importer::weight(const onnx::NodeProto& n, const std::string& name) const {
  auto it = initializers_.find(name);
  if (it == initializers_.end())
    refuse_node(n, "takes its weight '" + name + "' from another node's output; meshtrain trains weights that are "
                   "initializers (export with do_constant_folding=False and the weights as parameters)");
  const onnx::TensorProto& t = *it->second;
  if (t.data_location() == onnx::TensorProto::EXTERNAL)
    refuse_node(n, "keeps '" + name + "' in an external data file; export a model under 2 GB in one file");
  if (t.data_type() != onnx::TensorProto::FLOAT)
    refuse_node(n, "has weight '" + name + "' of ONNX data type " + std::to_string(t.data_type()) +
                   "; meshtrain reads float32 weights (export the module in float32)");
  Shape shape(t.dims().begin(), t.dims().end());
  Tensor out(shape);
  const int64_t numel = out.numel();
  if (t.has_raw_data()) {
    if (static_cast<int64_t>(t.raw_data().size()) != numel * 4)
      refuse_node(n, "has weight '" + name + "' whose data does not match its shape (a damaged file)");
    std::memcpy(out.data(), t.raw_data().data(), static_cast<size_t>(numel) * 4);
  } else {
    if (t.float_data_size() != numel)
      refuse_node(n, "has weight '" + name + "' whose data does not match its shape (a damaged file)");
    std::copy(t.float_data().begin(), t.float_data().end(), out.data());
  }
  for (int64_t i = 0; i < numel; ++i)
    if (!std::isfinite(out.data()[i]))
      refuse_node(n, "has weight '" + name + "' with a non-finite element (" + std::to_string(i) + ")");
  return out;
}

std::string Importer::param_layer(const onnx::NodeProto& n,
                                  const std::vector<std::pair<std::string, std::string>>& names) const {
  std::string layer;
  for (const auto& [name, suffix] : names) {
    const std::string tail = "." + suffix;
    if (name.size() <= tail.size() || !name.ends_with(tail))
      refuse_node(n, "has parameter '" + name + "', which is not a state-dict name ending in '" + tail +
                     "'; export with do_constant_folding=False so the parameters keep the module's names");
    const std::string prefix = name.substr(0, name.size() - tail.size());
    if (!layer.empty() && prefix != layer)
      refuse_node(n, "has parameters of two modules ('" + layer + "' and '" + prefix + "')");
    layer = prefix;
  }
  if (names_.count(layer)) refuse_node(n, "uses the parameters of '" + layer + "' a second time (shared weights)");
  return layer;
}

std::string Importer::unique(std::string name) {
  if (name.empty()) name = "layer";
  std::string base = name;
  for (int k = 2; names_.count(name) || initializers_.count(name + ".weight"); ++k) {
    name = base;
    name += "_";
    name += std::to_string(k);
  }
  names_.insert(name);
  return name;
}

std::string Importer::plain_layer(const onnx::NodeProto& n, const std::string& op) {
  // "/block/pool/MaxPool" -> "block.pool"; "/Relu_1" -> the op's name.
  std::string scope = n.name();
  if (!scope.empty() && scope[0] == '/') scope.erase(0, 1);
  const size_t slash = scope.rfind('/');
  scope = slash == std::string::npos ? "" : scope.substr(0, slash);
  std::replace(scope.begin(), scope.end(), '/', '.');
  return unique(scope.empty() ? op : scope);
}

void Importer::conv(const onnx::NodeProto& n) {
  if (attr_int(n, "group", 1) != 1)
    refuse_node(n, "is a grouped convolution (group " + std::to_string(attr_int(n, "group", 1)) +
                   "); meshtrain's conv2d has group 1");
  int64_t k, s, p;
  window(n, &k, &s, &p);
  const bool bias = n.input_size() > 2 && !n.input(2).empty();
  std::vector<std::pair<std::string, std::string>> names = {{n.input(1), "weight"}};
  if (bias) names.push_back({n.input(2), "bias"});
  const std::string name = param_layer(n, names);
  Tensor w = weight(n, n.input(1));
  if (w.shape().size() != 4 || w.shape()[2] != k || w.shape()[3] != k)
    refuse_node(n, "has a weight of shape " + shape_str(w.shape()) + " for a " + std::to_string(k) + "x" +
                   std::to_string(k) + " kernel");
  names_.insert(name);
  const int64_t oc = w.shape()[0];
  weights_.push_back({name + ".weight", std::move(w)});
  if (bias) weights_.push_back({name + ".bias", weight(n, n.input(2))});
  emit({{"name", name}, {"op", "conv2d"}, {"out_channels", oc}, {"kernel_size", k}, {"stride", s}, {"padding", p},
        {"bias", bias}},
       {source(n, n.input(0))}, n.output(0));
}

void Importer::batchnorm(const onnx::NodeProto& n) {
  if (n.input_size() != 5) refuse_node(n, "has " + std::to_string(n.input_size()) + " inputs, not 5");
  for (int o = 1; o < n.output_size(); ++o)
    if (consumer_count(n.output(o)) > 0)
      refuse_node(n, "has its running statistics read by another node; meshtrain keeps them as buffers");
  const std::string name = param_layer(n, {{n.input(1), "weight"}, {n.input(2), "bias"}, {n.input(3), "running_mean"},
                                           {n.input(4), "running_var"}});
  names_.insert(name);
  weights_.push_back({name + ".weight", weight(n, n.input(1))});
  weights_.push_back({name + ".bias", weight(n, n.input(2))});
  weights_.push_back({name + ".running_mean", weight(n, n.input(3))});
  weights_.push_back({name + ".running_var", weight(n, n.input(4))});
  // ONNX's momentum is the share of the old running value (0.9); PyTorch's the share of the new
  // (0.1). Rounded to 7 digits, so PyTorch's 0.1 (stored 0.9f) reads back as 0.1.
  const double onnx_momentum = attr_float(n, "momentum", 0.9);
  const double momentum = std::round((1.0 - onnx_momentum) * 1e7) / 1e7;
  const double eps = std::stod(std::to_string(static_cast<float>(attr_float(n, "epsilon", 1e-5))));
  emit({{"name", name}, {"op", "batchnorm2d"}, {"eps", std::round(eps * 1e12) / 1e12}, {"momentum", momentum}},
       {source(n, n.input(0))}, n.output(0));
}

void Importer::gemm(const onnx::NodeProto& n) {
  if (attr_int(n, "transA", 0) != 0 || attr_float(n, "alpha", 1.0) != 1.0 || attr_float(n, "beta", 1.0) != 1.0)
    refuse_node(n, "has transA, alpha or beta other than PyTorch's Linear (0, 1, 1)");
  const bool bias = n.input_size() > 2 && !n.input(2).empty();
  std::vector<std::pair<std::string, std::string>> names = {{n.input(1), "weight"}};
  if (bias) names.push_back({n.input(2), "bias"});
  const std::string name = param_layer(n, names);
  Tensor w = weight(n, n.input(1));
  if (w.shape().size() != 2) refuse_node(n, "has a weight of shape " + shape_str(w.shape()) + ", not 2-D");
  // meshtrain keeps (in, out); PyTorch's Linear exports (out, in) with transB = 1.
  if (attr_int(n, "transB", 0) == 1) w = transposed(w);
  names_.insert(name);
  const int64_t out = w.shape()[1];
  weights_.push_back({name + ".weight", std::move(w)});
  if (bias) weights_.push_back({name + ".bias", weight(n, n.input(2))});
  emit({{"name", name}, {"op", "linear"}, {"out_features", out}, {"bias", bias}}, {source(n, n.input(0))},
       n.output(0));
}

// MatMul(x, W) or MatMul(x, Transpose(W)), with an Add of a bias as its only reader when there
// is one: a linear layer. False when the node is not of that form.
bool Importer::matmul(const onnx::NodeProto& n) {
  std::string wname = n.input(1);
  bool flip = false;
  for (int i = 0; i < g_.node_size(); ++i) {
    const auto& t = g_.node(i);
    if (t.op_type() == "Transpose" && t.output(0) == wname && initializers_.count(t.input(0))) {
      const auto perm = attr_ints(t, "perm");
      if (!perm.empty() && perm != std::vector<int64_t>{1, 0}) refuse_node(t, "permutes a weight other than (1, 0)");
      wname = t.input(0), flip = true;
      done_.insert(&t);
    }
  }
  if (!initializers_.count(wname)) return false;
  const onnx::NodeProto* add = single_consumer(n.output(0));
  std::string bname;
  if (add && add->op_type() == "Add") {
    const std::string other = add->input(0) == n.output(0) ? add->input(1) : add->input(0);
    if (initializers_.count(other)) bname = other;
  }
  std::vector<std::pair<std::string, std::string>> names = {{wname, "weight"}};
  if (!bname.empty()) names.push_back({bname, "bias"});
  const std::string name = param_layer(n, names);
  Tensor w = weight(n, wname);
  if (w.shape().size() != 2) refuse_node(n, "has a weight of shape " + shape_str(w.shape()) + ", not 2-D");
  // The initializer is the module's (out, in) weight when a Transpose feeds the product;
  // meshtrain keeps (in, out), which is what MatMul multiplies by.
  if (flip) w = transposed(w);
  names_.insert(name);
  const int64_t out = w.shape()[1];
  weights_.push_back({name + ".weight", std::move(w)});
  if (!bname.empty()) weights_.push_back({name + ".bias", weight(*add, bname)}), done_.insert(add);
  emit({{"name", name}, {"op", "linear"}, {"out_features", out}, {"bias", !bname.empty()}}, {source(n, n.input(0))},
       bname.empty() ? n.output(0) : add->output(0));
  return true;
}

// PyTorch's exact GELU below opset 20: y = (x * (erf(x / sqrt 2) + 1)) * 0.5.
bool Importer::erf_gelu(const onnx::NodeProto& div) {
  double c;
  if (div.op_type() != "Div" || !scalar(div.input(1), &c) || std::abs(c - std::sqrt(2.0)) > 1e-5) return false;
  const std::string x = div.input(0);
  const onnx::NodeProto* erf = single_consumer(div.output(0));
  if (!erf || erf->op_type() != "Erf") return false;
  const onnx::NodeProto* add = single_consumer(erf->output(0));
  if (!add || add->op_type() != "Add") return false;
  const std::string one = add->input(0) == erf->output(0) ? add->input(1) : add->input(0);
  if (!scalar(one, &c) || c != 1.0) return false;
  const onnx::NodeProto* mul = single_consumer(add->output(0));
  if (!mul || mul->op_type() != "Mul") return false;
  const std::string other = mul->input(0) == add->output(0) ? mul->input(1) : mul->input(0);
  if (other != x) return false;
  const onnx::NodeProto* half = single_consumer(mul->output(0));
  if (!half || half->op_type() != "Mul") return false;
  const std::string h = half->input(0) == mul->output(0) ? half->input(1) : half->input(0);
  if (!scalar(h, &c) || c != 0.5) return false;
  for (const auto* m : {erf, add, mul, half}) done_.insert(m);
  emit({{"name", plain_layer(div, "gelu")}, {"op", "gelu"}}, {source(div, x)}, half->output(0));
  return true;
}

// PyTorch's LayerNorm below opset 17: mean = ReduceMean(x), d = x - mean,
// y = d / Sqrt(ReduceMean(Pow(d, 2)) + eps) * weight + bias, over the last axis.
bool Importer::layernorm_pattern(const onnx::NodeProto& r1) {
  auto last_axis = [&](const onnx::NodeProto& r) {
    const auto axes = attr_ints(r, "axes");
    return axes == std::vector<int64_t>{-1} || axes == std::vector<int64_t>{1};
  };
  if (r1.op_type() != "ReduceMean" || !last_axis(r1)) return false;
  const std::string x = r1.input(0);
  const onnx::NodeProto* sub = single_consumer(r1.output(0));
  if (!sub || sub->op_type() != "Sub" || sub->input(0) != x || sub->input(1) != r1.output(0)) return false;
  auto it = consumers_.find(sub->output(0));
  if (it == consumers_.end() || it->second.size() != 2) return false;
  const onnx::NodeProto* pow = &g_.node(it->second[0]);
  const onnx::NodeProto* div = &g_.node(it->second[1]);
  if (pow->op_type() != "Pow") std::swap(pow, div);
  double c;
  if (pow->op_type() != "Pow" || div->op_type() != "Div" || !scalar(pow->input(1), &c) || c != 2.0) return false;
  const onnx::NodeProto* r2 = single_consumer(pow->output(0));
  if (!r2 || r2->op_type() != "ReduceMean" || !last_axis(*r2)) return false;
  const onnx::NodeProto* add = single_consumer(r2->output(0));
  if (!add || add->op_type() != "Add") return false;
  double eps;
  if (!scalar(add->input(1), &eps) && !scalar(add->input(0), &eps)) return false;
  const onnx::NodeProto* sqrt = single_consumer(add->output(0));
  if (!sqrt || sqrt->op_type() != "Sqrt" || div->input(0) != sub->output(0) || div->input(1) != sqrt->output(0))
    return false;
  const onnx::NodeProto* mul = single_consumer(div->output(0));
  if (!mul || mul->op_type() != "Mul") return false;
  const std::string wname = mul->input(0) == div->output(0) ? mul->input(1) : mul->input(0);
  const onnx::NodeProto* badd = single_consumer(mul->output(0));
  if (!badd || badd->op_type() != "Add") return false;
  const std::string bname = badd->input(0) == mul->output(0) ? badd->input(1) : badd->input(0);
  if (!initializers_.count(wname) || !initializers_.count(bname)) return false;
  const std::string name = param_layer(r1, {{wname, "weight"}, {bname, "bias"}});
  names_.insert(name);
  weights_.push_back({name + ".weight", weight(*mul, wname)});
  weights_.push_back({name + ".bias", weight(*badd, bname)});
  for (const auto* m : {sub, pow, div, r2, add, sqrt, mul, badd}) done_.insert(m);
  const double e = std::stod(std::to_string(static_cast<float>(eps)));
  emit({{"name", name}, {"op", "layernorm"}, {"eps", std::round(e * 1e12) / 1e12}}, {source(r1, x)},
       badd->output(0));
  return true;
}

void Importer::layernorm(const onnx::NodeProto& n) {
  const int64_t axis = attr_int(n, "axis", -1);
  if (axis != -1 && axis != 1) refuse_node(n, "normalises from axis " + std::to_string(axis) + "; meshtrain's layernorm "
                                              "normalises the features of (N, F) after a flatten");
  if (n.input_size() < 3 || n.input(2).empty()) refuse_node(n, "has no bias; meshtrain's layernorm has one");
  const std::string name = param_layer(n, {{n.input(1), "weight"}, {n.input(2), "bias"}});
  for (int o = 1; o < n.output_size(); ++o)
    if (consumer_count(n.output(o)) > 0) refuse_node(n, "has its mean or deviation read by another node");
  names_.insert(name);
  weights_.push_back({name + ".weight", weight(n, n.input(1))});
  weights_.push_back({name + ".bias", weight(n, n.input(2))});
  const double e = std::stod(std::to_string(static_cast<float>(attr_float(n, "epsilon", 1e-5))));
  emit({{"name", name}, {"op", "layernorm"}, {"eps", std::round(e * 1e12) / 1e12}}, {source(n, n.input(0))},
       n.output(0));
}

void Importer::dropout(const onnx::NodeProto& n) {
  double p = attr_float(n, "ratio", 0.5);
  if (n.input_size() > 1 && !n.input(1).empty() && !scalar(n.input(1), &p))
    refuse_node(n, "takes its ratio from a computed tensor; meshtrain needs a constant probability");
  if (n.output_size() > 1 && consumer_count(n.output(1)) > 0) refuse_node(n, "has its mask read by another node");
  p = std::round(p * 1e6) / 1e6;
  if (!(p >= 0 && p < 1)) refuse_node(n, "has ratio " + std::to_string(p) + "; it must be from 0 to below 1");
  emit({{"name", plain_layer(n, "dropout")}, {"op", "dropout"}, {"p", p}}, {source(n, n.input(0))}, n.output(0));
}

// Pad: zero padding of nothing (PyTorch writes one before every AvgPool2d) passes its input on;
// zero padding of the height and width alike, read only by an AveragePool, becomes that pool's
// padding (counted in the divisor, as the zeros are). Anything else is refused.
void Importer::pad(const onnx::NodeProto& n) {
  std::vector<int64_t> pads = attr_ints(n, "pads");
  if (n.input_size() > 1 && !n.input(1).empty()) {
    const onnx::TensorProto* t = nullptr;
    if (auto it = constants_.find(n.input(1)); it != constants_.end()) t = it->second;
    if (auto it = initializers_.find(n.input(1)); it != initializers_.end()) t = it->second;
    if (!t) refuse_node(n, "takes its pads from a computed tensor; meshtrain needs them constant");
    pads.clear();
    for (double v : values_of(*t)) pads.push_back(static_cast<int64_t>(v));
  }
  double value = 0;
  if (n.input_size() > 2 && !n.input(2).empty() && !scalar(n.input(2), &value))
    refuse_node(n, "takes its padding value from a computed tensor");
  if (const auto* a = attr(n, "mode"); a && a->s() != "constant")
    refuse_node(n, "pads in mode '" + a->s() + "'; meshtrain pads with zeros only");
  if (attr(n, "value")) value = attr_float(n, "value", 0.0);
  bool zero = true;
  for (int64_t v : pads) zero = zero && v == 0;
  if (zero) {
    producer_[n.output(0)] = source(n, n.input(0));
    return;
  }
  const onnx::NodeProto* pool = single_consumer(n.output(0));
  const bool spatial = pads.size() == 8 && pads[0] == 0 && pads[1] == 0 && pads[4] == 0 && pads[5] == 0 &&
                       pads[2] == pads[3] && pads[2] == pads[6] && pads[2] == pads[7];
  if (!pool || pool->op_type() != "AveragePool" || !spatial || value != 0)
    refuse_node(n, "pads by " + nlohmann::json(pads).dump() + "; meshtrain takes padding as part of a Conv or an "
                   "AveragePool (zeros, the same on all four sides)");
  producer_[n.output(0)] = source(n, n.input(0));
  folded_pad_[n.output(0)] = pads[2];
}

void Importer::pool(const onnx::NodeProto& n, bool max) {
  int64_t k, s, p;
  window(n, &k, &s, &p);
  if (auto it = folded_pad_.find(n.input(0)); it != folded_pad_.end()) {
    if (p != 0) refuse_node(n, "pads twice (its own pads and a Pad before it)");
    p = it->second;
    if (p > k / 2) refuse_node(n, "is padded by " + std::to_string(p) + " for a kernel of " + std::to_string(k) +
                                  "; meshtrain pads a window by at most half its size");
    if (attr_int(n, "count_include_pad", 0) == 0) {
      // The zeros were padded as values, so they count, whatever the pool's own flag says.
      emit({{"name", plain_layer(n, "avgpool")}, {"op", "avgpool2d"}, {"kernel_size", k}, {"stride", s},
            {"padding", p}},
           {source(n, n.input(0))}, n.output(0));
      return;
    }
  }
  if (attr_int(n, "ceil_mode", 0) != 0) refuse_node(n, "has ceil_mode 1; meshtrain's pools round down (ceil_mode=False)");
  if (max) {
    if (attr_int(n, "storage_order", 0) != 0) refuse_node(n, "has storage_order 1");
    if (n.output_size() > 1 && consumer_count(n.output(1)) > 0) refuse_node(n, "has its indices read by another node");
  } else if (p > 0 && attr_int(n, "count_include_pad", 0) != 1) {
    refuse_node(n, "leaves the padding out of the divisor (count_include_pad=False); meshtrain's avgpool2d counts it, "
                   "as PyTorch's AvgPool2d does by default");
  }
  emit({{"name", plain_layer(n, max ? "maxpool" : "avgpool")}, {"op", max ? "maxpool2d" : "avgpool2d"},
        {"kernel_size", k}, {"stride", s}, {"padding", p}},
       {source(n, n.input(0))}, n.output(0));
}

Imported Importer::run() {
  for (const auto& t : g_.initializer()) initializers_[t.name()] = &t;
  for (int i = 0; i < g_.node_size(); ++i) {
    const auto& n = g_.node(i);
    for (const auto& in : n.input())
      if (!in.empty()) consumers_[in].push_back(i);
    if (n.op_type() == "Constant") {
      const auto* v = attr(n, "value");
      if (!v || !v->has_t()) refuse_node(n, "holds no tensor 'value' (meshtrain reads constants given as tensors)");
      constants_[n.output(0)] = &v->t();
    }
  }

  // The input: one image batch (N, C, H, W) with C, H and W fixed.
  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const auto& in : g_.input())
    if (!initializers_.count(in.name())) inputs.push_back(&in);
  if (inputs.size() != 1)
    throw OnnxError(path_ + ": the graph has " + std::to_string(inputs.size()) + " inputs besides its weights; "
                    "meshtrain trains a network of one input, a batch of images (N, C, H, W)");
  const auto& in = *inputs[0];
  const auto& tt = in.type().tensor_type();
  if (tt.elem_type() != onnx::TensorProto::FLOAT)
    throw OnnxError(path_ + ": the input '" + in.name() + "' is not float32; export with a float32 example input");
  if (tt.shape().dim_size() != 4)
    throw OnnxError(path_ + ": the input '" + in.name() + "' has " + std::to_string(tt.shape().dim_size()) +
                    " dimensions; meshtrain's image models take (N, C, H, W)");
  Shape chw;
  const char* axis_names[] = {"batch", "channels", "height", "width"};
  for (int d = 1; d < 4; ++d) {
    const auto& dim = tt.shape().dim(d);
    if (!dim.has_dim_value() || dim.dim_value() <= 0)
      throw OnnxError(path_ + ": the input '" + in.name() + "' has a dynamic " + axis_names[d] + " (dimension " +
                      std::to_string(d) + (dim.has_dim_param() ? ", '" + dim.dim_param() + "'" : std::string()) +
                      "), which meshtrain cannot fix: it trains one image size; export without dynamic_axes for it "
                      "(only the batch, dimension 0, may be dynamic)");
    chw.push_back(dim.dim_value());
  }
  producer_[in.name()] = "input";

  if (g_.output_size() != 1)
    throw OnnxError(path_ + ": the graph has " + std::to_string(g_.output_size()) +
                    " outputs; meshtrain trains a classifier with one output, the logits (N, classes)");

  for (int i = 0; i < g_.node_size(); ++i) {
    const auto& n = g_.node(i);
    if (done_.count(&n)) continue;
    const std::string& op = n.op_type();
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      refuse_node(n, "is in the op domain '" + n.domain() + "'; meshtrain maps the standard ONNX ops " + kSupported);
    if (op == "Constant") continue;
    if (op == "Conv") {
      conv(n);
    } else if (op == "BatchNormalization") {
      batchnorm(n);
    } else if (op == "Relu") {
      emit({{"name", plain_layer(n, "relu")}, {"op", "relu"}}, {source(n, n.input(0))}, n.output(0));
    } else if (op == "Gelu") {
      const auto* a = attr(n, "approximate");
      nlohmann::json l = {{"name", plain_layer(n, "gelu")}, {"op", "gelu"}};
      if (a && a->s() == "tanh") l["approximate"] = "tanh";
      emit(l, {source(n, n.input(0))}, n.output(0));
    } else if (op == "MaxPool" || op == "AveragePool") {
      pool(n, op == "MaxPool");
    } else if (op == "GlobalAveragePool") {
      emit({{"name", plain_layer(n, "avgpool")}, {"op", "global_avgpool2d"}}, {source(n, n.input(0))}, n.output(0));
    } else if (op == "Flatten") {
      if (attr_int(n, "axis", 1) != 1) refuse_node(n, "flattens from axis " + std::to_string(attr_int(n, "axis", 1)) +
                                                      "; meshtrain's flatten keeps the batch (axis 1, torch.flatten(x, 1))");
      emit({{"name", plain_layer(n, "flatten")}, {"op", "flatten"}}, {source(n, n.input(0))}, n.output(0));
    } else if (op == "Gemm") {
      gemm(n);
    } else if (op == "MatMul") {
      if (!matmul(n)) refuse_node(n, "multiplies two activations; meshtrain maps a MatMul by a weight (a Linear layer)");
    } else if (op == "Add") {
      if (is_constant(n.input(0)) || is_constant(n.input(1)))
        refuse_node(n, "adds a constant or weight to an activation; meshtrain's add sums layer outputs (a residual), "
                       "and a bias belongs to its Linear or Conv");
      emit({{"name", plain_layer(n, "add")}, {"op", "add"}}, {source(n, n.input(0)), source(n, n.input(1))},
           n.output(0));
    } else if (op == "Concat") {
      const int64_t axis = attr_int(n, "axis", 1);
      if (axis != 1 && axis != -3) refuse_node(n, "joins along axis " + std::to_string(axis) +
                                                  "; meshtrain's concat joins feature maps along the channels (axis 1)");
      std::vector<std::string> from;
      for (const auto& x : n.input()) from.push_back(source(n, x));
      emit({{"name", plain_layer(n, "concat")}, {"op", "concat"}}, from, n.output(0));
    } else if (op == "Dropout") {
      dropout(n);
    } else if (op == "LayerNormalization") {
      layernorm(n);
    } else if (op == "Pad") {
      pad(n);
    } else if (op == "Identity") {
      producer_[n.output(0)] = source(n, n.input(0));
      if (n.output(0) == g_.output(0).name()) last_output_ = n.output(0);
    } else if (op == "Div" && erf_gelu(n)) {
    } else if (op == "ReduceMean" && layernorm_pattern(n)) {
    } else if (op == "Transpose" && single_consumer(n.output(0)) && single_consumer(n.output(0))->op_type() == "MatMul") {
      // the weight of the MatMul that reads it: taken there
    } else {
      refuse_node(n, "is not an op meshtrain can train; it maps " + std::string(kSupported) +
                         " (docs/from_pytorch.md lists them with the attributes each takes)");
    }
  }
  if (layers_.empty()) throw OnnxError(path_ + ": the graph has no layers meshtrain maps");
  if (last_output_ != g_.output(0).name())
    throw OnnxError(path_ + ": the graph's output '" + g_.output(0).name() + "' is not the last layer's output; "
                    "meshtrain trains the logits the last node computes");
  // The classes: the output's second dimension, else the last Linear's width (the graph's own
  // checks then hold the logits to that shape).
  int64_t classes = 0;
  const auto& oshape = g_.output(0).type().tensor_type().shape();
  if (oshape.dim_size() == 2 && oshape.dim(1).has_dim_value()) classes = oshape.dim(1).dim_value();
  for (auto it = layers_.rbegin(); it != layers_.rend() && classes == 0; ++it)
    if ((*it)["op"] == "linear") classes = (*it)["out_features"].get<int64_t>();
  if (classes < 2)
    throw OnnxError(path_ + ": the output '" + g_.output(0).name() + "' is not the logits of a classifier, (N, classes) "
                    "with 2 or more classes; meshtrain applies the cross-entropy itself, so export the logits, not a "
                    "softmax or a loss");

  // The JSON: "from" only where a layer does not read the one before it.
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto& l = layers_[i];
    const auto& f = l["from"];
    if (f.is_string() && ((i == 0 && f == "input") || (i > 0 && f == layers_[i - 1]["name"]))) l.erase("from");
  }
  std::string stem = std::filesystem::path(path_).stem().string();
  Imported out;
  out.graph = {{"name", stem.empty() ? "onnx" : stem},
               {"input", {{"image", chw}, {"classes", classes}}},
               {"layers", layers_}};
  out.weights = std::move(weights_);
  return out;
}

}  // namespace

Imported import_onnx(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw OnnxError("the ONNX file " + path + (std::filesystem::exists(path, ec) ? " is not a regular file" : " does not exist") +
                    "; give the file torch.onnx.export wrote");
  std::ifstream f(path, std::ios::binary);
  std::stringstream bytes;
  bytes << f.rdbuf();
  if (!f.good() && !f.eof()) throw OnnxError("cannot read the ONNX file " + path);
  onnx::ModelProto m;
  const std::string data = bytes.str();
  if (data.empty() || !m.ParseFromString(data) || !m.has_graph() || m.graph().node_size() == 0 || m.ir_version() <= 0)
    throw OnnxError(path + " is not an ONNX model (" +
                    (data.empty() ? std::string("the file is empty") : "it does not parse as one: a truncated or other file") +
                    "); give a file written by torch.onnx.export");
  for (const auto& op : m.opset_import())
    if ((op.domain().empty() || op.domain() == "ai.onnx") && (op.version() < 9 || op.version() > 20))
      throw OnnxError(path + " uses ONNX opset " + std::to_string(op.version()) +
                      "; meshtrain reads opsets 9 to 20 (torch.onnx.export's opset_version)");
  return Importer(path, m).run();
}

model::Graph read_onnx_graph(const std::string& path) {
  Imported im = import_onnx(path);
  model::Graph g = model::parse_graph(im.graph, "ONNX file " + path);
  g.initial = std::make_shared<const std::vector<std::pair<std::string, Tensor>>>(std::move(im.weights));
  return g;
}

void register_onnx_reader() { model::set_onnx_reader(&read_onnx_graph); }

}  // namespace meshtrain::onnx_import
