// `meshtrain plan --goodput` end to end: the table's efficiency and goodput follow Pollux's
// formula from the printed samples per second (computed here, not read from the program), the
// marked row is the largest goodput, a huge noise scale ranks by throughput and a tiny one picks
// the smallest batch; --noise-from reads a metrics file's last grad_noise_scale; --layout keeps
// the layout fixed over the batches; bad input exits 2 with a sentence before planning. And the
// trainer's note that an image model's noise scale needs --batch-norm local at dp > 1.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "data/idx_files.h"
#include "temp_dir.h"

namespace {
using meshtrain::testing::run_cli;

std::string example(const std::string& name) {
  return (std::filesystem::path(MESHTRAIN_SOURCE_DIR) / "examples" / "clusters" / name).string();
}

struct Row {
  bool best = false;
  int64_t batch = 0;
  std::string layout;
  double step_s = 0, samples_per_s = 0, efficiency = 0, goodput = 0;
};

// " *     128  dp=2 tp=1 pp=1 m=1 zero=0     45.1 ms      2838.1     0.5000      1419.0"
std::vector<Row> rows(const std::string& out) {
  static const std::regex row(
      R"(^( \*|  ) +(\d+)  (dp=\S+ tp=\S+ pp=\S+ m=\S+[^\n]*?)\s+([0-9.e+]+) (s|ms|us)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$)");
  std::vector<Row> r;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    const double unit = m[5] == "s" ? 1 : m[5] == "ms" ? 1e-3 : 1e-6;
    r.push_back({m[1] == " *", std::stoll(m[2]), m[3], std::stod(m[4]) * unit, std::stod(m[6]), std::stod(m[7]),
                 std::stod(m[8])});
  }
  return r;
}

// Every row against E(B) = (N + B0) / (N + B) and goodput = samples/s x E, the marked row the
// largest goodput; returns the rows.
std::vector<Row> check_table(const std::string& out, double noise, int64_t base) {
  const std::vector<Row> t = rows(out);
  EXPECT_FALSE(t.empty()) << out;
  int marked = 0;
  size_t argmax = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const Row& x = t[i];
    const double e = (noise + static_cast<double>(base)) / (noise + static_cast<double>(x.batch));
    EXPECT_NEAR(x.efficiency, e, 6e-5) << x.batch << "\n" << out;
    EXPECT_NEAR(x.goodput, x.samples_per_s * e, 0.06 + 1e-4 * x.samples_per_s) << x.batch << "\n" << out;
    // The step time (3 significant digits) carries the batch: samples/s = B / step.
    EXPECT_NEAR(x.samples_per_s * x.step_s / static_cast<double>(x.batch), 1.0, 0.01) << x.batch << "\n" << out;
    if (i > 0) {
      EXPECT_EQ(x.batch, t[i - 1].batch * 2) << out;
    }
    marked += x.best;
    if (x.goodput > t[argmax].goodput) argmax = i;
  }
  EXPECT_EQ(marked, 1) << out;
  if (!t.empty()) {
    EXPECT_TRUE(t[argmax].best) << "the marked row is not the largest goodput\n" << out;
    EXPECT_EQ(t.front().batch, base) << out;
  }
  return t;
}

const std::string kResnet = "plan --model resnet-small --cluster " + example("this-machine.json") + " --goodput ";

