// Layer graphs (model/graph.h): reading, shapes, units, channel pairing, and every malformed
// graph refused with a sentence naming the layer and the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "meshtrain/kernels/flops.h"
#include "meshtrain/model/builder.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/gpt.h"
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
  // lenet-gelu: conv 5x5 1->6 (150 + 6), conv 5x5 6->16 (2400 + 16), batch norm 2 x 16, the
  // linears 400->120, 120->84, 84->10 with biases, and the layernorm's weight and bias over 120.
  EXPECT_EQ(param_count(cnn_config(std::make_shared<const Graph>(parse_graph(examples_graph("lenet-gelu.json"), "lenet")))),
            156 + 2416 + 32 + 400 * 120 + 120 + 2 * 120 + 120 * 84 + 84 + 84 * 10 + 10);
  // branchy: stem conv 3x3 1->16 without bias 144, bn 32; branch a 1x1 16->8 with bias 136;
  // branch b 1x1 16->8 without bias 128, bn 16, 5x5 8->16 with bias 3216; head 3x3 40->32 with
  // bias 11552; fc 32->10 330.
  EXPECT_EQ(param_count(cnn_config(std::make_shared<const Graph>(parse_graph(examples_graph("branchy.json"), "b")))),
            144 + 32 + 136 + 128 + 16 + 3216 + 11552 + 330);
  // resnet-cut: stem 3x3 1->16 144, bn 32; block 1 two 3x3 16->16 (2304 each) and two bns (32
  // each); block 2 3x3 16->32 4608, 3x3 32->32 9216, the 1x1 16->32 shortcut 512, three bns (64
  // each); fc 330. No convolution has a bias.
  EXPECT_EQ(param_count(cnn_config(std::make_shared<const Graph>(parse_graph(examples_graph("resnet-cut.json"), "r")))),
            144 + 32 + 2 * 2304 + 2 * 32 + 4608 + 9216 + 512 + 3 * 64 + 330);
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
  // vgg-mini gives no units: a cut may fall after every layer, the skip's too (features.3,
  // which the sum reads, crosses that cut beside it: one skip).
  const Graph g = parse_graph(examples_graph("vgg-mini.json"), "vgg");
  EXPECT_EQ(unit_starts(g), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  std::vector<int> skips(9, kNoSkip);
  skips[5] = 3;  // features.3 crosses the cut before the sum
  EXPECT_EQ(unit_skips(g), skips);
  // The named models keep their units: cnn-small's two blocks and classifier, resnet-small's stem,
  // three residual blocks and classifier, inception-small's stem, two blocks and classifier.
  EXPECT_EQ(unit_starts(*named_graph("cnn-small")).size() - 1, 3u);
  EXPECT_EQ(unit_starts(*named_graph("resnet-small")).size() - 1, 5u);
  EXPECT_EQ(unit_starts(*named_graph("inception-small")).size() - 1, 4u);
}

