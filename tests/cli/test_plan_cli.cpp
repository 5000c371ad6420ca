// `meshtrain plan` end to end: the printed table holds only layouts the trainer can run on the
// cluster (dp x tp x pp within its devices, tp dividing the heads, the batch dividing into dp x
// micro-batches), ranked by step time; --svg draws the best; bad input exits 2 with a
// sentence naming what to change, before anything is planned.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/pipeline/svg.h"
#include "meshtrain/plan/cluster.h"
#include "temp_dir.h"

namespace {
using meshtrain::testing::run_cli;

std::string example(const std::string& name) {
  return (std::filesystem::path(MESHTRAIN_SOURCE_DIR) / "examples" / "clusters" / name).string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Row {
  int rank = 0, dp = 0, tp = 0, pp = 0, m = 0;
  std::string layout;
  double step_s = 0;
};

// The table's rows: "  1  dp=2 tp=1 pp=3 m=4 1f1b zero=1   12.5 ms ...".
std::vector<Row> rows(const std::string& out) {
  static const std::regex row(R"(^\s*(\d+)\s+(dp=(\d+) tp=(\d+) pp=(\d+) m=(\d+)[^\n]*?)\s+([0-9.e+]+) (s|ms|us)\s)");
  std::vector<Row> r;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    const double unit = m[8] == "s" ? 1 : m[8] == "ms" ? 1e-3 : 1e-6;
    r.push_back({std::stoi(m[1]), std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5]), std::stoi(m[6]), m[2],
                 std::stod(m[7]) * unit});
  }
  return r;
}

TEST(CliPlan, PrintsValidLayoutsFastestFirst) {
  const auto spec = meshtrain::model::model_spec("gpt-small");
  const int heads = static_cast<int>(spec->gpt()->n_head);
  for (const auto& [cluster, batch] : {std::pair<std::string, int>{"this-machine.json", 8}, {"h100-node.json", 48}}) {
    const int devices = meshtrain::plan::read_cluster_file(example(cluster)).hardware.devices();
    const auto r = run_cli("plan --model gpt-small --cluster " + example(cluster) + " --global-batch " +
                               std::to_string(batch) + " --top 6",
                           120);
    ASSERT_EQ(r.code, 0) << r.output;
    std::smatch tried;
    ASSERT_TRUE(std::regex_search(r.output, tried, std::regex(R"(tried (\d+) layouts)"))) << r.output;
    EXPECT_GT(std::stol(tried[1]), 6);
    const std::vector<Row> table = rows(r.output);
    ASSERT_EQ(table.size(), 6u) << r.output;
    for (size_t i = 0; i < table.size(); ++i) {
      const Row& x = table[i];
      EXPECT_EQ(x.rank, static_cast<int>(i + 1));
      EXPECT_LE(x.dp * x.tp * x.pp, devices) << x.layout;
      EXPECT_EQ(heads % x.tp, 0) << x.layout;
      EXPECT_EQ(batch % (x.dp * x.m), 0) << x.layout;
      EXPECT_LE(x.pp, spec->num_units()) << x.layout;
      if (i > 0) {
        EXPECT_LE(table[i - 1].step_s, x.step_s) << x.layout;
      }
    }
    // The best as train flags: the first row's layout.
    const Row& best = table.front();
    EXPECT_NE(r.output.find("--dp " + std::to_string(best.dp) + " --tp " + std::to_string(best.tp) + " --pp " +
                            std::to_string(best.pp) + " --microbatches " + std::to_string(best.m)),
              std::string::npos)
        << r.output;
  }
}

