// `meshtrain schedule` end to end: every known schedule runs, the printed bubble of GPipe and
// 1F1B is the textbook (p - 1) / (m + p - 1), --svg writes a swimlane with a block per compute
// action, and bad input exits 2 with a sentence naming the flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "temp_dir.h"

using meshtrain::testing::run_cli;

namespace {

// The schedules the docs list (docs/pipeline.md, "Generators").
// "zb" is train's name for zb-h1, taken by schedule too.
const std::vector<std::string> kSchedules = {"naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb"};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

// The bubble column of the per-rank table (rows "<rank> <busy> <bubble> <peak>").
std::vector<double> rank_bubbles(const std::string& out) {
  std::vector<double> b;
  const std::regex row(R"(^(\d+)\s+([0-9.e+]+)\s+([0-9.]+)\s+(\d+)\s*$)");
  std::istringstream lines(out);
  bool in_table = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("rank ", 0) == 0 && line.find("bubble") != std::string::npos) in_table = true;
    std::smatch m;
    if (in_table && std::regex_match(line, m, row)) {
      EXPECT_EQ(std::stoi(m[1]), static_cast<int>(b.size())) << line;
      b.push_back(std::stod(m[3]));
    }
  }
  return b;
}

double overall_bubble(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(bubble fraction ([0-9.]+))"))) return -1;
  return std::stod(m[1]);
}

}  // namespace

TEST(ScheduleCli, EveryKnownScheduleRuns) {
  for (const std::string& name : kSchedules) {
    const auto r = run_cli("schedule --pp 4 --microbatches 8 --schedule " + name);
    EXPECT_EQ(r.code, 0) << name << "\n" << r.output;
    EXPECT_EQ(rank_bubbles(r.output).size(), 4u) << name << "\n" << r.output;
    EXPECT_NE(r.output.find("step time"), std::string::npos) << name;
    EXPECT_NE(r.output.find("0F0"), std::string::npos) << name << ": no action lists\n" << r.output;
  }
  const auto r = run_cli("schedule --help");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const std::string& name : kSchedules) EXPECT_NE(r.output.find(name), std::string::npos) << name;
}

TEST(ScheduleCli, GPipeAndOneFOneBPrintTheTextbookBubble) {
  for (const char* name : {"gpipe", "1f1b"})
    for (auto [p, m] : std::vector<std::pair<int, int>>{{4, 8}, {2, 1}, {3, 5}, {1, 4}}) {
      const auto r = run_cli("schedule --schedule " + std::string(name) + " --pp " + std::to_string(p) +
                             " --microbatches " + std::to_string(m));
      ASSERT_EQ(r.code, 0) << r.output;
      const double expected = double(p - 1) / (m + p - 1);
      const std::vector<double> b = rank_bubbles(r.output);
      ASSERT_EQ(b.size(), static_cast<std::size_t>(p)) << r.output;
      for (double x : b) EXPECT_NEAR(x, expected, 6e-5) << name << " p=" << p << " m=" << m;
      EXPECT_NEAR(overall_bubble(r.output), expected, 6e-5) << name << " p=" << p << " m=" << m << "\n" << r.output;
    }
}

TEST(ScheduleCli, SvgHasABlockPerComputeAction) {
  meshtrain::testing::TempDir dir("schedule_cli");
  struct Case {
    std::string args;
    int compute_actions;
  };
  // gpipe / 1f1b: F and B per stage and micro-batch; zb-h1: F, I and W; interleaved: per chunk.
  for (const Case& c : {Case{"--schedule gpipe --pp 4 --microbatches 8", 4 * 8 * 2},
                        Case{"--schedule zb-h1 --pp 3 --microbatches 6", 3 * 6 * 3},
                        Case{"--schedule interleaved --pp 2 --microbatches 4 --chunks 2", 2 * 2 * 4 * 2}}) {
    const std::string path = dir.file("lane.svg");
    std::filesystem::remove(path);
    const auto r = run_cli("schedule " + c.args + " --svg " + path);
    ASSERT_EQ(r.code, 0) << c.args << "\n" << r.output;
    std::ifstream f(path);
    ASSERT_TRUE(f) << c.args << ": no SVG written";
    std::stringstream svg;
    svg << f.rdbuf();
    EXPECT_NE(svg.str().find("<svg"), std::string::npos);
    EXPECT_EQ(count(svg.str(), "class=\"block\""), static_cast<std::size_t>(c.compute_actions)) << c.args;
    EXPECT_GE(count(svg.str(), "class=\"legend-entry\""), 2u) << c.args;
    EXPECT_GE(count(svg.str(), "class=\"tick-label\""), 2u) << c.args;
  }
}