// A residual network without units (examples/models/resnet-cut.json): a cut may fall inside
// either residual block, one skip crossing it (the stem's output into block 1's sum, block 1's
// output into block 2's 1x1 shortcut, block 2's main path into its sum); branchy's Inception
// block stays one unit (a block of parallel branches is never cut), and where two tensors
// cross a place, nothing cuts there.
TEST(Graph, ACutMayFallWhereOneSkipCrossesIt) {
  const Graph g = parse_graph(examples_graph("resnet-cut.json"), "resnet-cut");
  std::vector<int> every(g.layers.size() + 1);
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int>(i);
  EXPECT_EQ(unit_starts(g), every);
  std::vector<int> skips(every.size(), kNoSkip);
  for (int u = 4; u <= 8; ++u) skips[static_cast<size_t>(u)] = 2;     // stem.relu, into b1.add
  for (int u = 11; u <= 15; ++u) skips[static_cast<size_t>(u)] = 9;   // b1.relu, into b2.down
  skips[16] = skips[17] = 14;                                          // b2.bn2, into b2.add
  EXPECT_EQ(unit_skips(g), skips);

  const Graph b = parse_graph(examples_graph("branchy.json"), "branchy");
  const std::vector<int> bs = unit_starts(b);
  for (int i = 5; i <= 11; ++i) EXPECT_EQ(std::count(bs.begin(), bs.end(), i), 0) << "a cut inside the block at " << i;

  // Before the sum, a's output and b's both cross beside c's: no cut there.
  const Graph two = parse_graph(
      graph_of({layer("a", "conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}}),
                layer("b", "conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}}),
                layer("c", "conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}}),
                layer("s", "add", {{"from", {"a", "b", "c"}}}), layer("f", "flatten"),
                layer("fc", "linear", {{"out_features", 10}})}),
      "g");
  EXPECT_EQ(unit_starts(two), (std::vector<int>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(unit_skips(two), (std::vector<int>{kNoSkip, kNoSkip, 0, kNoSkip, kNoSkip, kNoSkip}));
}

// The portals a pipeline needs: one skip out of a stage to one stage, one into it; a stage in
// between passes it by; a skip read on two later stages, or a stage taking one skip and sending
// another of a different shape, is refused naming the layers.
TEST(Graph, SkipPortalsCarryOneSkipAStageAndRefuseMore) {
  const Graph g = parse_graph(examples_graph("resnet-cut.json"), "resnet-cut");
  const std::vector<Shape> shapes = infer_shapes(g, g.image);
  // Cut inside block 1 (before b1.conv2): stem.relu goes from stage 0 to stage 1.
  SkipPortals p = skip_portals(g, shapes, {0, 6});
  EXPECT_EQ(p.to, (std::vector<int>{1, -1}));
  EXPECT_EQ(p.from, (std::vector<int>{-1, 0}));
  EXPECT_EQ(p.sent[0], 2);
  // Before b2.bn1 and b2.conv2: b1.relu from stage 0 straight to stage 2, past stage 1.
  p = skip_portals(g, shapes, {0, 11, 13});
  EXPECT_EQ(p.to, (std::vector<int>{2, -1, -1}));
  EXPECT_EQ(p.from, (std::vector<int>{-1, -1, 0}));
  // Stage 1 takes stem.relu and sends b1.relu: one shape, (16, 14, 14).
  p = skip_portals(g, shapes, {0, 6, 15});
  EXPECT_EQ(p.to, (std::vector<int>{1, 2, -1}));
  EXPECT_EQ(p.from, (std::vector<int>{-1, 0, 1}));
  auto refusal_of = [&](const Graph& h, const std::vector<int64_t>& first) {
    try {
      skip_portals(h, infer_shapes(h, h.image), first);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Stage 1 would take stem.relu (16 channels) and send b2.bn2 (32).
  const std::string shape = refusal_of(g, {0, 6, 16});
  EXPECT_NE(shape.find("would take the skip from 'stem.relu' and send the skip from 'b2.bn2', of another shape"),
            std::string::npos) << shape;
  EXPECT_NE(shape.find("--pp-cuts"), std::string::npos) << shape;
  // a's output read by the sums on stage 1 and on stage 2.
  const json conv = {{"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}};
  const Graph twice = parse_graph(graph_of({layer("a", "conv2d", conv), layer("b", "conv2d", conv),
                                            layer("c", "add", {{"from", {"b", "a"}}}), layer("d", "conv2d", conv),
                                            layer("e", "add", {{"from", {"d", "a"}}}), layer("f", "flatten"),
                                            layer("fc", "linear", {{"out_features", 10}})}),
                                  "g");
  EXPECT_EQ(unit_starts(twice), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  const std::string two = refusal_of(twice, {0, 2, 4});
  EXPECT_NE(two.find("the skip from 'a' crosses the pipeline cut before 'c' and is read by 'c', 'e' on 2 later stages"),
            std::string::npos) << two;
  EXPECT_EQ(refusal_of(twice, {0, 2}), "");
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

// GELU and average pooling act per channel (per feature), so pairs form through them; a
// layernorm mixes the features and ends one.
TEST(Graph, PairsFormThroughGeluAndAveragePoolingNotLayerNorm) {
  const Graph g = parse_graph(examples_graph("lenet-gelu.json"), "lenet");
  const ChannelSplits s = channel_splits(g);
  EXPECT_TRUE(s.out_split[0]);                                  // features.0: filters
  EXPECT_TRUE(s.in_split[1] && s.in_split[2]);                  // its gelu and avgpool on its channels
  EXPECT_TRUE(s.in_split[3] && !s.out_split[3]);                // features.3: channels
  EXPECT_FALSE(s.out_split[8]);                                 // classifier.0: a layernorm follows
  EXPECT_TRUE(s.out_split[11] && s.in_split[12] && s.in_split[13]);  // classifier.3 -> gelu -> classifier.5
  EXPECT_FALSE(s.out_split[13]);
  EXPECT_FALSE(graph_takes_blocked(g));  // average pooling runs on NCHW
}

// The FLOPs a graph's layers are said to take (model show's column) against what the matrix
// products and convolutions they call count (kernels/flops.h), for a forward of 3 samples.
TEST(Graph, ForwardFlopsAreWhatTheKernelsCount) {
  for (const char* file : {"vgg-mini.json", "branchy.json", "mlp3.json", "lenet-gelu.json"}) {
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

  // lenet-gelu: average pooling, both GELUs and a layernorm from the builder.
  GraphBuilder lb("lenet-gelu", {1, 28, 28}, 10);
  lb.conv2d("features.0", {.out_channels = 6, .kernel_size = 5, .padding = 2})
      .gelu("features.1")
      .avgpool2d("features.2", {.kernel_size = 2})
      .conv2d("features.3", {.out_channels = 16, .kernel_size = 5})
      .batchnorm2d("features.4")
      .gelu("features.5")
      .avgpool2d("features.6", {.kernel_size = 3, .stride = 2, .padding = 1})
      .flatten("flat")
      .linear("classifier.0", {.out_features = 120})
      .layernorm("classifier.1")
      .gelu("classifier.2")
      .linear("classifier.3", {.out_features = 84})
      .gelu("classifier.4", "tanh")
      .linear("classifier.5", {.out_features = 10});
  const Graph lenet = parse_graph(examples_graph("lenet-gelu.json"), "lenet");
  const auto lbuilt = lb.build();
  ASSERT_EQ(lbuilt->layers.size(), lenet.layers.size());
  for (size_t i = 0; i < lenet.layers.size(); ++i) {
    EXPECT_EQ(lbuilt->layers[i].op, lenet.layers[i].op) << i;
    EXPECT_EQ(lbuilt->layers[i].tanh, lenet.layers[i].tanh) << i;
    EXPECT_EQ(lbuilt->layers[i].stride, lenet.layers[i].stride) << i;
    EXPECT_EQ(lbuilt->layers[i].padding, lenet.layers[i].padding) << i;
  }
  EXPECT_EQ(infer_shapes(*lbuilt, lbuilt->image), infer_shapes(lenet, lenet.image));

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
      {"tokens without a vocabulary", graph_of({layer("f", "flatten")}, {{"tokens", 8}}), {"input.\"vocab\" is missing"}},
      {"images and tokens", graph_of({layer("f", "flatten")}, {{"tokens", 8}, {"vocab", 8}, {"classes", 2}}),
       {"input.\"classes\" is not a field of the input"}},
      {"a layernorm on a feature map", graph_of({layer("a", "conv2d", conv), layer("n", "layernorm"), layer("f", "flatten"),
                                                  layer("fc", "linear", fc)}),
       {"layer 1 'n' (layernorm)", "normalises features (N, F)", "(N, 8, 28, 28)", "batchnorm2d"}},
      {"a gelu of an unknown form", graph_of({layer("f", "flatten"), layer("g", "gelu", {{"approximate", "sigmoid"}}),
                                              layer("fc", "linear", fc)}),
       {"layer 1 'g'", "\"approximate\" is \"sigmoid\"", "\"tanh\""}},
      {"an average pool that shrinks the map below 1",
       graph_of({layer("p", "avgpool2d", {{"kernel_size", 5}}), layer("f", "flatten"), layer("fc", "linear", fc)},
                {{"image", {1, 4, 4}}, {"classes", 10}}),
       {"layer 0 'p' (avgpool2d)", "shrink below 1"}},
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


// ---- token models: a transformer as a layer graph (model/config.h: gpt_config(Graph)) ----

// A pre-norm GPT of `blocks` blocks written layer by layer, as a user writes one.
json gpt_layers(int blocks, int C, int heads, int V, int positions) {
  json L = json::array({layer("wte", "embedding", {{"num_embeddings", V}, {"embedding_dim", C}}),
                        layer("wpe", "position_embedding", {{"num_embeddings", positions}, {"embedding_dim", C}, {"from", "input"}}),
                        layer("embed", "add", {{"from", {"wte", "wpe"}}})});
  std::string x = "embed";
  for (int b = 0; b < blocks; ++b) {
    std::string h = "h.";
    h += std::to_string(b);
    L.push_back(layer(h + ".ln_1", "layernorm", {{"from", x}}));
    L.push_back(layer(h + ".attn", "causal_self_attention", {{"heads", heads}}));
    L.push_back(layer(h + ".add_1", "add", {{"from", {x, h + ".attn"}}}));
    L.push_back(layer(h + ".ln_2", "layernorm"));
    L.push_back(layer(h + ".mlp.c_fc", "linear", {{"out_features", 4 * C}}));
    L.push_back(layer(h + ".mlp.gelu", "gelu", {{"approximate", "tanh"}}));
    L.push_back(layer(h + ".mlp.c_proj", "linear", {{"out_features", C}}));
    L.push_back(layer(h + ".add_2", "add", {{"from", {h + ".add_1", h + ".mlp.c_proj"}}}));
    x = h + ".add_2";
  }
  L.push_back(layer("ln_f", "layernorm", {{"from", x}}));
  L.push_back(layer("lm_head", "linear", {{"out_features", V}, {"bias", false}, {"tied_to", "wte"}}));
  return L;
}

const json kTokens = {{"tokens", 16}, {"vocab", 64}};

// The transformer a token graph compiles to, or the refusal's message.
std::string gpt_refusal(const json& j) {
  try {
    gpt_config(parse_graph(j, "model file g.json"));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A transformer's FLOPs as model show counts them against what its matrix products count when
// it runs: every GEMM (the projections, the MLP and the tied head), and not attention's two
// products over the causal triangle, which its own kernel computes (graph.h says so).
TEST(TokenGraph, ForwardFlopsAreWhatTheKernelsCount) {
  const auto g = std::make_shared<const Graph>(parse_graph(examples_graph("skip-transformer.json"), "skip"));
  const GPTConfig cfg = gpt_config(*g);
  const int64_t B = 2, T = cfg.seq;
  const std::vector<Shape> shapes = infer_shapes(*g, {T});
  double said = 0, triangle = 0;
  for (size_t i = 0; i < g->layers.size(); ++i) {
    said += forward_flops(*g, shapes, {T}, i);
    if (g->layers[i].op == Op::causal_self_attention)
      triangle += 2 * 2.0 * static_cast<double>(cfg.n_embd) * static_cast<double>(T * (T + 1) / 2);
  }
  GPT gpt(cfg, 7);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 200), targets[i] = static_cast<int32_t>((i + 1) % 200);
  nn::Context ctx(1, /*training=*/false);
  kernels::reset_flops_counted_thread();
  gpt.forward(ctx, tokens.data(), targets.data(), B, T);
  EXPECT_EQ(kernels::flops_counted_thread(), (said - triangle) * B);
  EXPECT_GT(triangle, 0);
}

TEST(TokenGraph, TheNamedTransformersAreTheirDocumentedShapes) {
  // README's table of named models: layers, width, heads, vocabulary, positions, batch, sequence.
  struct Want { const char* name; int64_t L, C, H, V, P, B, T; };
  for (const Want& w : {Want{"gpt-tiny", 4, 128, 4, 256, 64, 12, 64}, Want{"gpt-small", 6, 384, 6, 256, 256, 8, 256},
                        Want{"gpt2-124m", 12, 768, 12, 50257, 1024, 4, 64}}) {
    const auto g = named_graph(w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_TRUE(g->tokens());
    const GPTConfig c = gpt_config(*g);
    EXPECT_EQ(c.name, w.name);
    EXPECT_EQ(std::vector<int64_t>({c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.block_size, c.batch, c.seq}),
              std::vector<int64_t>({w.L, w.C, w.H, w.V, w.P, w.B, w.T}))
        << w.name;
    EXPECT_FALSE(c.has_skip());
    EXPECT_EQ(model_spec(w.name)->family(), "gpt");
  }
  // GPT-2 small's published parameter count (the head tied to the embedding).
  EXPECT_EQ(gpt_config("gpt2-124m").num_params(), 124439808);
}

TEST(TokenGraph, AUserTransformerWithALongSkipCompiles) {
  const auto spec = model_spec(std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/skip-transformer.json");
  ASSERT_NE(spec->gpt(), nullptr);
  const GPTConfig& c = *spec->gpt();
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_embd, 96);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.skip_from, 0);
  EXPECT_EQ(c.skip_to, 3);
  EXPECT_EQ(c.seq, 32);
  EXPECT_EQ(c.block_size, 48);
  // A hand count: the tables, four blocks (two layernorms, c_attn, c_proj, c_fc, c_proj), ln_f.
  const int64_t block = 4 * 96 + (96 * 288 + 288) + (96 * 96 + 96) + (96 * 384 + 384) + (384 * 96 + 96);
  EXPECT_EQ(c.num_params(), 256 * 96 + 48 * 96 + 4 * block + 2 * 96);
}

TEST(TokenGraph, AGraphThatIsNoPreNormTransformerIsRefusedNamingTheLayer) {
  const json ok = graph_of(gpt_layers(2, 32, 4, 64, 16), kTokens);
  EXPECT_EQ(gpt_refusal(ok), "");
  struct Bad {
    std::string what;
    json graph;
    std::vector<std::string> says;
  };
  auto edit = [&](size_t i, const json& fields) {
    json j = ok;
    j["layers"][i].update(fields);
    return j;
  };
  // A post-norm block (the original transformer's): attention first, the layernorms after the sums.
  const json post_norm = graph_of(
      json::array({ok["layers"][0], ok["layers"][1], ok["layers"][2],
                   layer("h.0.attn", "causal_self_attention", {{"heads", 4}}),
                   layer("h.0.add_1", "add", {{"from", {"embed", "h.0.attn"}}}), layer("h.0.ln_1", "layernorm"),
                   layer("h.0.mlp.c_fc", "linear", {{"out_features", 128}}), layer("h.0.mlp.gelu", "gelu", {{"approximate", "tanh"}}),
                   layer("h.0.mlp.c_proj", "linear", {{"out_features", 32}}),
                   layer("h.0.add_2", "add", {{"from", {"h.0.ln_1", "h.0.mlp.c_proj"}}}), layer("h.0.ln_2", "layernorm"),
                   layer("lm_head", "linear", {{"out_features", 64}, {"bias", false}, {"tied_to", "wte"}})}),
      kTokens);
  json untied = ok;
  untied["layers"].back().erase("tied_to");
  std::vector<Bad> cases = {
      {"MLPs of two widths", edit(15, {{"out_features", 96}}),
       {"layer 15 'h.1.mlp.c_fc' (linear)", "block h.0's MLP 128", "one width"}},
      {"two GELUs", edit(16, {{"approximate", "none"}}), {"layer 16 'h.1.mlp.gelu' (gelu)", "one GELU"}},
      {"heads that change", edit(12, {{"heads", 2}}), {"layer 12 'h.1.attn'", "every block has the same heads"}},
      {"a head of its own", untied, {"'lm_head' (linear) is the head", "\"tied_to\": \"wte\""}},
      {"a post-norm block", post_norm, {"layer 3 'h.0.attn' (causal_self_attention) is where block h.0's first layernorm"}},
      {"a renamed layernorm", edit(6, {{"name", "block0.norm2"}}), {"layer 6 'block0.norm2'", "name it 'h.0.ln_2'"}},
      {"a unit", edit(5, {{"unit", "u"}}), {"layer 5 'h.0.add_1'", "drop it"}},
      {"another eps", edit(3, {{"eps", 1e-6}}), {"layer 3 'h.0.ln_1'", "1e-5"}},
  };
  for (const Bad& c : cases) {
    const std::string m = gpt_refusal(c.graph);
    EXPECT_FALSE(m.empty()) << c.what << ": accepted";
    for (const std::string& piece : c.says) EXPECT_NE(m.find(piece), std::string::npos) << c.what << ": " << m;
  }
  // The MLP's width and its GELU are the graph's: 3 x the width with the exact GELU in every block.
  json wide = ok;
  for (size_t i : {7, 15}) wide["layers"][i]["out_features"] = 96;
  for (size_t i : {8, 16}) wide["layers"][i]["approximate"] = "none";
  EXPECT_EQ(gpt_refusal(wide), "");
  const GPTConfig c = gpt_config(parse_graph(wide, "wide"));
  EXPECT_EQ(c.mlp_width(), 96);
  EXPECT_TRUE(c.gelu_exact);
  // The blocks built from it hold that MLP: c_fc 32 -> 96 and the exact GELU.
  Block block("h.0", c, 7);
  auto* mlp = dynamic_cast<MLPBlock*>(block.mlp.get());
  ASSERT_NE(mlp, nullptr);
  EXPECT_TRUE(mlp->gelu.exact);
  EXPECT_EQ(mlp->c_fc->weight.value.shape(), (Shape{32, 96}));
  EXPECT_EQ(gpt_config(parse_graph(ok, "ok")).mlp_width(), 128);
  EXPECT_FALSE(gpt_config(parse_graph(ok, "ok")).gelu_exact);
}

TEST(TokenGraph, ShapesAndOpsOfTheWrongKindAreRefusedWhenRead) {
  const json ok = graph_of(gpt_layers(1, 32, 4, 64, 16), kTokens);
  EXPECT_EQ(refusal(ok), "");
  auto edit = [&](size_t i, const json& fields) {
    json j = ok;
    j["layers"][i].update(fields);
    return j;
  };
  json conv = ok;
  conv["layers"][3] = layer("h.0.ln_1", "conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"from", "embed"}});
  json on_images = graph_of(json::array({layer("e", "embedding", {{"num_embeddings", 64}, {"embedding_dim", 8}}),
                                         layer("fc", "linear", {{"out_features", 10}})}));
  const std::vector<std::pair<json, std::vector<std::string>>> cases = {
      {edit(1, {{"num_embeddings", 8}}), {"layer 1 'wpe'", "8 positions, fewer than the 16 tokens"}},
      {edit(0, {{"num_embeddings", 50}}), {"layer 0 'wte'", "num_embeddings 64"}},
      {edit(4, {{"heads", 5}}), {"layer 4 'h.0.attn'", "5 heads over 32 features"}},
      {conv, {"layer 3 'h.0.ln_1'", "'conv2d', which image models take"}},
      {on_images, {"layer 0 'e'", "'embedding', which token models take"}},
      {edit(12, {{"out_features", 32}}), {"layer 12 'lm_head'", "tied to 'wte'"}},
      {edit(1, {{"from", "wte"}}), {"layer 1 'wpe'", "\"from\": \"input\""}},
  };
  for (const auto& [j, says] : cases) {
    const std::string m = refusal(j);
    EXPECT_FALSE(m.empty()) << j.dump() << ": accepted";
    for (const std::string& piece : says) EXPECT_NE(m.find(piece), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace meshtrain::model