// The line after the table: the best layout as train flags.
std::string best_flags(const std::string& out) {
  const auto at = out.find("best as train flags: ");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

// calibrate then plan, with no cluster file: the machine file meshtrain calibrate wrote is
// planned for as one node of that machine, by --machine or --cluster, and gives the plan the
// cluster file of one node pointing at it gives.
TEST(CliPlan, PlansForTheMachineFileCalibrateWrote) {
  meshtrain::testing::TempDir dir("plan_machine");
  const std::string m = dir.file("m.json");
  auto r = run_cli("calibrate --quick --out " + m, 180);
  ASSERT_EQ(r.code, 0) << r.output;
  nlohmann::json machine;
  std::ifstream(m) >> machine;
  ASSERT_GT(machine["memory_bytes"].get<int64_t>(), 0);
  nlohmann::json by_hand = {{"kind", "meshtrain cluster"}, {"version", 1}, {"name", "by-hand"}, {"nodes", 1}, {"machine", "m.json"}};
  std::ofstream(dir.file("c.json")) << by_hand.dump();
  by_hand["memory_gb"] = static_cast<double>(machine["memory_bytes"].get<int64_t>()) / 1e9;
  std::ofstream(dir.file("c_memory.json")) << by_hand.dump();

  const std::string plan = "plan --model gpt-tiny --global-batch 8 --top 1000 ";
  const auto by_machine = run_cli(plan + "--machine " + m, 120);
  ASSERT_EQ(by_machine.code, 0) << by_machine.output;
  const std::vector<Row> want = rows(by_machine.output);
  ASSERT_FALSE(want.empty()) << by_machine.output;
  EXPECT_NE(by_machine.output.find("(1 node x " + std::to_string(machine["cores"].get<int>()) + " ranks as threads on " +
                                   std::to_string(machine["cores"].get<int>()) + " cores)"),
            std::string::npos)
      << "all the cores calibrate recorded, one node\n" << by_machine.output;
  for (const std::string& args : {"--cluster " + m, "--cluster " + dir.file("c.json"), "--cluster " + dir.file("c_memory.json")}) {
    const auto other = run_cli(plan + args, 120);
    ASSERT_EQ(other.code, 0) << args << "\n" << other.output;
    const std::vector<Row> got = rows(other.output);
    ASSERT_EQ(got.size(), want.size()) << args << "\n" << other.output;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].layout, want[i].layout) << args << " row " << i + 1;
      EXPECT_DOUBLE_EQ(got[i].step_s, want[i].step_s) << args << " row " << i + 1;
    }
    EXPECT_EQ(best_flags(other.output), best_flags(by_machine.output)) << args;
  }
}

TEST(CliPlan, ImageModelsPrintImagesPerSecond) {
  const auto r = run_cli("plan --model resnet-small --cluster " + example("h100-node.json") + " --global-batch 32 --top 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("images/s"), std::string::npos) << r.output;
  for (const Row& x : rows(r.output)) EXPECT_EQ(x.tp, 1) << x.layout;
  EXPECT_EQ(rows(r.output).size(), 2u) << r.output;
}

// --ops lists the layout's ops: every layer of resnet-small's graph that costs time, by name,
// and their total.
TEST(CliPlan, OpsListsEveryOpOfTheLayout) {
  const auto r = run_cli("plan --model resnet-small --cluster " + example("h100-node.json") +
                         " --global-batch 32 --layout \"dp=1 tp=1 pp=1 m=1\" --ops");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* op : {"conv1 ", "layer1.0.conv2 ", "layer3.0.downsample.0 ", "fc ", "total "})
    EXPECT_NE(r.output.find(std::string("\n") + op), std::string::npos) << op << "\n" << r.output;
  EXPECT_NE(r.output.find("convolution"), std::string::npos) << r.output;
}

