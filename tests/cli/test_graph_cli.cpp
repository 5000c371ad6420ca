// User-written layer graphs (examples/models/*.json: none of the named models; image
// models, and a transformer on tokens) trained at every
// layout through the one graph compiler: each layout's loss curve against one rank's, within
// 1e-5 relative over the first 6 steps on the default path, and within 1e-6 over 30 steps
// with --exact-sums where it applies (dp, pp, branches). Every run takes two micro-batches of 8
// (batch norm normalises over a micro-batch, so one rank's curve is that of the same
// micro-batches). Images: tests/data/idx_files.h.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "data/idx_files.h"
#include "temp_dir.h"

using meshtrain::testing::run_cli;

namespace {

class GraphCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new meshtrain::testing::TempDir("graph_cli");
    meshtrain::testing::write_bar_image_set(dir_->path().string(), 256, 32, false);
    // A text for the token models: numbered sentences of a few words, 60 KB.
    std::ofstream text(dir_->file("text.txt"));
    const char* words[] = {"the", "ranks", "sum", "their", "gradients", "and", "each", "stage", "sends", "its", "output"};
    for (int i = 0; i < 6000; ++i) text << words[i % 11] << (i % 7 == 6 ? ".\n" : " ") << (i * 7919) % 97 << ' ';
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // The metrics lines of `steps` steps of examples/models/<file> (or a named model) at `flags`
  // (`output`: what the run printed; `quiet`: with --quiet).
  static std::vector<nlohmann::json> run_lines(const std::string& file, const std::string& flags, int steps,
                                               std::string* output = nullptr, bool quiet = true) {
    const std::string metrics = dir_->file(file.substr(file.find_last_of('/') + 1) + std::to_string(++runs_) + ".jsonl");
    const std::string model = file.starts_with("/") || !file.ends_with(".json")
                                  ? file
                                  : std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/" + file;
    const std::string data = file.ends_with("transformer.json") ? dir_->file("text.txt") : dir_->path().string();
    std::string args = "train --model " + model + " --data " + data + " --steps " + std::to_string(steps);
    args += " --batch 16 --microbatches 2 --threads 1 --warmup 2 --lr 0.003 --eval-every 0 --eval-batches 1";
    args += quiet ? " --quiet" : " --log-every 1";
    args += " --metrics ";
    args += metrics;
    args += " ";
    args += flags;
    const auto r = run_cli(args, 600);
    EXPECT_EQ(r.code, 0) << flags << "\n" << r.output;
    if (output) *output = r.output;
    std::vector<nlohmann::json> lines;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  // The per-step losses of `steps` steps of examples/models/<file> (or a named model) at `flags`.
  static std::vector<double> curve(const std::string& file, const std::string& flags, int steps) {
    std::vector<double> losses;
    for (const nlohmann::json& j : run_lines(file, flags, steps))
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    EXPECT_EQ(losses.size(), static_cast<size_t>(steps)) << flags;
    return losses;
  }

  // Every layout's curve against one rank's, within `tol` relative at every step.
  static void expect_layouts_match(const std::string& file, const std::vector<std::string>& layouts, int steps,
                                   double tol, const std::string& common = "") {
    const std::vector<double> one = curve(file, common, steps);
    for (const std::string& layout : layouts) {
      const std::vector<double> got = curve(file, layout + " " + common, steps);
      ASSERT_EQ(got.size(), one.size()) << layout;
      for (size_t s = 0; s < one.size(); ++s)
        EXPECT_LE(std::abs(got[s] - one[s]), tol * std::abs(one[s]))
            << file << " " << layout << " " << common << ": step " << s + 1 << " " << got[s] << " vs one rank's " << one[s];
    }
    // The curve moves: the comparison is of training, not of a constant.
    EXPECT_NE(one.front(), one.back());
  }

  // A 2-step --tp 2 run of `model` on `data` at batch 16: every step's tp_bytes_sent against what
  // model show predicted, within 0.1%.
  static void expect_tp_bytes(const std::string& model, const std::string& data, double predicted) {
    std::string name = "tp_bytes";
    name += std::to_string(++runs_);
    name += ".jsonl";
    const std::string metrics = dir_->file(name);
    const auto r = run_cli("train --model " + model + " --data " + data +
                           " --steps 2 --batch 16 --tp 2 --threads 1 --eval-every 0 --eval-batches 1 --quiet --metrics " +
                           metrics);
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream in(metrics);
    int lines = 0;
    for (std::string line; std::getline(in, line); ++lines) {
      const double sent = nlohmann::json::parse(line).at("tp_bytes_sent").get<double>();
      // + 16 bytes: the step's own scalars, which model show does not list (a run that splits
      // nothing sends 8 bytes a step).
      EXPECT_NEAR(sent, predicted, 0.001 * predicted + 16)
          << model << ": model show says " << predicted << " bytes a step, the run sent " << sent;
    }
    EXPECT_EQ(lines, 2) << model;
  }

  static meshtrain::testing::TempDir* dir_;
  static int runs_;
};

meshtrain::testing::TempDir* GraphCli::dir_ = nullptr;
int GraphCli::runs_ = 0;

// Every layout of the default path: data parallelism (ZeRO 1 and 3), a 1F1B pipeline, the
// filter/channel split, row bands, and the three axes at once.
const std::vector<std::string> kConvLayouts = {"--dp 2 --zero 1",         "--dp 2 --zero 3",
                                               "--pp 2", "--tp 2",
                                               "--spatial 2",             "--dp 2 --pp 2 --tp 2"};

TEST_F(GraphCli, AVggWithA1x1ResidualMatchesOneRankAtEveryLayout) {
  expect_layouts_match("vgg-mini.json", kConvLayouts, 6, 1e-5);
}

TEST_F(GraphCli, ABranchyNetworkMatchesOneRankAtEveryLayoutAndOverBranches) {
  std::vector<std::string> layouts = kConvLayouts;
  layouts.push_back("--branch-parallel 2 --branch-balance flops");
  expect_layouts_match("branchy.json", layouts, 6, 1e-5);
}

TEST_F(GraphCli, AnMlpMatchesOneRankAtEveryLayout) {
  expect_layouts_match("mlp3.json", {"--dp 2 --zero 1", "--dp 2 --zero 3", "--pp 2", "--tp 2",
                                     "--dp 2 --pp 2 --tp 2"},
                       6, 1e-5);
}

// A LeNet with GELUs (the exact form and the tanh one), average pooling (one window padded, so
// the row bands' halos are zero-filled at the image's edges) and a layernorm over features
// (examples/models/lenet-gelu.json): every layout, and with --exact-sums over 30 steps.
TEST_F(GraphCli, ALeNetWithGeluAveragePoolingAndALayerNormMatchesOneRankAtEveryLayout) {
  expect_layouts_match("lenet-gelu.json", kConvLayouts, 6, 1e-5);
  expect_layouts_match("lenet-gelu.json", {"--dp 2", "--pp 2"}, 30, 1e-6, "--exact-sums 2");
  // model show names both forms and the pool's window; under --spatial 2 the padded pool has a halo.
  const auto shown = run_cli("model show " + std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/lenet-gelu.json --spatial 2");
  ASSERT_EQ(shown.code, 0) << shown.output;
  EXPECT_NE(shown.output.find("gelu (erf)"), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("avgpool2d 3x3 s2 p1"), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("halo 1 row(s) each side"), std::string::npos) << shown.output;
}

// A transformer of a new shape, written layer by layer (examples/models/skip-transformer.json):
// four blocks of width 96 with a long skip from block 0's output into block 3's input, which a
// cut at pp 2 (blocks 0-1 | 2-3) crosses. Megatron's split by heads under --tp. It has no batch
// norm, so its curve holds over 30 steps on the default path (--exact-sums slices the CNNs'
// gradients and does not apply).
TEST_F(GraphCli, ATransformerWithASkipAcrossTheCutMatchesOneRankAtEveryLayout) {
  expect_layouts_match("skip-transformer.json", {"--dp 2 --zero 1", "--dp 2 --zero 3", "--pp 2", "--tp 2",
                                                 "--dp 2 --pp 2 --tp 2", "--tp 2 --sequence-parallel",
                                                 "--pp 2 --pp-cuts h.3"},
                       6, 1e-5);
  expect_layouts_match("skip-transformer.json", {"--dp 2", "--pp 2"}, 30, 1e-5);
}

// A transformer whose MLP is 2.5 x its width with the exact GELU (the graph's choices, not
// GPT-2's): every layout against one rank, and its parameters against a hand count.
TEST_F(GraphCli, ATransformerWithItsOwnMlpWidthAndGeluMatchesOneRankAtEveryLayout) {
  expect_layouts_match("wide-gelu-transformer.json", {"--dp 2 --zero 1", "--dp 2 --zero 3", "--pp 2", "--tp 2",
                                                      "--tp 2 --sequence-parallel", "--dp 2 --pp 2 --tp 2"},
                       6, 1e-5);
  const auto shown = run_cli("model show " + std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/wide-gelu-transformer.json");
  ASSERT_EQ(shown.code, 0) << shown.output;
  // wte 256 x 64, wpe 32 x 64; a block: two layernorms, c_attn, c_proj, c_fc 64 -> 160, c_proj 160 -> 64; ln_f.
  const int block = 4 * 64 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 160 + 160) + (160 * 64 + 64);
  EXPECT_NE(shown.output.find(" " + std::to_string(256 * 64 + 32 * 64 + 3 * block + 2 * 64) + " "), std::string::npos)
      << shown.output;
}

// `model show` of the transformer: its parameters against a hand count, and at --pp 2 the skip's
// two ends on different stages (block 0 on stage 0, the sum into block 3 on stage 1).
TEST_F(GraphCli, ModelShowOfATransformerCountsItsParametersAndPlacesTheSkipAcrossTheCut) {
  const std::string file = std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/skip-transformer.json";
  const auto shown = run_cli("model show " + file + " --pp 2");
  ASSERT_EQ(shown.code, 0) << shown.output;
  // The tables, four blocks (two layernorms, c_attn, c_proj, c_fc, c_proj), ln_f; the head is tied.
  const int block = 4 * 96 + (96 * 288 + 288) + (96 * 96 + 96) + (96 * 384 + 384) + (384 * 96 + 96);
  const std::string total = std::to_string(256 * 96 + 48 * 96 + 4 * block + 2 * 96);
  EXPECT_NE(shown.output.find(" " + total + " "), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("\n0     0     h.0.ln_1 "), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("\n3     1     skip "), std::string::npos) << shown.output;
}

// `model show --tp 2` of the transformer: the bytes its column adds up to (Megatron's all-reduces
// of activations and input gradients, the vocabulary-parallel cross-entropy's per-token sums)
// against the bytes the run then sends (tp_bytes_sent), which also holds the gradient norm's one
// double a step.
TEST_F(GraphCli, ModelShowOfATransformerPredictsTheBytesTpSends) {
  const std::string file = std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/skip-transformer.json";
  const auto shown = run_cli("model show " + file + " --tp 2 --batch 16");
  ASSERT_EQ(shown.code, 0) << shown.output;
  EXPECT_NE(shown.output.find("heads/2: c_attn columns, c_proj rows, all-reduce y and dx"), std::string::npos)
      << shown.output;
  const auto at = shown.output.find("one rank sends ");
  ASSERT_NE(at, std::string::npos) << shown.output;
  const double predicted = std::stod(shown.output.substr(at + 15));
  EXPECT_GT(predicted, 0);
  expect_tp_bytes(file, dir_->file("text.txt"), predicted);
}

// A pipeline cut between the two layers of a split pair (cnn-small's conv1 -> conv2 at pp 3,
// mlp3's fc1 -> fc2 at pp 2): each tp rank sends its share of the channels to its peer.
TEST_F(GraphCli, ASplitPairMayStraddleAPipelineCut) {
  expect_layouts_match("cnn-small", {"--tp 2 --pp 3"}, 6, 1e-5);
  expect_layouts_match("mlp3.json", {"--tp 2 --pp 2 --pp-balance 3,3"}, 6, 1e-5);
}

TEST_F(GraphCli, ExactSumsHoldTheCurveOver30StepsAcrossDataPipelinesAndBranches) {
  expect_layouts_match("vgg-mini.json", {"--dp 2", "--pp 2"}, 30, 1e-6, "--exact-sums 2");
  expect_layouts_match("branchy.json", {"--dp 2", "--branch-parallel 2 --branch-balance flops"}, 30, 1e-6,
                       "--exact-sums 2");
}

// `model show`: the parameter total against a hand count, and under --tp 2 the bytes its
// column adds up to against the bytes the run then sends (the tp_bytes_sent metric).
TEST_F(GraphCli, ModelShowCountsParametersAndTheBytesTpSends) {
  // vgg-mini: conv 3x3 1->32 with bias, batch norm 32, a 1x1 32->32 without bias, linear 6272->10.
  const std::string vgg_total = std::to_string(320 + 64 + 1024 + 62730);
  // Every user graph on images: what model show says --tp 2 sends against what the run sends.
  for (const char* name : {"vgg-mini.json", "mlp3.json", "branchy.json", "lenet-gelu.json", "resnet-cut.json"}) {
    const std::string file = std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/" + name;
    const auto shown = run_cli("model show " + file + " --tp 2 --batch 16");
    ASSERT_EQ(shown.code, 0) << shown.output;
    EXPECT_NE(shown.output.find(" total "), std::string::npos) << shown.output;
    if (std::string(name) == "vgg-mini.json") {
      EXPECT_NE(shown.output.find(" " + vgg_total + " "), std::string::npos) << shown.output;
    }
    const auto at = shown.output.find("one rank sends ");
    ASSERT_NE(at, std::string::npos) << shown.output;
    const double predicted = std::stod(shown.output.substr(at + 15));
    if (std::string(name) == "vgg-mini.json") {
      // Its two convolutions do not pay a filter split (1 -> 32 3x3: 9 FLOPs per byte moved; the
      // 1x1 32 -> 32: 16; model::filter_split_pays) and its linear is unpaired: tp 2 runs it
      // replicated, and the table says so.
      EXPECT_EQ(predicted, 0) << shown.output;
      EXPECT_NE(shown.output.find("replicated (a filter split would move more than it saves)"), std::string::npos)
          << shown.output;
    } else {
      EXPECT_GT(predicted, 0) << name;
    }
    expect_tp_bytes(file, dir_->path().string(), predicted);
  }
}

// Dropout (examples/models/mlp-dropout.json: p 0.3 after both hidden layers) draws its masks by
// (step, the sample's place in the global batch, element), so every layout draws the same ones
// and keeps one rank's curve; and it drops something: at p 0 the same network's first loss
// differs.
TEST_F(GraphCli, DropoutDrawsTheSameMasksAtEveryLayout) {
  expect_layouts_match("mlp-dropout.json", {"--dp 2 --zero 1", "--dp 2 --zero 3", "--pp 2", "--tp 2",
                                            "--dp 2 --pp 2 --tp 2"},
                       6, 1e-5);
  expect_layouts_match("mlp-dropout.json", {"--dp 2", "--pp 2"}, 30, 1e-6, "--exact-sums 2");
  std::ifstream in(std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/mlp-dropout.json");
  nlohmann::json g = nlohmann::json::parse(in);
  for (auto& l : g["layers"])
    if (l["op"] == "dropout") l["p"] = 0;
  const std::string none = dir_->file("mlp-no-dropout.json");
  std::ofstream(none) << g.dump();
  const double with = curve("mlp-dropout.json", "", 1).at(0), without = curve(none, "", 1).at(0);
  EXPECT_GT(std::abs(with - without), 1e-4 * without) << with << " " << without;
}

// The parameter server on image graphs (train/ps_trainer.h): at staleness 0 a round is the
// two workers' pushes of one step, the servers run the same AdamW, each worker takes its rows of
// every micro-batch of the global batch as a dp rank does (the fixture's --microbatches 2
// applies: micro-batch k is rows [8k, 8k + 8), 4 on each worker), and the workers sum batch
// norm's statistics over their own group. So one and two servers keep one rank's curve: an MLP,
// a VGG with batch norm (the test that fails if the statistics were each worker's own), and
// dropout (its masks keyed by the sample's place in the global batch, which the workers keep).
const std::vector<std::string> kPsLayouts = {"--dp 2 --ps-servers 1", "--dp 2 --ps-servers 2"};

TEST_F(GraphCli, TheParameterServerKeepsOneRanksCurveOnAnMlp) {
  expect_layouts_match("mlp3.json", kPsLayouts, 6, 1e-5);
}

TEST_F(GraphCli, TheParameterServerKeepsOneRanksCurveWithBatchNorm) {
  expect_layouts_match("vgg-mini.json", kPsLayouts, 6, 1e-5);
  // A named CNN (batch norm after both convolutions), through the same path.
  expect_layouts_match("cnn-small", {"--dp 2 --ps-servers 2"}, 6, 1e-5);
}

TEST_F(GraphCli, TheParameterServerKeepsOneRanksCurveWithDropout) {
  expect_layouts_match("mlp-dropout.json", kPsLayouts, 6, 1e-5);
}

// What a parameter-server run of an image model reports: every metrics line the batch's
// accuracy (the workers' rows summed) and images per second, and at the end the validation loss
// and test accuracy of the final parameters with worker 0's running statistics, which at
// staleness 0 are one rank's: the summary numbers of all-reduce dp over as many ranks (whose
// validation takes the same slices of B / W rows; one rank's, over whole batches, may differ in
// the 4th decimal by the convolutions' round-off at another batch size).
TEST_F(GraphCli, TheParameterServerReportsAccuracyAndValidatesAsAllReduce) {
  std::string one_out, ps_out;
  const auto one = run_lines("vgg-mini.json", "--dp 2", 4, &one_out, /*quiet=*/false);
  const auto ps = run_lines("vgg-mini.json", "--dp 2 --ps-servers 2", 4, &ps_out, /*quiet=*/false);
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(ps.size(), 4u);
  for (size_t s = 0; s < ps.size(); ++s) {
    ASSERT_TRUE(ps[s].contains("accuracy")) << ps[s].dump();
    EXPECT_NEAR(ps[s]["accuracy"].get<double>(), one[s].at("accuracy").get<double>(), 1e-6) << "step " << s + 1;
    EXPECT_GT(ps[s].at("images_per_s").get<double>(), 0.0) << ps[s].dump();
    EXPECT_EQ(ps[s].at("pushes").get<int>(), 2) << ps[s].dump();
  }
  auto summary = [](const std::string& out, const std::string& what) {
    const auto at = out.find(what);
    EXPECT_NE(at, std::string::npos) << out;
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + what.size()));
  };
  EXPECT_NEAR(summary(ps_out, "final validation loss "), summary(one_out, "final validation loss "), 1.5e-4)
      << ps_out << "\n" << one_out;
  EXPECT_NEAR(summary(ps_out, "test accuracy "), summary(one_out, "test accuracy "), 0.01) << ps_out << "\n" << one_out;
  EXPECT_NE(ps_out.find("parameter server: 2 workers"), std::string::npos) << ps_out;
}

// Staleness above 0 on image graphs: the run spends its sample budget (steps x workers pushes)
// however the slowed worker and the other split it, finishes, evaluates and learns. A batch-norm
// graph runs there with --batch-norm local (each worker's own statistics); without it the run is
// refused before any work, saying what to change, since workers steps apart cannot share them.
TEST_F(GraphCli, TheParameterServerTrainsImageGraphsWithStaleness) {
  struct Case {
    std::string file, flags;
  };
  for (const Case& c : {Case{"vgg-mini.json", "--dp 2 --ps-servers 1 --staleness 2 --slow-worker 2 --batch-norm local"},
                        Case{"mlp3.json", "--dp 2 --ps-servers 2 --staleness inf --slow-worker 2"}}) {
    std::string out;
    const auto lines = run_lines(c.file, c.flags, 30, &out, /*quiet=*/false);
    ASSERT_GE(lines.size(), 10u) << c.flags << "\n" << out;
    int64_t pushes = 0;
    for (const auto& j : lines) pushes += j.at("pushes").get<int64_t>();
    EXPECT_EQ(pushes, 60) << c.flags;
    auto mean = [&](size_t from, size_t to) {
      double sum = 0;
      for (size_t i = from; i < to; ++i) sum += lines[i].at("loss").get<double>();
      return sum / static_cast<double>(to - from);
    };
    EXPECT_LT(mean(lines.size() - 5, lines.size()), 0.8 * mean(0, 5)) << c.file << " " << c.flags;
    EXPECT_NE(out.find("final validation loss "), std::string::npos) << out;
  }
  const std::string metrics = dir_->file("ps_stale_bn.jsonl");
  const auto r = run_cli("train --model " + std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/vgg-mini.json --data " +
                         dir_->path().string() + " --steps 2 --batch 16 --dp 2 --ps-servers 1 --staleness 2 --metrics " +
                         metrics);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--staleness 2 runs steps apart; add --batch-norm local"), std::string::npos) << r.output;
  EXPECT_FALSE(std::ifstream(metrics).good());
}

// --pp-cuts places the stages by layer name: at a layer that begins a unit, as --pp-balance
// counts would (vgg-mini's sum too: features.3 crosses that cut in a portal); a layer inside a
// unit (branchy's block of branches) is refused naming it and where a stage can begin.
TEST_F(GraphCli, PpCutsPlaceTheStagesByLayerName) {
  expect_layouts_match("vgg-mini.json",
                       {"--pp 2 --pp-cuts skip", "--pp 3 --pp-cuts features.2,flat", "--pp 2 --pp-cuts sum"}, 6, 1e-5);
  const std::string metrics = dir_->file("cuts.jsonl");
  const auto r = run_cli("train --model " + std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/branchy.json --data " +
                         dir_->path().string() + " --steps 1 --pp 2 --pp-cuts mix.b.1 --metrics " + metrics);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--pp-cuts: no stage of branchy can begin at 'mix.b.1'; a stage begins at a layer that begins "
                          "a pipeline unit: stem.bn, stem.relu, stem.pool, mix.a.conv, pool, head.conv"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::ifstream(metrics).good());
}

