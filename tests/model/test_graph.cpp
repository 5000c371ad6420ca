// Layer graphs (model/graph.h): reading, shapes, units, channel pairing, and every malformed
// graph refused with a sentence naming the layer and the field.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "meshtrain/kernels/flops.h"
#include "meshtrain/model/builder.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/graph.h"
#include "meshtrain/model/spec.h"

namespace meshtrain::model {
namespace {

using json = nlohmann::json;

json layer(const std::string& name, const std::string& op, json fields = json::object()) {
  fields["name"] = name, fields["op"] = op;
  return fields;
}

json with(json j, const json& more) {
  j.update(more);
  return j;
}

json graph_of(json layers, json input = {{"image", {1, 28, 28}}, {"classes", 10}}) {
  return {{"name", "g"}, {"input", input}, {"layers", layers}};
}

// The refusal of `j`: its message, or "" when it is accepted.
std::string refusal(const json& j) {
  try {
    parse_graph(j, "model file g.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

json examples_graph(const std::string& file) {
  std::ifstream in(std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/" + file);
  return json::parse(in);
}

double param_count(const CNNConfig& cfg) {
  double n = 0;
  for (const auto& [name, shape] : cnn_param_shapes(cfg)) n += static_cast<double>(shape_numel(shape));
  return n;
}

TEST(Graph, ParameterCountsAgainstAHandCount) {
  // vgg-mini: conv 1->32 3x3 with bias (288 + 32), batch norm (2 x 32), the 1x1 skip without
  // bias (32 x 32), and the linear from 32 x 14 x 14 to 10 (6272 x 10 + 10).
  EXPECT_EQ(param_count(cnn_config(std::make_shared<const Graph>(parse_graph(examples_graph("vgg-mini.json"), "vgg")))),
            320 + 64 + 1024 + 62730);
  // mlp3: 784 -> 256 -> 128 -> 10, each with a bias.
  EXPECT_EQ(param_count(cnn_config(std::make_shared<const Graph>(parse_graph(examples_graph("mlp3.json"), "mlp")))),
            784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  // cnn-small: conv1 (no bias) 9 x 32, bn1 64, conv2 9 x 32 x 64, bn2 128, fc1 3136 x 128 + 128,
  // fc2 1280 + 10.
  EXPECT_EQ(param_count(cnn_config("cnn-small")), 288 + 64 + 18432 + 128 + 401536 + 1290);
}

TEST(Graph, ShapesAreInferredLayerByLayer) {
  const Graph g = parse_graph(examples_graph("vgg-mini.json"), "vgg");
  const std::vector<Shape> s = infer_shapes(g, g.image);
  ASSERT_EQ(s.size(), g.layers.size());
  EXPECT_EQ(s[0], (Shape{32, 28, 28}));  // 3x3, padding 1
  EXPECT_EQ(s[3], (Shape{32, 14, 14}));  // 2x2 max pool, stride 2
  EXPECT_EQ(s[5], (Shape{32, 14, 14}));  // the sum
  EXPECT_EQ(s[6], (Shape{32 * 14 * 14}));
  EXPECT_EQ(s.back(), (Shape{10}));
  // Scaled images: every map scales.
  EXPECT_EQ(infer_shapes(g, {1, 56, 56})[3], (Shape{32, 28, 28}));
  // A strided convolution: (H + 2p - k) / s + 1.
  const Graph h = parse_graph(graph_of({layer("c", "conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"stride", 2}}),
                                        layer("f", "flatten"), layer("fc", "linear", {{"out_features", 10}})}),
                              "g");
  EXPECT_EQ(infer_shapes(h, h.image)[0], (Shape{4, 13, 13}));
}

TEST(Graph, UnitsAreWhereOneTensorIsLive) {
  // vgg-mini gives no units: a cut may fall after every layer but the skip (features.3, which
  // the sum reads too, is live across it), so the skip and the sum make one unit.
  const Graph g = parse_graph(examples_graph("vgg-mini.json"), "vgg");
  EXPECT_EQ(unit_starts(g), (std::vector<int>{0, 1, 2, 3, 4, 6, 7, 8}));
  // The named models keep their units: cnn-small's two blocks and classifier, resnet-small's stem,
  // three residual blocks and classifier, inception-small's stem, two blocks and classifier.
  EXPECT_EQ(unit_starts(*named_graph("cnn-small")).size() - 1, 3u);
  EXPECT_EQ(unit_starts(*named_graph("resnet-small")).size() - 1, 5u);
  EXPECT_EQ(unit_starts(*named_graph("inception-small")).size() - 1, 4u);
}

TEST(Graph, ConvolutionsPairThroughPerChannelLayersOnly) {
  const Graph g = *named_graph("resnet-small");
  const ChannelSplits s = channel_splits(g);
  auto at = [&](const std::string& name) {
    for (size_t i = 0; i < g.layers.size(); ++i)
      if (g.layers[i].name == name) return i;
    ADD_FAILURE() << name;
    return size_t{0};
  };
  // A residual block's conv1 (filters) then conv2 (channels); the stem's output is read twice
  // (the block and its shortcut), so the stem stays whole; the shortcut's 1x1 too.
  EXPECT_FALSE(s.out_split[at("conv1")]);
  EXPECT_TRUE(s.out_split[at("layer2.0.conv1")]);
  EXPECT_TRUE(s.in_split[at("layer2.0.bn1")]);
  EXPECT_TRUE(s.in_split[at("layer2.0.conv2")]);
  EXPECT_FALSE(s.out_split[at("layer2.0.conv2")]);
  EXPECT_FALSE(s.out_split[at("layer2.0.downsample.0")]);
  // Blocked activations: every layer of resnet-small takes them; a max pool does not.
  EXPECT_TRUE(graph_takes_blocked(g));
  EXPECT_FALSE(graph_takes_blocked(*named_graph("cnn-small")));
}

TEST(Graph, LinearLayersPairThroughReLUsOnly) {
  // mlp3: fc1 -> relu -> fc2 is Megatron's column-then-row pair; fc3 (after fc2's relu) would be
  // a column whose row is missing, so it stays whole.
  const Graph g = parse_graph(examples_graph("mlp3.json"), "mlp");
  const ChannelSplits s = channel_splits(g);
  EXPECT_TRUE(s.out_split[1]);                       // fc1: columns
  EXPECT_TRUE(s.in_split[2] && s.out_split[2]);      // act1 on its rank's features
  EXPECT_TRUE(s.in_split[3] && !s.out_split[3]);     // fc2: rows
  EXPECT_FALSE(s.in_split[5] || s.out_split[5]);     // fc3: whole
}

// The FLOPs a graph's layers are said to take (model show's column) against what the matrix
// products and convolutions they call count (kernels/flops.h), for a forward of 3 samples.
TEST(Graph, ForwardFlopsAreWhatTheKernelsCount) {
  for (const char* file : {"vgg-mini.json", "branchy.json", "mlp3.json"}) {
    const auto g = std::make_shared<const Graph>(parse_graph(examples_graph(file), file));
    const std::vector<Shape> shapes = infer_shapes(*g, g->image);
    double said = 0;
    for (size_t i = 0; i < g->layers.size(); ++i) said += forward_flops(*g, shapes, g->image, i);
    CNNStage stage(cnn_config(g), 7, 0, -1, true, true);
    const int64_t rows = 3;
    std::vector<float> images(static_cast<size_t>(rows * shape_numel(g->image)), 0.5f);
    std::vector<int32_t> targets(rows, 1);
    MicroBatch mb{.images = images.data(), .targets = targets.data(), .rows = rows};
    nn::Context ctx(1, /*training=*/false);
    kernels::reset_flops_counted_thread();
    StageResult r;
    stage.forward(ctx, Tensor(), mb, &r, nullptr);
    EXPECT_EQ(kernels::flops_counted_thread(), said * rows) << file;
    EXPECT_GT(said, 0) << file;
  }
}

TEST(Graph, ANamedModelIsFoundByNameAndAUserGraphTravelsWithItsConfig) {
  EXPECT_EQ(cnn_config_names(), (std::vector<std::string>{"cnn-small", "inception-small", "resnet-small"}));
  EXPECT_EQ(cnn_config("resnet-small").to_json().count("graph"), 0u);
  const CNNConfig user = cnn_config(std::make_shared<const Graph>(parse_graph(examples_graph("mlp3.json"), "mlp")));
  const json j = user.to_json();
  ASSERT_TRUE(j.contains("graph"));
  EXPECT_EQ(parse_graph(j["graph"], "again").layers.size(), 6u);
  EXPECT_THROW(cnn_config("vgg-mini"), std::invalid_argument);
}

// The builder's calls mirror the file's fields: vgg-mini built in code is vgg-mini read from its
// file (the same layers, shapes and parameters), and a bad graph built in code is refused with
// the file's sentence.
TEST(Graph, TheBuilderMakesTheGraphTheFileDescribes) {
  GraphBuilder b("vgg-mini", {1, 28, 28}, 10);
  b.conv2d("features.0", {.out_channels = 32, .kernel_size = 3, .padding = 1})
      .batchnorm2d("features.1")
      .relu("features.2")
      .maxpool2d("features.3", {.kernel_size = 2})
      .conv2d("skip", {.out_channels = 32, .kernel_size = 1, .bias = false}, "features.3")
      .add("sum", {"features.3", "skip"})
      .flatten("flat")
      .linear("classifier.0", {.out_features = 10});
  const auto built = b.build();
  const Graph file = parse_graph(examples_graph("vgg-mini.json"), "vgg");
  ASSERT_EQ(built->layers.size(), file.layers.size());
  for (size_t i = 0; i < file.layers.size(); ++i) {
    EXPECT_EQ(built->layers[i].name, file.layers[i].name);
    EXPECT_EQ(built->layers[i].op, file.layers[i].op);
    EXPECT_EQ(built->layers[i].from, file.layers[i].from);
  }
  EXPECT_EQ(infer_shapes(*built, built->image), infer_shapes(file, file.image));
  EXPECT_EQ(cnn_param_shapes(cnn_config(built)), cnn_param_shapes(cnn_config(std::make_shared<const Graph>(file))));

  GraphBuilder bad("bad", {1, 28, 28}, 10);
  bad.conv2d("c", {.out_channels = 8, .kernel_size = 3, .padding = 1}).linear("fc", {.out_features = 10});
  try {
    bad.build();
    ADD_FAILURE() << "a linear after a feature map was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 'fc' (linear) takes features (N, F)"), std::string::npos) << e.what();
  }
}

struct Bad {
  const char* what;
  json graph;
  std::vector<std::string> says;  // every piece must be in the refusal
};

TEST(Graph, MalformedGraphsAreRefusedNamingTheLayerAndTheField) {
  const json conv = {{"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}};
  const json fc = {{"out_features", 10}};
  const std::vector<Bad> cases = {
      {"not an object", json::array({1, 2}), {"must be a JSON object"}},
      {"no layers", graph_of(json::array()), {"\"layers\" must be a non-empty array"}},
      {"a layer without op", graph_of({{{"name", "a"}}}), {"layer 0 'a'", "no \"op\""}},
      {"an unknown op", graph_of({layer("a", "conv3d")}), {"layer 0 'a'", "unknown op 'conv3d'", "conv2d"}},
      {"an unknown field",
       graph_of({layer("a", "conv2d", {{"out_channels", 8}, {"kernel", 3}})}),
       {"layer 0 'a'", "unknown field \"kernel\"", "kernel_size"}},
      {"a from naming nothing",
       graph_of({layer("a", "flatten"), layer("b", "linear", {{"out_features", 10}, {"from", "x"}})}),
       {"layer 1 'b'", "reads 'x', which names no layer"}},
      {"a from naming a later layer (a cycle)",
       graph_of({layer("a", "conv2d", {{"out_channels", 8}, {"kernel_size", 1}, {"from", "b"}}),
                 layer("b", "relu"), layer("f", "flatten"), layer("fc", "linear", fc)}),
       {"layer 0 'a'", "reads 'b', a later layer"}},
      {"a from naming itself", graph_of({layer("a", "relu", {{"from", "a"}})}), {"layer 0 'a'", "itself"}},
      {"an add of 8 and 16 channels",
       graph_of({layer("a", "conv2d", conv), layer("b", "conv2d", {{"out_channels", 16}, {"kernel_size", 1}, {"from", "a"}}),
                 layer("s", "add", {{"from", {"a", "b"}}}), layer("f", "flatten"), layer("fc", "linear", fc)}),
       {"layer 2 's'", "(N, 8, 28, 28)", "(N, 16, 28, 28)", "one shape"}},
      {"a linear after a feature map",
       graph_of({layer("a", "conv2d", conv), layer("fc", "linear", fc)}),
       {"layer 1 'fc'", "(N, 8, 28, 28)", "put a flatten"}},
      {"a map that shrinks below 1",
       graph_of({layer("a", "conv2d", {{"out_channels", 8}, {"kernel_size", 7}}), layer("f", "flatten"),
                 layer("fc", "linear", fc)},
                {{"image", {1, 4, 4}}, {"classes", 10}}),
       {"layer 0 'a'", "shrink below 1"}},
      {"duplicate names", graph_of({layer("a", "flatten"), layer("a", "linear", fc)}), {"layer 1 'a'", "unique"}},
      {"out_channels 0", graph_of({layer("a", "conv2d", {{"out_channels", 0}, {"kernel_size", 1}})}),
       {"layer 0 'a'", "\"out_channels\" is 0, less than 1"}},
      {"a kernel beyond range", graph_of({layer("a", "conv2d", {{"out_channels", 8}, {"kernel_size", 1e12}})}),
       {"layer 0 'a'", "\"kernel_size\""}},
      {"a fractional count", graph_of({layer("f", "flatten"), layer("a", "linear", {{"out_features", 2.5}})}),
       {"layer 1 'a'", "\"out_features\" is 2.5"}},
      {"padding beyond half the kernel",
       graph_of({layer("a", "conv2d", {{"out_channels", 8}, {"kernel_size", 3}, {"padding", 2}})}),
       {"layer 0 'a'", "\"padding\" is 2, more than 1"}},
      {"a layer nothing reads",
       graph_of({layer("a", "conv2d", conv), layer("b", "relu", {{"from", "input"}}), layer("f", "flatten", {{"from", "a"}}),
                 layer("fc", "linear", fc)}),
       {"layer 1 'b'", "read by no layer"}},
      {"logits of the wrong size", graph_of({layer("f", "flatten"), layer("fc", "linear", {{"out_features", 3}})}),
       {"layer 1 'fc'", "(N, 10)", "out_features 10"}},
      {"tokens input", graph_of({layer("f", "flatten")}, {{"tokens", 8}}), {"\"tokens\"", "GPT config"}},
      {"a unit cut where two tensors are live",
       graph_of({layer("a", "conv2d", with(conv, {{"unit", "u1"}})), layer("b", "conv2d", with(conv, {{"unit", "u1"}})),
                 layer("c", "conv2d", with(conv, {{"unit", "u2"}})),
                 layer("s", "add", {{"from", {"a", "c"}}, {"unit", "u2"}}), layer("f", "flatten"), layer("fc", "linear", fc)}),
       {"layer 2 'c'", "cannot cut there"}},
  };
  for (const Bad& c : cases) {
    const std::string m = refusal(c.graph);
    EXPECT_FALSE(m.empty()) << c.what << ": accepted";
    for (const std::string& piece : c.says) EXPECT_NE(m.find(piece), std::string::npos) << c.what << ": " << m;
  }
}

TEST(Graph, AHundredThousandLayersAreRefusedWithoutBuildingThem) {
  json layers = json::array();
  for (int i = 0; i < 100'000; ++i) {
    std::string name = "r";
    name += std::to_string(i);
    layers.push_back(layer(name, "relu"));
  }
  const std::string m = refusal(graph_of(layers));
  EXPECT_NE(m.find("100000 layers, more than the 10000"), std::string::npos) << m;
}

TEST(Graph, AModelFileIsAcceptedWhereverAModelNameIs) {
  const std::string path = std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/branchy.json";
  const auto spec = model_spec(path);
  EXPECT_EQ(spec->name(), "branchy");
  EXPECT_EQ(spec->family(), "cnn");
  ASSERT_NE(spec->cnn(), nullptr);
  // Its concat of branches from one source is a block of parallel branches.
  EXPECT_EQ(cnn_branch_blocks(*spec->cnn()), (std::map<std::string, size_t>{{"mix", 3}}));
}

}  // namespace
}  // namespace meshtrain::model