TEST(CliPlan, SvgDrawsTheBestLayout) {
  meshtrain::testing::TempDir dir("plan_cli");
  const std::string svg = dir.file("best.svg");
  const std::string args = "plan --model gpt-small --cluster " + example("h100-node.json") + " --global-batch 16 --top 1 --svg ";
  auto r = run_cli(args + svg);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<Row> table = rows(r.output);
  ASSERT_EQ(table.size(), 1u) << r.output;
  const std::string text = slurp(svg);
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find(meshtrain::pipeline::kSvgMark), std::string::npos);
  EXPECT_NE(text.find("class=\"block\""), std::string::npos);
  EXPECT_NE(text.find(table.front().layout.substr(0, table.front().layout.find_last_not_of(' ') + 1)), std::string::npos)
      << "the title names the layout";
  // One lane per pipeline rank of the best layout.
  for (int p = 0; p < table.front().pp; ++p)
    EXPECT_NE(text.find("rank " + std::to_string(p)), std::string::npos) << p;
  EXPECT_NE(r.output.find("swimlane: " + svg), std::string::npos);

  // Its own file is replaced; a file meshtrain did not write is kept unless --overwrite.
  EXPECT_EQ(run_cli(args + svg).code, 0);
  const std::string mine = dir.file("mine.svg");
  std::ofstream(mine) << "<svg>my drawing</svg>\n";
  r = run_cli(args + mine);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--overwrite"), std::string::npos) << r.output;
  EXPECT_EQ(slurp(mine), "<svg>my drawing</svg>\n");
  EXPECT_EQ(run_cli(args + mine + " --overwrite").code, 0);
  EXPECT_NE(slurp(mine).find(meshtrain::pipeline::kSvgMark), std::string::npos);
}

TEST(CliPlan, BadInputExits2WithASentence) {
  meshtrain::testing::TempDir dir("plan_cli");
  // A cluster file with a field the reader does not know.
  nlohmann::json j;
  std::ifstream(example("h100-node.json")) >> j;
  j["colour"] = "blue";
  std::ofstream(dir.file("typo.json")) << j.dump();
  // A cluster whose devices hold a kilobyte.
  std::ifstream(example("h100-node.json")) >> j;
  j["device"]["memory_gb"] = 1e-6;
  std::ofstream(dir.file("tiny.json")) << j.dump();
  const std::string h100 = " --cluster " + example("h100-node.json");
  struct Case {
    std::string args;
    std::vector<std::string> words;
  };
  std::ofstream(dir.file("trace.json")) << R"({"kind": "meshtrain trace"})";
  const std::vector<Case> cases = {
      {"plan --model gpt-small --global-batch 8", {"--cluster", "--machine", "calibrate"}},
      {"plan --model gpt-small --global-batch 8 --machine " + example("this-machine.machine.json") + h100,
       {"one of --cluster FILE and --machine FILE, not both"}},
      {"plan --model gpt-small --global-batch 8 --machine " + example("h100-node.json"),
       {"h100-node.json is a cluster file", "--cluster"}},
      {"plan --model gpt-small --global-batch 8 --cluster " + dir.file("trace.json"),
       {"trace.json has kind \"meshtrain trace\"", "\"meshtrain cluster\"", "\"meshtrain machine\""}},
      {"plan --model gpt-small --global-batch 8 --machine " + dir.file("trace.json"),
       {"trace.json has kind \"meshtrain trace\"", "\"meshtrain machine\""}},
      {"plan --model gpt-small --global-batch 8 --cluster " + dir.file("typo.json"), {"typo.json", "colour is not a field"}},
      {"plan --model gpt-small --global-batch 8 --cluster " + dir.file("absent.json"), {"absent.json"}},
      {"plan --model gpt-small --global-batch 8 --cluster " + dir.file("tiny.json"),
       {"fits no layout", "recomputation", "ZeRO", "devices"}},
      {"plan --model gpt-small --global-batch 8 --top 0" + h100, {"--top"}},
      {"plan --model gpt-small --global-batch 8 --top -1" + h100, {"--top"}},
      {"plan --model gpt-small" + h100, {"--global-batch"}},
      {"plan --model gpt-small --global-batch 0" + h100, {"--global-batch"}},
      {"plan --global-batch 8" + h100, {"--model"}},
      {"plan --model gpt-small --config x.json --global-batch 8" + h100, {"--model", "--config"}},
      {"plan --model gpt-huge --global-batch 8" + h100, {"gpt-huge"}},
      {"plan --model gpt-small --global-batch 8 --seq 100000" + h100, {"--seq", "block_size"}},
      {"plan --model resnet-small --global-batch 8 --seq 16" + h100, {"--seq"}},
      {"plan --model gpt-small --global-batch 8 --optimizer adam" + h100, {"--optimizer"}},
      {"plan --model gpt-small --global-batch 8 --svg " + dir.file("no/such/dir/x.svg") + h100, {"--svg"}},
      {"plan --model gpt-small --global-batch 8 --svg " + example("h100-node.json") + h100, {"--svg"}},
      {"plan --model gpt-small --global-batch 8 --ops" + h100, {"--ops", "--layout"}},
  };
  for (const Case& c : cases) {
    const auto r = run_cli(c.args, 60);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    for (const std::string& w : c.words) EXPECT_NE(r.output.find(w), std::string::npos) << c.args << ": " << w << "\n" << r.output;
    EXPECT_EQ(r.output.find("tried "), std::string::npos) << "planned before refusing: " << c.args;
  }
  // The cluster file the --svg case pointed at is untouched.
  nlohmann::json again;
  std::ifstream(example("h100-node.json")) >> again;
  EXPECT_EQ(again["name"], "h100-node");
}

}  // namespace