// A residual network without units (examples/models/resnet-cut.json: a stem, a block with an
// identity shortcut, a block with a 1x1 projection) cut inside its blocks: the skip crosses
// the cut in a portal, straight from the stage that has it to the one that reads it, and its
// gradient back. model show names it; every layout keeps one rank's curve: the default cut
// (inside block 2, b1.relu's output crossing it to the projection), a cut inside block 1 (the
// stem's output crossing it to the sum), dp x pp x tp, row bands, a skip passing a stage by,
// and a stage that takes one skip and sends another; the same curve as the graph with each
// block one unit (its skip inside the unit); a stage that would take one skip and send one of
// another shape is refused, naming them.
TEST_F(GraphCli, AResidualBlockCutBetweenStagesCarriesItsSkipInAPortal) {
  const std::string file = std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/resnet-cut.json";
  const auto shown = run_cli("model show " + file + " --pp 2");
  ASSERT_EQ(shown.code, 0) << shown.output;
  EXPECT_NE(shown.output.find("--pp 2: skip 'b1.relu' (N, 16, 14, 14) crosses the cut before 'b2.conv2' as a portal, "
                              "stage 0 to stage 1"),
            std::string::npos)
      << shown.output;
  // The skip's source on stage 0, the layer that reads it on stage 1.
  EXPECT_NE(shown.output.find("\n9    0     b1.relu "), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("\n15   1     b2.down "), std::string::npos) << shown.output;
  expect_layouts_match("resnet-cut.json",
                       {"--pp 2", "--pp 2 --pp-cuts b1.conv2", "--dp 2 --pp 2 --tp 2", "--pp 2 --spatial 2",
                        "--pp 2 --tp 2 --pp-cuts b1.conv2", "--pp 3 --pp-cuts b2.bn1,b2.conv2",
                        "--pp 3 --pp-cuts b1.conv2,b2.down"},
                       6, 1e-5);
  expect_layouts_match("resnet-cut.json", {"--pp 2", "--pp 2 --pp-cuts b1.conv2"}, 30, 1e-6, "--exact-sums 2");
  // The skips the stage holds between units against the same graph with each residual block
  // one unit (the skip inside the unit, no unit boundary crossed): one curve.
  std::ifstream in(file);
  nlohmann::json g = nlohmann::json::parse(in);
  for (auto& l : g["layers"]) {
    const std::string name = l["name"];
    l["unit"] = name.find('.') == std::string::npos ? "head" : name.substr(0, name.find('.'));
  }
  const std::string blocks = dir_->file("resnet-cut-blocks.json");
  std::ofstream(blocks) << g.dump();
  const std::vector<double> cut = curve("resnet-cut.json", "--pp 2", 6), whole = curve(blocks, "", 6);
  ASSERT_EQ(cut.size(), whole.size());
  for (size_t s = 0; s < cut.size(); ++s)
    EXPECT_LE(std::abs(cut[s] - whole[s]), 1e-5 * std::abs(whole[s])) << "step " << s + 1;
  const std::string metrics = dir_->file("two-portals.jsonl");
  const auto r = run_cli("train --model " + file + " --data " + dir_->path().string() +
                         " --steps 1 --pp 3 --pp-cuts b1.conv2,b2.downbn --metrics " + metrics);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("would take the skip from 'stem.relu' and send the skip from 'b2.bn2', of another shape"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("cut elsewhere with --pp-cuts"), std::string::npos) << r.output;
  EXPECT_FALSE(std::ifstream(metrics).good());
}

TEST_F(GraphCli, AMalformedGraphExits2NamingTheLayerAndWritesNothing) {
  const std::string bad = dir_->file("bad.json");
  std::ofstream(bad) << R"({"name": "bad", "input": {"image": [1, 28, 28], "classes": 10}, "layers": [
    {"name": "c", "op": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
    {"name": "fc", "op": "linear", "out_features": 10}]})";
  const std::string metrics = dir_->file("bad.jsonl");
  const auto r = run_cli("train --model " + bad + " --data " + dir_->path().string() + " --steps 1 --metrics " + metrics);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("layer 1 'fc' (linear) takes features (N, F); its input 'c' is (N, 8, 28, 28)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::ifstream(metrics).good());
}

}  // namespace