TEST(CliPlanGoodput, RanksBatchesByThroughputTimesEfficiency) {
  auto r = run_cli(kResnet + "--global-batch 32 --max-batch 256 --noise-scale 100", 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(check_table(r.output, 100, 32).size(), 4u) << r.output;
  EXPECT_NE(r.output.find("images/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("best as train flags: --batch "), std::string::npos) << r.output;

  // Efficiency about 1 everywhere: the batch with the most images per second wins.
  r = run_cli(kResnet + "--global-batch 32 --max-batch 256 --noise-scale 1e9", 300);
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<Row> t = check_table(r.output, 1e9, 32);
  ASSERT_FALSE(t.empty());
  size_t fastest = 0;
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].samples_per_s > t[fastest].samples_per_s) fastest = i;
  EXPECT_TRUE(t[fastest].best) << r.output;

  // A tiny noise scale: E ~ B0 / B, so goodput ~ B0 / step time and the smallest batch wins.
  r = run_cli(kResnet + "--global-batch 32 --max-batch 256 --noise-scale 1e-6", 300);
  ASSERT_EQ(r.code, 0) << r.output;
  t = check_table(r.output, 1e-6, 32);
  ASSERT_FALSE(t.empty());
  EXPECT_TRUE(t.front().best) << r.output;
}

TEST(CliPlanGoodput, ReadsTheNoiseScaleFromAMetricsFile) {
  meshtrain::testing::TempDir dir("plan_goodput");
  const std::string m = dir.file("m.jsonl");
  // The last line with grad_noise_scale wins; a line cut by a kill (no newline) is skipped.
  std::ofstream(m) << R"({"step": 1, "loss": 2.3})" << "\n"
                   << R"({"step": 2, "loss": 2.2, "grad_noise_scale": 5.0})" << "\n"
                   << R"({"step": 3, "loss": 2.1, "grad_noise_scale": 37.5, "stat_efficiency": 0.9})" << "\n"
                   << R"({"step": 4, "loss": 2.0})" << "\n"
                   << R"({"step": 5, "lo)";
  const auto r = run_cli(kResnet + "--global-batch 16 --max-batch 64 --noise-from " + m, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(check_table(r.output, 37.5, 16).size(), 3u) << r.output;
  EXPECT_NE(r.output.find("noise scale 37.5 images (last grad_noise_scale of " + m + ", step 3)"), std::string::npos)
      << r.output;
}

TEST(CliPlanGoodput, KeepsAGivenLayoutOverTheBatches) {
  const auto r = run_cli("plan --model gpt-tiny --cluster " + example("h100-node.json") +
                             " --goodput --global-batch 8 --max-batch 64 --noise-scale 20 --layout \"dp=2 m=2\"",
                         300);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<Row> t = check_table(r.output, 20, 8);
  ASSERT_EQ(t.size(), 4u) << r.output;
  for (const Row& x : t) EXPECT_EQ(x.layout, "dp=2 tp=1 pp=1 m=2") << x.layout;
  EXPECT_NE(r.output.find("seq/s"), std::string::npos) << r.output;
}

TEST(CliPlanGoodput, BadInputExits2WithASentence) {
  meshtrain::testing::TempDir dir("plan_goodput");
  std::ofstream(dir.file("none.jsonl")) << R"({"step": 1, "loss": 2.3})" << "\n" << R"({"step": 2, "loss": 2.2})" << "\n";
  std::ofstream(dir.file("zero.jsonl")) << R"({"step": 7, "loss": 2.3, "grad_noise_scale": 0})" << "\n";
  std::ofstream(dir.file("junk.jsonl")) << "not json\n" << R"({"step": 2, "grad_noise_scale": 4})" << "\n";
  struct Case {
    std::string args;
    std::vector<std::string> words;
  };
  const std::string base = kResnet + "--global-batch 32 ";
  const std::string noplan = "plan --model resnet-small --cluster " + example("this-machine.json") + " --global-batch 32 ";
  const std::vector<Case> cases = {
      {base, {"--goodput needs the gradient noise scale", "--noise-scale", "--noise-from"}},
      {base + "--noise-scale 10 --noise-from " + dir.file("none.jsonl"), {"one of --noise-scale and --noise-from"}},
      {base + "--noise-scale 0", {"--noise-scale", "above 0"}},
      {base + "--noise-scale -3", {"--noise-scale"}},
      {base + "--noise-scale nan", {"--noise-scale"}},
      {base + "--noise-from " + dir.file("none.jsonl"), {"none.jsonl has no grad_noise_scale", "--dp 2"}},
      {base + "--noise-from " + dir.file("zero.jsonl"), {"zero.jsonl", "step 7", "not above 0"}},
      {base + "--noise-from " + dir.file("junk.jsonl"), {"junk.jsonl", "line 1"}},
      {base + "--noise-from " + dir.file("absent.jsonl"), {"absent.jsonl"}},
      {base + "--noise-scale 10 --max-batch 40", {"--max-batch 40", "at least 64"}},
      {base + "--noise-scale 10 --layout \"dp=1 tp=3\"", {"--layout"}},
      {noplan + "--noise-scale 10", {"--noise-scale", "add --goodput"}},
      {noplan + "--noise-from " + dir.file("none.jsonl"), {"--noise-from", "add --goodput"}},
      {noplan + "--max-batch 64", {"--max-batch", "add --goodput"}},
  };
  for (const Case& c : cases) {
    const auto r = run_cli(c.args, 60);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    for (const std::string& w : c.words) EXPECT_NE(r.output.find(w), std::string::npos) << c.args << ": " << w << "\n" << r.output;
    EXPECT_EQ(r.output.find("goodput of global batches"), std::string::npos) << "planned before refusing: " << c.args;
    EXPECT_EQ(r.output.find("tried "), std::string::npos) << "planned before refusing: " << c.args;
  }
}

// Batch norm synchronised over dp leaves the noise scale undefined on most steps: train says so
// and names --batch-norm local, and says nothing with it or at dp 1.
TEST(CliTrainNoiseScale, NotesThatSynchronisedBatchNormNeedsLocalStatistics) {
  meshtrain::testing::TempDir dir("goodput_bn");
  meshtrain::testing::write_bar_image_set(dir.path().string(), 64, 16, /*gzip=*/false);
  const std::string train = "train --model resnet-small --data " + dir.path().string() +
                            " --steps 1 --batch 8 --eval-every 0 --threads 1 ";
  auto r = run_cli(train + "--dp 2", 120);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("noise scale needs --batch-norm local"), std::string::npos) << r.output;
  for (const std::string& quiet : {std::string("--dp 2 --batch-norm local"), std::string("--dp 1")}) {
    r = run_cli(train + quiet, 120);
    ASSERT_EQ(r.code, 0) << quiet << "\n" << r.output;
    EXPECT_EQ(r.output.find("noise scale needs --batch-norm local"), std::string::npos) << quiet << "\n" << r.output;
  }
}

}  // namespace