// `meshtrain train` with a machine file: the prediction at the start, predicted against
// measured at the end, and the figures in every metrics line; a bad machine file exits 2.
TEST(CliTrainPrediction, PrintsPredictedAgainstMeasuredAndWritesItInTheMetrics) {
  meshtrain::testing::TempDir tmp("train_prediction");
  const std::string corpus = tmp.file("corpus.txt");
  {
    std::ofstream f(corpus);
    for (int i = 0; i < 3000; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const std::string metrics = tmp.file("m.jsonl");
  const std::string machine = example("this-machine.machine.json");
  auto r = run_cli("train --model gpt-tiny --data " + corpus + " --steps 6 --batch 4 --seq 32 --eval-every 0 "
                   "--eval-batches 1 --pp 2 --microbatches 2 --threads 1 --metrics " + metrics + " --machine " + machine,
                   300);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::regex start(R"(predicted \(cost model, machine file [^)]*\): step ([\d.]+) ms)");
  const std::regex end(R"(predicted against measured: step ([\d.]+) ms vs ([\d.]+) ms \(median of steps 3-6\), error ([+-][\d.]+)% \| peak tensor memory of rank (\d) ([\d.]+) MiB vs ([\d.]+) MiB)");
  std::smatch s, e;
  ASSERT_TRUE(std::regex_search(r.output, s, start)) << r.output;
  ASSERT_TRUE(std::regex_search(r.output, e, end)) << r.output;
  EXPECT_EQ(s[1].str(), e[1].str());  // the same prediction at both ends
  const double predicted = std::stod(e[1].str()), measured = std::stod(e[2].str());
  EXPECT_GT(predicted, 0);
  EXPECT_GT(measured, 0);
  // The printed times are rounded to 0.01 ms: the error recomputed from them may differ by that.
  const double rounding = 0.06 + 100 * 0.005 / measured * (1 + predicted / measured);
  EXPECT_NEAR(std::stod(e[3].str()), 100 * (predicted - measured) / measured, rounding);
  EXPECT_LT(std::stoi(e[4].str()), 2);  // one of the two ranks
  // Every line carries the prediction and rank 0's peak so far (never falling).
  std::ifstream f(metrics);
  std::string line;
  int lines = 0;
  double last_peak = 0;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_NEAR(j.at("predicted_step_ms").get<double>(), predicted, 0.01 * predicted + 0.01);
    const double step_ms = j.at("step_ms").get<double>(), peak = j.at("peak_tensor_bytes").get<double>();
    const double pred_peak = j.at("predicted_peak_tensor_bytes").get<double>();
    EXPECT_GT(pred_peak, 0);
    EXPECT_NEAR(j.at("predicted_step_error").get<double>(), (j.at("predicted_step_ms").get<double>() - step_ms) / step_ms, 1e-9);
    EXPECT_NEAR(j.at("predicted_peak_error").get<double>(), (pred_peak - peak) / peak, 1e-9);
    EXPECT_GE(peak, last_peak);
    last_peak = peak;
    ++lines;
  }
  EXPECT_EQ(lines, 6);

  // A machine file whose rates are a twentieth of this one's (measured on a busy machine): the
  // run says its prediction is far off and what to do.
  {
    std::ifstream in(machine);
    nlohmann::json m = nlohmann::json::parse(in);
    for (auto& g : m["gemm"]) g["gflops"] = g["gflops"].get<double>() / 20;
    for (auto& e : m["elementwise"]) e["bytes_per_s"] = e["bytes_per_s"].get<double>() / 20;
    for (auto& a : m["attention"]) a["gflops"] = a["gflops"].get<double>() / 20;
    std::ofstream(tmp.file("slow.json")) << m.dump();
  }
  r = run_cli("train --model gpt-tiny --data " + corpus + " --steps 6 --batch 4 --seq 32 --eval-every 0 "
              "--eval-batches 1 --threads 1 --machine " + tmp.file("slow.json"), 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("note: the predicted step is"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("meshtrain calibrate --out FILE"), std::string::npos) << r.output;

  // A machine file that is not one: exit 2 naming it, before any step.
  const std::string bad = tmp.file("bad.json");
  std::ofstream(bad) << "{\"kind\": \"meshtrain machine\"}\n";
  r = run_cli("train --model gpt-tiny --data " + corpus + " --steps 2 --machine " + bad, 120);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step    1"), std::string::npos) << r.output;
}


// train says when the cost model predicts its layout well below one rank on the same cores: with
// a machine file whose links are a thousand times slower, tp 2's collectives make it so, and
// one rank gets no such note.
TEST(CliTrainPrediction, SaysWhenALayoutDoesNotPayAgainstOneRank) {
  meshtrain::testing::TempDir tmp("train_pays");
  const std::string corpus = tmp.file("corpus.txt");
  {
    std::ofstream f(corpus);
    for (int i = 0; i < 3000; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  nlohmann::json m;
  std::ifstream(example("this-machine.machine.json")) >> m;
  for (auto& l : m["links"]) {
    l["alpha_s"] = l["alpha_s"].get<double>() * 1000;
    l["beta_s_per_byte"] = l["beta_s_per_byte"].get<double>() * 1000;
    for (auto& p : l["points"]) p["seconds"] = p["seconds"].get<double>() * 1000;
  }
  const std::string machine = tmp.file("slow-links.json");
  std::ofstream(machine) << m.dump(1);
  const std::string train = "train --model gpt-tiny --data " + corpus + " --steps 1 --batch 4 --seq 32 --eval-every 0 "
                            "--eval-batches 1 --threads 1 --machine " + machine;
  const auto split = run_cli(train + " --tp 2", 300);
  ASSERT_EQ(split.code, 0) << split.output;
  const std::regex note(R"(cost model: note: one rank on the same cores \(--threads 2\) is predicted at ([\d.]+) ms a step against this layout's ([\d.]+) ms, so this layout would run at ([\d.]+)x one rank's speed: it does not pay)");
  std::smatch n;
  ASSERT_TRUE(std::regex_search(split.output, n, note)) << split.output;
  EXPECT_LT(std::stod(n[3].str()), 0.9);
  EXPECT_NEAR(std::stod(n[3].str()), std::stod(n[1].str()) / std::stod(n[2].str()), 0.01);
  const auto one = run_cli(train, 300);
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_EQ(one.output.find("does not pay"), std::string::npos) << one.output;
}