TEST(ScheduleCli, BadInputExits2WithASentence) {
  meshtrain::testing::TempDir dir("schedule_cli");
  {
    const auto r = run_cli("schedule --pp 0");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("--pp"), std::string::npos) << r.output;
  }
  {
    const auto r = run_cli("schedule --schedule zigzag");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("zigzag"), std::string::npos) << r.output;
    for (const std::string& name : kSchedules)
      EXPECT_NE(r.output.find(name), std::string::npos) << "the refusal does not list " << name << ":\n" << r.output;
  }
  {
    const auto r = run_cli("schedule --schedule interleaved --pp 4 --microbatches 6 --chunks 2");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("multiple of 4"), std::string::npos) << r.output;
  }
  {
    const auto r = run_cli("schedule --schedule 1f1b --chunks 2");
    EXPECT_EQ(r.code, 2) << r.output;
  }
  {
    const std::string path = dir.file("missing/lane.svg");
    const auto r = run_cli("schedule --svg " + path);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("--svg"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  // F=1e308: finite, but the simulated sums overflowed to inf and the bubbles printed nan.
  for (const char* costs : {"F=0", "B=-1", "X=1", "F", "F=1,,B=2", "send=nan", "F=1e308,B=1e308", "W=1e-320"}) {
    const auto r = run_cli(std::string("schedule --costs ") + costs);
    EXPECT_EQ(r.code, 2) << costs << "\n" << r.output;
    EXPECT_NE(r.output.find("--costs"), std::string::npos) << costs << "\n" << r.output;
  }
  {
    const auto r = run_cli("schedule --pp 1000 --microbatches 1000");
    EXPECT_EQ(r.code, 2) << r.output;
  }
}

TEST(ScheduleCli, CostsChangeTheStepTime) {
  // 1F1B with p = 2, m = 3 takes (m + p - 1)(F + B): 4 x 3 with the defaults, 4 x 5 with B=4.
  const auto plain = run_cli("schedule --schedule 1f1b --pp 2 --microbatches 3");
  const auto slow = run_cli("schedule --schedule 1f1b --pp 2 --microbatches 3 --costs B=4");
  ASSERT_EQ(plain.code, 0) << plain.output;
  ASSERT_EQ(slow.code, 0) << slow.output;
  EXPECT_NE(plain.output.find("step time 12;"), std::string::npos) << plain.output;
  EXPECT_NE(slow.output.find("step time 20;"), std::string::npos) << slow.output;
}

// --action-costs replays measured times of single actions: the hand-computed GPipe case of
// PipelineSimulate.MeasuredActionTimesOverrideTheirKind (1B0 five times a forward, every other
// action at its kind's cost), given as a file with a comment and a blank line.
TEST(ScheduleCli, ActionCostsReplayMeasuredTimes) {
  meshtrain::testing::TempDir dir("schedule_cli");
  const std::string path = dir.file("times.txt");
  std::ofstream(path) << "# measured\n1B0 5   # the slow one\n\n0F0 1\n";
  const auto r = run_cli("schedule --schedule gpipe --pp 2 --microbatches 2 --action-costs " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step time 12;"), std::string::npos) << r.output;
  const std::vector<double> b = rank_bubbles(r.output);
  ASSERT_EQ(b.size(), 2u) << r.output;
  EXPECT_NEAR(b[0], 0.5, 1e-4);
  EXPECT_NEAR(b[1], 0.25, 1e-4);
  EXPECT_NE(r.output.find("2 of 8 compute actions timed from"), std::string::npos) << r.output;
}

TEST(ScheduleCli, BadActionCostsExit2NamingTheLine) {
  meshtrain::testing::TempDir dir("schedule_cli");
  struct Case {
    std::string text, phrase;
  };
  for (const Case& c : {Case{"0F0 1\n1SEND_F0 2\n", ":2: 1SEND_F0 is not a compute action"},
                        Case{"3F0 1\n", "3F0 is not a compute action of this gpipe schedule"},
                        Case{"0F7 1\n", "--microbatches"},
                        Case{"0F0\n", "expected '<action> <time>'"},
                        Case{"0F0 1 2\n", "expected '<action> <time>'"},
                        Case{"0Q0 1\n", ":1: "},
                        Case{"0F0 -1\n", "from 0 to 1e+12, not '-1'"},
                        Case{"0F0 1e300\n", "from 0 to 1e+12, not '1e300'"},
                        Case{"0F0 fast\n", "not 'fast'"},
                        Case{"0F0 1\n0F0 2\n", "given twice"}}) {
    const std::string path = dir.file("times.txt");
    std::ofstream(path) << c.text;
    const auto r = run_cli("schedule --schedule gpipe --pp 2 --microbatches 2 --action-costs " + path);
    EXPECT_EQ(r.code, 2) << c.text << "\n" << r.output;
    EXPECT_NE(r.output.find(c.phrase), std::string::npos) << c.text << "\n" << r.output;
  }
  const auto r = run_cli("schedule --action-costs " + dir.file("missing.txt"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot read"), std::string::npos) << r.output;
  const auto d = run_cli("schedule --action-costs " + dir.path().string());
  EXPECT_EQ(d.code, 2) << d.output;
  EXPECT_NE(d.output.find("is a directory"), std::string::npos) << d.output;
  // --svg onto the times it reads: refused before anything is written.
  const std::string times = dir.file("times.txt");
  std::ofstream(times) << "0F0 1\n";
  const auto same = run_cli("schedule --schedule gpipe --pp 2 --microbatches 2 --action-costs " + times + " --svg " + times);
  EXPECT_EQ(same.code, 2) << same.output;
  EXPECT_NE(same.output.find("is the same file as --action-costs"), std::string::npos) << same.output;
  std::ifstream back(times);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(back), {}), "0F0 1\n");
}
