// What the program writes, checked end to end by running it: the Chrome trace of `train
// --trace` (one process per rank, compute spans in step order, communication spans on their
// own track) and the table of `bench comm` (one row per size, the columns its header names,
// every result checked, bus bandwidth by the nccl-tests factor).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "temp_dir.h"

namespace {

struct Result {
  int code;
  std::string output;
  double wall_us;  // how long the program ran, as seen from here
};

Result run(const std::string& args) {
  const std::string cmd = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain " + args + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, us};
}

const meshtrain::testing::TempDir& scratch() {
  static meshtrain::testing::TempDir dir("cli_out");
  return dir;
}

std::string corpus() {
  std::string p = scratch().file("corpus.txt");
  if (!std::filesystem::exists(p)) {
    std::ofstream f(p);
    for (int i = 0; i < 2000; ++i) f << "to be or not to be, that is the question. ";
  }
  return p;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

}  // namespace

// ---- train --trace ----

TEST(CliOutputs, TraceHasOneProcessPerRankAndOrderedSpans) {
  const int steps = 3, ranks = 2;
  const std::string trace = scratch().file("run.json");
  Result r = run("train --data " + corpus() + " --dp 2 --batch 4 --seq 16 --steps 3 --eval-batches 1 --quiet --trace " +
                 trace);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream f(trace);
  ASSERT_TRUE(f) << "no trace written at " << trace;
  const nlohmann::json doc = nlohmann::json::parse(f);  // throws (fails the test) if not JSON
  ASSERT_TRUE(doc.contains("traceEvents") && doc["traceEvents"].is_array()) << doc.dump().substr(0, 200);

  std::map<int, std::string> process_names;
  // rank -> category -> spans (ts, end) in time order
  std::map<int, std::map<std::string, std::vector<std::pair<double, double>>>> spans;
  for (const auto& e : doc["traceEvents"]) {
    const std::string ph = e.at("ph");
    if (ph == "M" && e.at("name") == "process_name") {
      process_names[e.at("pid").get<int>()] = e.at("args").at("name").get<std::string>();
      continue;
    }
    if (ph != "X") continue;
    const int pid = e.at("pid"), tid = e.at("tid");
    const std::string cat = e.at("cat");
    const double ts = e.at("ts"), dur = e.at("dur");
    EXPECT_GE(ts, 0.0) << e.dump();
    EXPECT_GE(dur, 0.0) << e.dump();
    // Every span lies inside the run (the recorder starts after the program does).
    EXPECT_LE(ts + dur, r.wall_us) << e.dump();
    EXPECT_EQ(tid, cat == "comm" ? 1 : 0) << "communication on track 1, compute on track 0: " << e.dump();
    if (cat == "forward" || cat == "backward" || cat == "optimizer") {
      EXPECT_GT(dur, 0.0) << "a step's " << cat << " took no time: " << e.dump();
    }
    spans[pid][cat].emplace_back(ts, ts + dur);
  }
  ASSERT_EQ(process_names.size(), static_cast<size_t>(ranks));
  for (int rk = 0; rk < ranks; ++rk) {
    SCOPED_TRACE("rank " + std::to_string(rk));
    EXPECT_EQ(process_names[rk], "rank " + std::to_string(rk));
    auto& s = spans[rk];
    for (const char* cat : {"forward", "backward", "optimizer"}) {
      ASSERT_EQ(s[cat].size(), static_cast<size_t>(steps)) << cat;
      std::sort(s[cat].begin(), s[cat].end());
    }
    EXPECT_GE(s["comm"].size(), static_cast<size_t>(steps)) << "every step all-reduces its gradients";
    // Step k: forward, then backward, then the optimizer, then step k + 1's forward.
    for (int k = 0; k < steps; ++k) {
      EXPECT_LE(s["forward"][k].second, s["backward"][k].first) << "step " << k;
      EXPECT_LE(s["backward"][k].second, s["optimizer"][k].first) << "step " << k;
      if (k + 1 < steps) {
        EXPECT_LE(s["optimizer"][k].second, s["forward"][k + 1].first) << "step " << k;
      }
    }
  }
  // The swimlane beside it.
  std::ifstream svg(scratch().file("run.svg"));
  std::string head((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(head.find("<svg"), std::string::npos) << "no SVG swimlane beside the trace";
}

// ---- the measured swimlane: train --trace at pp 2, and trace render ----

namespace {
size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST(CliOutputs, PipelineTraceRendersOneBlockPerForwardAndBackward) {
  const int steps = 2, m = 4, pp = 2;
  const std::string trace = scratch().file("pp.json");
  Result r = run("train --data " + corpus() + " --pp 2 --microbatches 4 --schedule 1f1b --batch 8 --seq 16 --steps 2 "
                 "--eval-batches 1 --quiet --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  Result render = run("trace render " + trace + " -o " + scratch().file("again.svg"));
  ASSERT_EQ(render.code, 0) << render.output;
  for (const std::string& path : {scratch().file("pp.svg"), scratch().file("again.svg")}) {
    SCOPED_TRACE(path);
    const std::string svg = slurp(path);
    ASSERT_NE(svg.find("<svg"), std::string::npos);
    // Every forward and backward of every rank and step is one labelled block.
    for (const char* kind : {"F", "B"})
      EXPECT_EQ(count_of(svg, "data-kind=\"" + std::string(kind) + "\">") -
                    count_of(svg, "class=\"legend-entry\" data-kind=\"" + std::string(kind) + "\">"),
                static_cast<size_t>(steps * m * pp))
          << kind;
    EXPECT_NE(svg.find("class=\"legend\""), std::string::npos) << "a legend";
    EXPECT_GE(count_of(svg, "class=\"boundary\""), static_cast<size_t>(steps)) << "step boundaries";
    EXPECT_GE(count_of(svg, "class=\"tick-label\""), 2u) << "a time axis";
  }
  // Bad input: no such trace, or a file that is no trace.
  Result missing = run("trace render " + scratch().file("none.json") + " -o " + scratch().file("x.svg"));
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("none.json does not exist; give the JSON file"), std::string::npos) << missing.output;
  Result not_trace = run("trace render " + corpus() + " -o " + scratch().file("x.svg"));
  EXPECT_EQ(not_trace.code, 2) << not_trace.output;
  // The trace as its own output: refused, the trace unchanged.
  const std::string before = slurp(trace);
  Result onto_itself = run("trace render " + trace + " -o " + trace);
  EXPECT_EQ(onto_itself.code, 2) << onto_itself.output;
  EXPECT_NE(onto_itself.output.find("is the same file as the trace"), std::string::npos) << onto_itself.output;
  EXPECT_EQ(slurp(trace), before);
}

// ---- bench comm ----

// Runs `bench comm` and checks its table: the header names the op and world, the column line
// names every column, and each requested size has one row whose check passed, whose count is
// the size in float32 elements, and whose bus bandwidth is the algorithm bandwidth times the
// nccl-tests factor of the op.
void check_bench_table(const std::string& op, int world, double bus_factor, int divisor) {
  Result r = run("bench comm --op " + op + " --world " + std::to_string(world) +
                 " --sizes 4K:32K --iters 2 --warmup 1 --reps 1");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto lines = lines_of(r.output);
  bool header = false, columns = false;
  std::vector<std::vector<std::string>> rows;
  for (const auto& l : lines) {
    if (l.rfind("# meshtrain bench comm:", 0) == 0) {
      header = true;
      EXPECT_NE(l.find("op=" + op), std::string::npos) << l;
      EXPECT_NE(l.find("world=" + std::to_string(world)), std::string::npos) << l;
      continue;
    }
    if (l.empty() || l[0] == '#') continue;
    auto f = fields_of(l);
    if (!f.empty() && f[0] == "size") {
      columns = true;
      EXPECT_EQ(f, (std::vector<std::string>{"size", "count", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                                             "check", "memcpy(GB/s)", "ratio", "copy2/2(GB/s)", "limit"}));
      continue;
    }
    rows.push_back(f);
  }
  EXPECT_TRUE(header) << r.output;
  EXPECT_TRUE(columns) << r.output;
  const std::vector<size_t> sizes = {4096, 8192, 16384, 32768};  // 4K:32K doubles
  ASSERT_EQ(rows.size(), sizes.size()) << r.output;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& f = rows[i];
    SCOPED_TRACE(op + " row " + std::to_string(i) + ": " + r.output);
    ASSERT_EQ(f.size(), 11u);
    // The whole buffer of reduce_scatter/all_gather is rounded down to a multiple of the world.
    const size_t count = std::stoul(f[1]);
    EXPECT_EQ(count, sizes[i] / 4 / divisor * divisor);
    EXPECT_EQ(count % divisor, 0u);
    EXPECT_EQ(f[6], "ok");
    const double us = std::stod(f[3]), algbw = std::stod(f[4]), busbw = std::stod(f[5]);
    EXPECT_GT(us, 0.0);
    // algbw = bytes / time (GB/s = bytes / us / 1e3), both printed rounded (a loaded machine can
    // make a 4 KiB operation slow enough to print 0.000).
    EXPECT_NEAR(algbw, static_cast<double>(count * 4) / us / 1e3, 0.0015 + 0.01 * algbw);
    EXPECT_NEAR(busbw, algbw * bus_factor, 0.0015 + 0.001 * busbw);
    EXPECT_GT(std::stod(f[7]), 0.0);  // the memcpy peer figure
    // The memory-traffic limit: half the two threads' copy rate, and busbw against it.
    const double copy2 = std::stod(f[9]);
    EXPECT_GT(copy2, 0.0);
    EXPECT_NEAR(std::stod(f[10]), busbw / copy2, 0.006 + 0.01 * busbw / copy2);
  }
}

TEST(CliOutputs, BenchCommAllReduceTable) { check_bench_table("all_reduce", 3, 2.0 * 2 / 3, 1); }

TEST(CliOutputs, BenchCommAllGatherTable) { check_bench_table("all_gather", 3, 2.0 / 3, 3); }
