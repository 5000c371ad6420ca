// ONNX files as layer graphs (onnx/onnx_import.h). The files are built here with the ONNX
// protobuf API in the forms torch.onnx.export writes (opset 14: GELU as its Erf expansion,
// LayerNorm as its ReduceMean expansion, Linear as Gemm with transB = 1), so the test needs no
// PyTorch; tests/onnx/round_trip.py exports real modules where PyTorch is installed.
#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "meshtrain/model/graph.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/onnx/onnx_import.h"
#include "temp_dir.h"

namespace meshtrain {
namespace {

using testing::TempDir;

// A graph under construction, in torch.onnx.export's shapes.
struct Builder {
  onnx::ModelProto m;
  onnx::GraphProto* g = m.mutable_graph();
  int counter = 0;
  float next = 0.f;  // weights: 0.01, 0.02, ... so each element is told apart

  Builder(const Builder& o) : m(o.m), g(m.mutable_graph()), counter(o.counter), next(o.next) {}
  Builder(std::vector<int64_t> input = {4, 1, 28, 28}, bool dynamic_h = false) {
    m.set_ir_version(7);
    m.set_producer_name("pytorch");
    auto* op = m.add_opset_import();
    op->set_version(14);
    auto* in = g->add_input();
    in->set_name("input.1");
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (size_t d = 0; d < input.size(); ++d) {
      auto* dim = tt->mutable_shape()->add_dim();
      if (dynamic_h && d == 2)
        dim->set_dim_param("height");
      else
        dim->set_dim_value(input[d]);
    }
  }
  std::vector<float> init(const std::string& name, std::vector<int64_t> dims) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : dims) t->add_dims(d), n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = (next += 0.01f);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    return v;
  }
  std::string constant(float x) {
    auto* n = g->add_node();
    const std::string out = "/Constant_" + std::to_string(counter++) + "_output_0";
    n->set_op_type("Constant");
    n->set_name(out.substr(0, out.size() - 9));
    n->add_output(out);
    auto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    a->mutable_t()->set_raw_data(std::string(reinterpret_cast<const char*>(&x), 4));
    return out;
  }
  onnx::NodeProto* node(const std::string& op, const std::string& name, std::vector<std::string> in, int outs = 1) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (auto& i : in) n->add_input(i);
    for (int o = 0; o < outs; ++o) n->add_output(name + "_output_" + std::to_string(o));
    return n;
  }
  static void ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void num(onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void real(onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  std::string conv(const std::string& mod, const std::string& x, int64_t ic, int64_t oc, int64_t k, int64_t pad) {
    init(mod + ".weight", {oc, ic, k, k});
    init(mod + ".bias", {oc});
    auto* n = node("Conv", "/" + mod + "/Conv", {x, mod + ".weight", mod + ".bias"});
    ints(n, "dilations", {1, 1});
    num(n, "group", 1);
    ints(n, "kernel_shape", {k, k});
    ints(n, "pads", {pad, pad, pad, pad});
    ints(n, "strides", {1, 1});
    return n->output(0);
  }
  std::string bn(const std::string& mod, const std::string& x, int64_t c) {
    for (const char* s : {"weight", "bias", "running_mean", "running_var"}) init(mod + "." + s, {c});
    auto* n = node("BatchNormalization", "/" + mod + "/BatchNormalization",
                   {x, mod + ".weight", mod + ".bias", mod + ".running_mean", mod + ".running_var"}, 3);
    real(n, "epsilon", 1e-5f);
    real(n, "momentum", 0.9f);
    num(n, "training_mode", 1);
    return n->output(0);
  }
  std::string gemm(const std::string& mod, const std::string& x, int64_t in, int64_t out) {
    init(mod + ".weight", {out, in});
    init(mod + ".bias", {out});
    auto* n = node("Gemm", "/" + mod + "/Gemm", {x, mod + ".weight", mod + ".bias"});
    real(n, "alpha", 1.f);
    real(n, "beta", 1.f);
    num(n, "transB", 1);
    return n->output(0);
  }
  // torch.nn.functional.gelu at opset 14.
  std::string gelu(const std::string& x) {
    const std::string d = node("Div", "/Div", {x, constant(std::sqrt(2.f))})->output(0);
    const std::string e = node("Erf", "/Erf", {d})->output(0);
    const std::string a = node("Add", "/Add_9", {e, constant(1.f)})->output(0);
    const std::string m = node("Mul", "/Mul", {x, a})->output(0);
    return node("Mul", "/Mul_1", {m, constant(0.5f)})->output(0);
  }
  // torch.nn.LayerNorm at opset 14.
  std::string layernorm(const std::string& mod, const std::string& x, int64_t f) {
    init(mod + ".weight", {f});
    init(mod + ".bias", {f});
    auto* r1 = node("ReduceMean", "/" + mod + "/ReduceMean", {x});
    ints(r1, "axes", {-1});
    const std::string s = node("Sub", "/" + mod + "/Sub", {x, r1->output(0)})->output(0);
    const std::string p = node("Pow", "/" + mod + "/Pow", {s, constant(2.f)})->output(0);
    auto* r2 = node("ReduceMean", "/" + mod + "/ReduceMean_1", {p});
    ints(r2, "axes", {-1});
    const std::string a = node("Add", "/" + mod + "/Add", {r2->output(0), constant(1e-5f)})->output(0);
    const std::string q = node("Sqrt", "/" + mod + "/Sqrt", {a})->output(0);
    const std::string dv = node("Div", "/" + mod + "/Div", {s, q})->output(0);
    const std::string mu = node("Mul", "/" + mod + "/Mul", {dv, mod + ".weight"})->output(0);
    return node("Add", "/" + mod + "/Add_1", {mu, mod + ".bias"})->output(0);
  }
  void output(const std::string& x, int64_t classes) {
    auto* o = g->add_output();
    o->set_name(x);
    auto* tt = o->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_value(4);
    tt->mutable_shape()->add_dim()->set_dim_value(classes);
  }
  void save(const std::string& path) const {
    std::ofstream f(path, std::ios::binary);
    ASSERT_TRUE(m.SerializeToOstream(&f));
  }
};

// conv-bn-relu, two branches (1x1 and 3x3) joined by a concat, a residual add, max pool,
// flatten, Linear, GELU, LayerNorm, Linear: every mapping but the pools' variants.
Builder branchy_net() {
  Builder b;
  std::string x = b.conv("stem", "input.1", 1, 4, 3, 1);
  x = b.bn("stem_bn", x, 4);
  x = b.node("Relu", "/Relu", {x})->output(0);
  const std::string l = b.conv("left", x, 4, 2, 1, 0);
  const std::string r = b.conv("right", x, 4, 2, 3, 1);
  auto* cat = b.node("Concat", "/Concat", {l, r});
  Builder::num(cat, "axis", 1);
  x = b.node("Add", "/Add", {x, cat->output(0)})->output(0);
  auto* pool = b.node("MaxPool", "/pool/MaxPool", {x});
  Builder::ints(pool, "kernel_shape", {2, 2});
  Builder::ints(pool, "strides", {2, 2});
  Builder::ints(pool, "pads", {0, 0, 0, 0});
  Builder::num(pool, "ceil_mode", 0);
  auto* flat = b.node("Flatten", "/Flatten", {pool->output(0)});
  Builder::num(flat, "axis", 1);
  x = b.gemm("fc1", flat->output(0), 4 * 14 * 14, 6);
  x = b.gelu(x);
  x = b.layernorm("norm", x, 6);
  x = b.gemm("head", x, 6, 10);
  b.output(x, 10);
  return b;
}

TEST(OnnxImport, MapsTheExportedFormsOntoTheLayerVocabulary) {
  TempDir dir("onnx");
  const std::string path = dir.file("branchy.onnx");
  Builder b = branchy_net();
  b.save(path);
  const onnx_import::Imported im = onnx_import::import_onnx(path);
  const auto& layers = im.graph["layers"];
  std::vector<std::string> ops, names;
  for (const auto& l : layers) ops.push_back(l["op"]), names.push_back(l["name"]);
  EXPECT_EQ(ops, (std::vector<std::string>{"conv2d", "batchnorm2d", "relu", "conv2d", "conv2d", "concat", "add",
                                           "maxpool2d", "flatten", "linear", "gelu", "layernorm", "linear"}));
  EXPECT_EQ(names[0], "stem");
  EXPECT_EQ(names[1], "stem_bn");
  EXPECT_EQ(names[3], "left");
  EXPECT_EQ(names[7], "pool");
  EXPECT_EQ(names[11], "norm");
  EXPECT_EQ(im.graph["input"]["image"], nlohmann::json({1, 28, 28}));
  EXPECT_EQ(im.graph["input"]["classes"], 10);
  EXPECT_EQ(layers[1]["momentum"], 0.1);  // ONNX's 0.9 is PyTorch's 0.1
  EXPECT_EQ(layers[1]["eps"], 1e-5);
  EXPECT_EQ(layers[11]["eps"], 1e-5);
  EXPECT_EQ(layers[4]["padding"], 1);
  EXPECT_EQ(layers[5]["from"], nlohmann::json({"left", "right"}));
  EXPECT_EQ(layers[6]["from"], nlohmann::json({"relu", "concat"}));
  EXPECT_EQ(layers[4]["from"], "relu");
  EXPECT_FALSE(layers[2].contains("from"));  // reads the layer before it
  EXPECT_EQ(layers[10].value("approximate", "none"), "none");

  // The weights under the module's names; Linear's (out, in) transposed to meshtrain's (in, out).
  std::map<std::string, Tensor> w(im.weights.begin(), im.weights.end());
  EXPECT_EQ(w.size(), 2u + 4u + 2u + 2u + 2u + 2u + 2u);
  ASSERT_TRUE(w.count("stem_bn.running_var"));
  const auto& fc1 = w.at("fc1.weight");
  ASSERT_EQ(fc1.shape(), (Shape{784, 6}));
  for (const auto& t : b.g->initializer()) {
    if (t.name() != "fc1.weight") continue;
    const float* src = reinterpret_cast<const float*>(t.raw_data().data());
    for (int64_t o = 0; o < 6; ++o)
      for (int64_t i = 0; i < 784; ++i) ASSERT_EQ(fc1.data()[i * 6 + o], src[o * 784 + i]);
  }

  // The graph parses, its shapes meet, and its parameter set is the initializers' set.
  const model::Graph g = onnx_import::read_onnx_graph(path);
  ASSERT_TRUE(g.initial);
  onnx_import::register_onnx_reader();
  const auto spec = model::model_spec(path);
  auto names_shapes = spec->param_shapes();
  for (const auto& s : spec->buffer_shapes()) names_shapes.push_back(s);
  ASSERT_EQ(names_shapes.size(), w.size());
  for (const auto& [name, shape] : names_shapes) {
    ASSERT_TRUE(w.count(name)) << name;
    EXPECT_EQ(w.at(name).shape(), shape) << name;
  }
}

// `meshtrain model show` and a training run read the file; the step-0 weights are the file's.
TEST(OnnxImport, TrainsFromTheFilesWeightsAndImportWritesTheGraph) {
  TempDir dir("onnx");
  const std::string path = dir.file("branchy.onnx");
  branchy_net().save(path);
  auto show = testing::run_cli("model show " + path);
  ASSERT_EQ(show.code, 0) << show.output;
  EXPECT_NE(show.output.find("stem_bn.running_mean"), std::string::npos) << show.output;
  EXPECT_NE(show.output.find("stem_bn.num_batches_tracked"), std::string::npos) << show.output;

  // The same graph from the written JSON, initialised from the ONNX file, trains the same curve;
  // initialised by --seed it does not.
  const std::string json = dir.file("branchy.json");
  auto imp = testing::run_cli("import " + path + " -o " + json);
  ASSERT_EQ(imp.code, 0) << imp.output;
  auto again = testing::run_cli("import " + path + " -o " + json);  // its own file: replaced
  ASSERT_EQ(again.code, 0) << again.output;
  const std::string common = " --data fashion-mnist --steps 3 --batch 8 --data-order sequential --quiet --metrics ";
  auto a = testing::run_cli("train --model " + path + common + dir.file("a.jsonl"));
  ASSERT_EQ(a.code, 0) << a.output;
  auto b = testing::run_cli("train --model " + json + " --init-from " + path + common + dir.file("b.jsonl"));
  ASSERT_EQ(b.code, 0) << b.output;
  auto c = testing::run_cli("train --model " + path + " --init-from seed" + common + dir.file("c.jsonl"));
  ASSERT_EQ(c.code, 0) << c.output;
  auto losses = [&](const std::string& f) {
    std::vector<double> v;
    std::ifstream in(dir.file(f));
    for (std::string line; std::getline(in, line);) v.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return v;
  };
  ASSERT_EQ(losses("a.jsonl").size(), 3u);
  EXPECT_EQ(losses("a.jsonl"), losses("b.jsonl"));
  EXPECT_NE(losses("a.jsonl")[0], losses("c.jsonl")[0]);
}

// Every bad file exits 2 naming the node or the file, and writes nothing.
TEST(OnnxImport, RefusesWhatItCannotTrainBeforeAnyWork) {
  TempDir dir("onnx");
  auto refused = [&](const std::string& file, const std::string& expect) {
    const std::string metrics = dir.file("m.jsonl");
    auto r = testing::run_cli("train --model " + file + " --data fashion-mnist --steps 2 --metrics " + metrics);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(metrics)) << file;
    auto imp = testing::run_cli("import " + file + " -o " + dir.file("out.json"));
    EXPECT_EQ(imp.code, 2) << imp.output;
    EXPECT_NE(imp.output.find(expect), std::string::npos) << imp.output;
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.json")));
  };
  {  // an op outside the vocabulary
    Builder b({4, 1, 8, 8});
    auto* flat = b.node("Flatten", "/Flatten", {"input.1"});
    Builder::num(flat, "axis", 1);
    b.init("rnn.weight_ih_l0", {32, 64});
    b.node("LSTM", "/rnn/LSTM", {flat->output(0), "rnn.weight_ih_l0"}, 3);
    b.output("/rnn/LSTM_output_0", 10);
    b.save(dir.file("lstm.onnx"));
    refused(dir.file("lstm.onnx"), "node '/rnn/LSTM' (op LSTM) is not an op meshtrain can train");
  }
  {  // a dynamic height
    Builder b({4, 1, 8, 8}, /*dynamic_h=*/true);
    auto* flat = b.node("Flatten", "/Flatten", {"input.1"});
    Builder::num(flat, "axis", 1);
    b.output(b.gemm("fc", flat->output(0), 64, 10), 10);
    b.save(dir.file("dynamic.onnx"));
    refused(dir.file("dynamic.onnx"), "has a dynamic height (dimension 2, 'height')");
  }
  {  // a grouped convolution
    Builder b({4, 2, 8, 8});
    std::string x = b.conv("dw", "input.1", 1, 2, 3, 1);
    b.g->mutable_node(0)->mutable_attribute(1)->set_i(2);
    auto* flat = b.node("Flatten", "/Flatten", {x});
    Builder::num(flat, "axis", 1);
    b.output(b.gemm("fc", flat->output(0), 128, 10), 10);
    b.save(dir.file("grouped.onnx"));
    refused(dir.file("grouped.onnx"), "node '/dw/Conv' (op Conv) is a grouped convolution");
  }
  {  // truncated
    branchy_net().save(dir.file("whole.onnx"));
    std::ifstream in(dir.file("whole.onnx"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir.file("cut.onnx"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    refused(dir.file("cut.onnx"), dir.file("cut.onnx") + " is not an ONNX model");
  }
  {  // not ONNX at all
    std::ofstream(dir.file("notes.onnx")) << "these are my notes, not a network\n";
    refused(dir.file("notes.onnx"), dir.file("notes.onnx") + " is not an ONNX model");
  }
}

}  // namespace
}  // namespace meshtrain
