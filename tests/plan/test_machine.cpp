// The machine file (plan/machine.h): its JSON round-trips, bad files are refused naming the
// file and the field, and `calibrate --quick` on this machine gives positive, finite rates that
// agree with the trainer's own GEMM measurement (train/metrics.h) and link fits that reproduce
// their own points. No timing bounds beyond loose consistency factors (the suite runs loaded).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "meshtrain/kernels/bf16.h"
#include "meshtrain/plan/calibrate_cnn.h"
#include "meshtrain/plan/machine.h"
#include "meshtrain/train/metrics.h"
#include "temp_dir.h"

namespace {
using meshtrain::plan::MachineProfile;
using nlohmann::json;

MachineProfile sample() {
  MachineProfile p;
  p.mode = "quick";
  p.date = "2025-01-31T12:00:00Z";
  p.meshtrain_commit = "abc123";
  p.host = "h";
  p.cpu_model = "Test CPU";
  p.cores = 2;
  p.gemm_backend = "dnnl";
  p.bf16_isa = "avx512_core_bf16";
  p.calibrate_seconds = 3.5;
  p.call_overhead_s = 2e-6;
  p.llc_bytes = 32 << 20;
  p.memory_bytes = int64_t{24} << 30;
  p.shared_core_efficiency = 0.8;
  p.oversubscribed_handoff_s = 5e-5;
  p.gemm = {{"square_1024", 1024, 1024, 1024, "float32", 1, 95.5}, {"square_1024", 1024, 1024, 1024, "bf16", 2, 300}};
  p.elementwise = {{"add", 1 << 20, 1, 2.5e10}};
  p.attention = {{1, 256, 768, 12, 2, 40.25}};
  p.conv = {{"blocked", 16, 32, 64, 3, 1, 14, 2, 80.5, 60.25, 50.125}};
  p.cnn_layers = {{"batchnorm_relu", "nchw", 1 << 18, 1, 1e-4, 2e-4}};
  p.links = {{"threads", "all_reduce", 2, 2e-6, 1e-10, 0.1, {{8, 2e-6}, {1 << 20, 1.1e-4}}}};
  p.not_measured = {{"mpi_tcp", "not launched by mpirun"}};
  return p;
}

// The message from_json gives for `j`, or "" when it accepts it.
std::string refusal(const json& j) {
  try {
    meshtrain::plan::from_json(j, "m.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(MachineFile, RoundTripsEveryField) {
  const json j = meshtrain::plan::to_json(sample());
  const MachineProfile back = meshtrain::plan::from_json(j, "m.json");
  EXPECT_EQ(meshtrain::plan::to_json(back), j);
  EXPECT_EQ(back.gemm.size(), 2u);
  EXPECT_DOUBLE_EQ(back.gemm_gflops("square_1024", "bf16", 2), 300);
  EXPECT_EQ(back.gemm_gflops("square_1024", "bf16", 1), 0);
  ASSERT_NE(back.link("threads", "all_reduce"), nullptr);
  EXPECT_EQ(back.link("threads", "all_reduce")->points.size(), 2u);
  EXPECT_EQ(back.link("mpi_tcp", "all_reduce"), nullptr);
  EXPECT_EQ(j["kind"], "meshtrain machine");
  EXPECT_EQ(j["version"], 4);
  ASSERT_EQ(back.conv.size(), 1u);
  EXPECT_DOUBLE_EQ(back.conv[0].bwd_weights_gflops, 50.125);
  ASSERT_EQ(back.cnn_layers.size(), 1u);
  EXPECT_EQ(back.cnn_layers[0].op, "batchnorm_relu");
  EXPECT_EQ(j["memory_bytes"], int64_t{24} << 30);
}

// Version 2 (before memory_bytes) is still read, its memory unknown; a version 3 file must
// give it.
TEST(MachineFile, ReadsVersion2WithoutItsMemory) {
  json j = meshtrain::plan::to_json(sample());
  j["version"] = 2;
  j.erase("memory_bytes");
  j.erase("conv");
  j.erase("cnn_layers");
  const MachineProfile old = meshtrain::plan::from_json(j, "m.json");
  EXPECT_EQ(old.version, 2);
  EXPECT_EQ(old.memory_bytes, 0);
  EXPECT_EQ(meshtrain::plan::to_json(old), j) << "a version 2 file is written back as it was";
  j["memory_bytes"] = 1;
  EXPECT_NE(refusal(j).find("memory_bytes is not a field"), std::string::npos) << refusal(j);
}

// Version 3 (before the convolutional networks' layers) is still read, without them: the cost
// model then prices convolutions as before (plan/cost.h).
TEST(MachineFile, ReadsVersion3WithoutConvolutions) {
  json j = meshtrain::plan::to_json(sample());
  j["version"] = 3;
  j.erase("conv");
  j.erase("cnn_layers");
  const MachineProfile old = meshtrain::plan::from_json(j, "m.json");
  EXPECT_EQ(old.version, 3);
  EXPECT_TRUE(old.conv.empty());
  EXPECT_TRUE(old.cnn_layers.empty());
  EXPECT_EQ(meshtrain::plan::to_json(old), j) << "a version 3 file is written back as it was";
  j["conv"] = json::array();
  EXPECT_NE(refusal(j).find("conv is not a field"), std::string::npos) << refusal(j);
}

TEST(MachineFile, WritesAndReadsAFile) {
  meshtrain::testing::TempDir dir("machine");
  const std::string path = dir.file("m.json");
  meshtrain::plan::write_machine_file(sample(), path);
  EXPECT_EQ(meshtrain::plan::to_json(meshtrain::plan::read_machine_file(path)), meshtrain::plan::to_json(sample()));
  EXPECT_THROW(meshtrain::plan::read_machine_file(dir.file("absent.json")), std::invalid_argument);
  std::ofstream(dir.file("bad.json")) << "{ not json";
  try {
    meshtrain::plan::read_machine_file(dir.file("bad.json"));
    FAIL() << "bad JSON accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json is not valid JSON: syntax error at line 1"), std::string::npos) << e.what();
  }
}

struct BadCase {
  const char* name;
  std::function<void(json&)> spoil;
  const char* field;  // the words the message must hold
};

// Each case spoils a good machine file; its refusal names the file and holds the case's words.
void expect_refused(const std::vector<BadCase>& cases) {
  for (const auto& c : cases) {
    json j = meshtrain::plan::to_json(sample());
    c.spoil(j);
    const std::string m = refusal(j);
    EXPECT_EQ(m.rfind("m.json: ", 0), 0u) << c.name << ": " << m;
    EXPECT_NE(m.find(c.field), std::string::npos) << c.name << ": " << m;
  }
}

TEST(MachineFile, RefusesBadFilesNamingTheField) {
  const std::vector<BadCase> cases = {
      {"missing", [](json& j) { j.erase("cores"); }, "cores is missing"},
      {"unknown top", [](json& j) { j["colour"] = 1; }, "colour is not a field"},
      {"unknown nested", [](json& j) { j["gemm"][0]["speed"] = 1; }, "gemm[0].speed is not a field"},
      {"wrong type", [](json& j) { j["cores"] = "two"; }, "cores is string, not an integer"},
      {"fractional int", [](json& j) { j["gemm"][0]["m"] = 1.5; }, "gemm[0].m is 1.5, not an integer"},
      {"negative rate", [](json& j) { j["gemm"][1]["gflops"] = -1; }, "gemm[1].gflops is -1"},
      {"zero rate", [](json& j) { j["elementwise"][0]["bytes_per_s"] = 0; }, "elementwise[0].bytes_per_s is 0"},
      {"string rate", [](json& j) { j["attention"][0]["gflops"] = "fast"; }, "attention[0].gflops is string"},
      {"zero alpha", [](json& j) { j["links"][0]["alpha_s"] = 0.0; }, "links[0].alpha_s is 0"},
      {"missing beta", [](json& j) { j["links"][0].erase("beta_s_per_byte"); }, "links[0].beta_s_per_byte is missing"},
      {"one point", [](json& j) { j["links"][0]["points"].erase(1); }, "links[0].points has 1 entries"},
      {"points order", [](json& j) { j["links"][0]["points"][1]["bytes"] = 4; }, "links[0].points[1].bytes is not larger"},
      {"bad link", [](json& j) { j["links"][0]["link"] = "carrier pigeon"; }, "links[0].link is 'carrier pigeon'"},
      {"bad precision", [](json& j) { j["gemm"][0]["precision"] = "fp8"; }, "gemm[0].precision is 'fp8'"},
      {"version", [](json& j) { j["version"] = 1; }, "version is 1 but this meshtrain reads versions 2 to 4"},
      {"version 5", [](json& j) { j["version"] = 5; }, "version is 5"},
      {"bad conv format", [](json& j) { j["conv"][0]["format"] = "nhwc"; }, "conv[0].format is 'nhwc'"},
      {"zero conv rate", [](json& j) { j["conv"][0]["fwd_gflops"] = 0; }, "conv[0].fwd_gflops is 0"},
      {"bad layer op", [](json& j) { j["cnn_layers"][0]["op"] = "softmax"; }, "cnn_layers[0].op is 'softmax'"},
      {"no conv", [](json& j) { j.erase("conv"); }, "conv is missing"},
      {"no memory", [](json& j) { j.erase("memory_bytes"); }, "memory_bytes is missing"},
      {"negative memory", [](json& j) { j["memory_bytes"] = -1; }, "memory_bytes is -1, less than 0"},
      {"kind", [](json& j) { j["kind"] = "something"; }, "kind is not 'meshtrain machine'"},
      {"bf16 without isa", [](json& j) { j["bf16_isa"] = "emulated"; }, "gemm holds bf16 rates"},
      {"no gemm", [](json& j) { j["gemm"] = json::array(); }, "gemm is empty"},
      {"not object", [](json& j) { j = json::array(); }, "the file is not a JSON object"},
      {"item not object", [](json& j) { j["gemm"][0] = 3; }, "gemm[0] is not a JSON object"},
  };
  expect_refused(cases);
  EXPECT_EQ(refusal(meshtrain::plan::to_json(sample())), "");
}

// Counts stored as int are range-checked before narrowing: 2^32 + 1 cores never wraps to 1.
TEST(MachineFile, RefusesCountsBeyondTheirRangeNeverWrapping) {
  const std::vector<BadCase> cases = {
      {"cores 2^32+1", [](json& j) { j["cores"] = 4294967297ULL; }, "cores is 4294967297, more than 1048576"},
      {"cores 1e12", [](json& j) { j["cores"] = 1e12; }, "cores is 1000000000000.0, not an integer from 1 to 1048576"},
      {"cores uint64", [](json& j) { j["cores"] = 18446744073709551615ULL; }, "cores is 18446744073709551615, more than"},
      {"cores negative", [](json& j) { j["cores"] = -4294967295LL; }, "cores is -4294967295, less than 1"},
      {"version 2^32+2", [](json& j) { j["version"] = 4294967298ULL; }, "version is 4294967298, more than 2147483647"},
      {"gemm threads", [](json& j) { j["gemm"][0]["threads"] = 4294967297ULL; }, "gemm[0].threads is 4294967297, more than"},
      {"elementwise threads", [](json& j) { j["elementwise"][0]["threads"] = 1e10; }, "elementwise[0].threads is 10000000000.0"},
      {"attention threads", [](json& j) { j["attention"][0]["threads"] = 2147483648LL; }, "attention[0].threads is 2147483648"},
      {"world", [](json& j) { j["links"][0]["world"] = 4294967298ULL; }, "links[0].world is 4294967298, more than"},
      {"llc beyond int64", [](json& j) { j["llc_bytes"] = 9223372036854775808ULL; }, "llc_bytes is 9223372036854775808, more than 9223372036854775807"},
  };
  expect_refused(cases);
  json j = meshtrain::plan::to_json(sample());
  j["cores"] = meshtrain::plan::kMaxMachineCount;
  EXPECT_EQ(refusal(j), "") << "the largest count reads";
}

// The file as a whole goes through the strict reading (io/json.h): a key given twice or a
// number beyond a double is refused naming the file and the field.
TEST(MachineFile, RefusesADuplicateKeyAndAnOverflowingNumber) {
  meshtrain::testing::TempDir dir("machine");
  const std::string text = meshtrain::plan::to_json(sample()).dump(2);
  auto message = [&](const std::string& name, const std::string& body) -> std::string {
    std::ofstream(dir.file(name)) << body;
    try {
      meshtrain::plan::read_machine_file(dir.file(name));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  std::string dup = text;
  dup.insert(dup.find("\"cores\""), "\"cores\": 2,\n  ");
  EXPECT_NE(message("dup.json", dup).find("dup.json gives the field \"cores\" more than once in the top-level object"),
            std::string::npos)
      << message("dup.json", dup);
  std::string big = text;
  const size_t at = big.find("\"gflops\": ") + 10;
  big.replace(at, big.find_first_of(",\n}", at) - at, "1e999");
  EXPECT_NE(message("big.json", big).find("big.json gives attention[0].gflops as 1e999"), std::string::npos)
      << message("big.json", big);
}

// ---- calibrate --quick on this machine ----
struct Quick {
  MachineProfile p;
  std::vector<std::pair<int, int>> progress;
};
const Quick& quick() {
  static const Quick q = [] {
    Quick r;
    r.p = meshtrain::plan::calibrate({.quick = true, .mpi = false},
                                     [&](int done, int total, const std::string&) { r.progress.push_back({done, total}); });
    return r;
  }();
  return q;
}

bool positive(double x) { return std::isfinite(x) && x > 0; }

TEST(Calibrate, QuickGivesPositiveFiniteRatesForEveryThreadCount) {
  const MachineProfile& p = quick().p;
  const int cores = meshtrain::plan::usable_cores();
  EXPECT_EQ(p.cores, cores);
  EXPECT_GT(p.memory_bytes, 0) << "MemTotal (or the cgroup limit) is recorded";
  // The last-level cache: from sysfs, or measured where a VM shows none (without it the cost
  // model takes every stage as fitting in the cache, and predicted gpt-tiny 25% low on such a
  // VM). A cache of at least 1 MiB and at most what the probe reads, 256 MiB.
  EXPECT_GE(p.llc_bytes, int64_t{1} << 20);
  EXPECT_LE(p.llc_bytes, int64_t{256} << 20);
  EXPECT_EQ(p.mode, "quick");
  EXPECT_FALSE(p.cpu_model.empty());
  std::set<int> want{1, cores};
  std::set<int> gemm_threads, add_threads, att_threads;
  for (const auto& g : p.gemm) {
    EXPECT_TRUE(positive(g.gflops)) << g.shape << " " << g.threads;
    if (g.precision == "float32") gemm_threads.insert(g.threads);
  }
  for (const auto& e : p.elementwise) {
    EXPECT_TRUE(positive(e.bytes_per_s)) << e.threads;
    add_threads.insert(e.threads);
  }
  for (const auto& a : p.attention) {
    EXPECT_TRUE(positive(a.gflops)) << a.threads;
    att_threads.insert(a.threads);
  }
  EXPECT_EQ(gemm_threads, want);
  EXPECT_EQ(add_threads, want);
  EXPECT_EQ(att_threads, want);
  // 4 shapes x thread counts x (float32 in the caches and from memory, bf16 in the caches).
  const bool bf16 = meshtrain::kernels::bf16_isa() != "emulated";
  EXPECT_EQ(p.gemm.size(), 4 * want.size() * (bf16 ? 3 : 2));
  size_t cold = 0;
  for (const auto& g : p.gemm) cold += g.cold;
  EXPECT_EQ(cold, 4 * want.size());
  EXPECT_GT(p.shared_core_efficiency, 0);
  EXPECT_LE(p.shared_core_efficiency, 1);
  EXPECT_TRUE(positive(p.oversubscribed_handoff_s));
  EXPECT_TRUE(positive(p.calibrate_seconds));
  EXPECT_TRUE(positive(p.call_overhead_s));
  // It round-trips through the strict reader.
  EXPECT_EQ(meshtrain::plan::to_json(meshtrain::plan::from_json(meshtrain::plan::to_json(p), "q")),
            meshtrain::plan::to_json(p));
}

// Version 4's convolutional layers: every quick shape class in NCHW at each thread count (and in
// the blocked format where oneDNN has one and a channel count divides by it), each call's rate
// positive; every CNN layer.
TEST(Calibrate, MeasuresTheConvolutionalLayersAsTheyRun) {
  const MachineProfile& p = quick().p;
  const int cores = meshtrain::plan::usable_cores();
  const size_t counts = cores > 1 ? 2 : 1;
  size_t nchw = 0;
  for (const auto& c : p.conv) {
    EXPECT_TRUE(positive(c.fwd_gflops) && positive(c.bwd_data_gflops) && positive(c.bwd_weights_gflops))
        << c.format << " " << c.ic << "->" << c.oc << " k" << c.k;
    nchw += c.format == "nchw";
  }
  EXPECT_EQ(nchw, 3 * counts);
  std::set<std::string> ops;
  for (const auto& l : p.cnn_layers) {
    EXPECT_TRUE(positive(l.fwd_s) && positive(l.bwd_s)) << l.op;
    ops.insert(l.op);
  }
  EXPECT_EQ(ops, (std::set<std::string>{"batchnorm", "batchnorm_relu", "relu", "add", "add_relu", "maxpool", "avgpool",
                                         "global_pool", "concat", "flatten", "reorder"}));
}

TEST(Calibrate, Bf16RatesExistExactlyWhenTheCpuHasBf16Products) {
  const MachineProfile& p = quick().p;
  const bool bf16 = meshtrain::kernels::bf16_isa() != "emulated";
  int rates = 0, notes = 0;
  for (const auto& g : p.gemm) rates += g.precision == "bf16";
  for (const auto& n : p.not_measured)
    if (n.what == "bf16 GEMM") {
      ++notes;
      EXPECT_NE(n.reason.find("not measured: no bf16 products on this CPU"), std::string::npos);
    }
  EXPECT_EQ(rates > 0, bf16);
  EXPECT_EQ(notes, bf16 ? 0 : 1);
  EXPECT_EQ(p.bf16_isa, meshtrain::kernels::bf16_isa());
}

TEST(Calibrate, KeepsTheMedianRepetitionNotTheFastest) {
  // Repetitions as a shared VM gives them: one lucky fast one, one stalled one. The cost model
  // predicts a run's median step, so calibrate keeps the median call.
  EXPECT_DOUBLE_EQ(meshtrain::plan::detail::median_seconds({3.0, 0.5, 2.9, 40.0, 3.1}), 3.0);
  EXPECT_DOUBLE_EQ(meshtrain::plan::detail::median_seconds({2.0}), 2.0);
  EXPECT_DOUBLE_EQ(meshtrain::plan::detail::median_seconds({}), 0.0);
}

TEST(Calibrate, ACnnRowKeepsTheMedianOfItsRounds) {
  // Three rounds of one convolution class: one ran in a slow moment, one in a fast one. Each
  // figure of the row is the middle round's, the row's key the class's.
  using meshtrain::plan::ConvRate;
  using meshtrain::plan::LayerRate;
  auto conv = [](double f, double d, double w) {
    ConvRate r;
    r.format = "nchw", r.n = 8, r.ic = 32, r.oc = 64, r.k = 3, r.h = 14, r.threads = 2;
    r.fwd_gflops = f, r.bwd_data_gflops = d, r.bwd_weights_gflops = w;
    return r;
  };
  const ConvRate c = meshtrain::plan::detail::median_conv({conv(50, 40, 30), conv(20, 90, 31), conv(48, 41, 80)});
  EXPECT_DOUBLE_EQ(c.fwd_gflops, 48);
  EXPECT_DOUBLE_EQ(c.bwd_data_gflops, 41);
  EXPECT_DOUBLE_EQ(c.bwd_weights_gflops, 31);
  EXPECT_EQ(c.format, "nchw");
  EXPECT_EQ(c.ic, 32);
  EXPECT_EQ(c.oc, 64);
  EXPECT_EQ(c.threads, 2);
  auto layer = [](double f, double b) {
    LayerRate r;
    r.op = "maxpool", r.format = "nchw", r.elements = 1 << 18, r.threads = 1, r.fwd_s = f, r.bwd_s = b;
    return r;
  };
  const LayerRate l = meshtrain::plan::detail::median_layer({layer(2e-4, 9e-4), layer(7e-4, 3e-4), layer(2.5e-4, 3.2e-4)});
  EXPECT_DOUBLE_EQ(l.fwd_s, 2.5e-4);
  EXPECT_DOUBLE_EQ(l.bwd_s, 3.2e-4);
  EXPECT_EQ(l.op, "maxpool");
}

TEST(Calibrate, CnnRoundsGiveOneRowPerClass) {
  // The quick classes measured in one round and in two: the same rows, one each, in the same
  // order; the second list's tasks are one per row and round, and one that keeps the medians.
  namespace d = meshtrain::plan::detail;
  MachineProfile one, two;
  d::RoundTasks r1, r2;
  d::add_cnn_tasks(one, {1}, true, r1, 1);
  d::add_cnn_tasks(two, {1}, true, r2, 2);
  const auto t1 = r1.in_order(), t2 = r2.in_order();
  ASSERT_GT(t1.size(), 1u);
  EXPECT_EQ(t2.size(), 2 * (t1.size() - 1) + 1);
  for (auto& t : t2) EXPECT_FALSE(t().empty());
  for (auto& t : t1) (void)t();
  ASSERT_EQ(two.conv.size(), one.conv.size());
  ASSERT_EQ(two.cnn_layers.size(), one.cnn_layers.size());
  EXPECT_EQ(two.conv.size() + two.cnn_layers.size(), t1.size() - 1);
  for (size_t i = 0; i < two.conv.size(); ++i) {
    EXPECT_EQ(two.conv[i].ic, one.conv[i].ic);
    EXPECT_EQ(two.conv[i].format, one.conv[i].format);
    EXPECT_GT(two.conv[i].fwd_gflops, 0);
  }
  for (size_t i = 0; i < two.cnn_layers.size(); ++i) {
    EXPECT_EQ(two.cnn_layers[i].op, one.cnn_layers[i].op);
    EXPECT_GT(two.cnn_layers[i].bwd_s, 0);
  }
}

TEST(Calibrate, RoundsRunOverTheWholeListAndKeepEachRowsFigures) {
  // Three rows of two rounds: the tasks measure every row once, then every row again; `keep`
  // gets each row's two figures, in the rows' order; every line names its round.
  namespace d = meshtrain::plan::detail;
  std::vector<int> order;
  std::vector<std::function<double()>> rows;
  for (int i = 0; i < 3; ++i)
    rows.push_back([&order, i] {
      order.push_back(i);
      return 10.0 * i + static_cast<double>(order.size());
    });
  std::vector<std::vector<double>> kept;
  d::RoundTasks rounded;
  d::add_round_tasks<double>(
      rows, [](const double& x) { return "figure " + std::to_string(static_cast<int>(x)); },
      [&kept](const std::vector<std::vector<double>>& m) {
        kept = m;
        return std::string("kept");
      },
      rounded, 2);
  auto tasks = rounded.in_order();
  ASSERT_EQ(tasks.size(), 7u);
  std::vector<std::string> lines;
  for (auto& t : tasks) lines.push_back(t());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0], (std::vector<double>{1, 4}));
  EXPECT_EQ(kept[1], (std::vector<double>{12, 15}));
  EXPECT_EQ(kept[2], (std::vector<double>{23, 26}));
  EXPECT_EQ(lines[0], "figure 1 (round 1 of 2)");
  EXPECT_EQ(lines[5], "figure 26 (round 2 of 2)");
  EXPECT_EQ(lines[6], "kept");
  // One round: no round in the lines.
  d::RoundTasks once;
  d::add_round_tasks<double>(rows, [](const double&) { return std::string("one"); },
                             [](const std::vector<std::vector<double>>&) { return std::string("kept"); }, once, 1);
  tasks = once.in_order();
  ASSERT_EQ(tasks.size(), 4u);
  EXPECT_EQ(tasks[0](), "one");
}

TEST(Calibrate, TwoSectionsRunTheirRoundsInTurn) {
  // Two rows of section a in three rounds and one row of section b in three: round 1 of both,
  // then round 2 of both, then round 3, then a's keep and b's. Each keep gets its own rows' three
  // figures, so a row's rounds lie a whole round of both sections apart.
  namespace d = meshtrain::plan::detail;
  std::vector<std::string> order;
  auto section = [&order](const std::string& name, int n) {
    std::vector<std::function<int()>> rows;
    for (int i = 0; i < n; ++i)
      rows.push_back([&order, name, i] {
        order.push_back(name + std::to_string(i));
        return static_cast<int>(order.size());
      });
    return rows;
  };
  std::vector<std::vector<int>> kept_a, kept_b;
  d::RoundTasks rounded;
  const auto line = [](const int& x) { return std::to_string(x); };
  d::add_round_tasks<int>(section("a", 2), line,
                          [&kept_a](const std::vector<std::vector<int>>& m) {
                            kept_a = m;
                            return std::string("kept a");
                          },
                          rounded, 3);
  d::add_round_tasks<int>(section("b", 1), line,
                          [&kept_b](const std::vector<std::vector<int>>& m) {
                            kept_b = m;
                            return std::string("kept b");
                          },
                          rounded, 3);
  const auto tasks = rounded.in_order();
  ASSERT_EQ(tasks.size(), 11u);
  std::vector<std::string> lines;
  for (const auto& t : tasks) lines.push_back(t());
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "a1", "b0", "a0", "a1", "b0", "a0", "a1", "b0"}));
  EXPECT_EQ(lines[9], "kept a");
  EXPECT_EQ(lines[10], "kept b");
  EXPECT_EQ(kept_a, (std::vector<std::vector<int>>{{1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(kept_b, (std::vector<std::vector<int>>{{3, 6, 9}}));
  EXPECT_EQ(lines[2], "3 (round 1 of 3)");
}

TEST(Calibrate, AKernelRowKeepsTheMedianOfItsRounds) {
  // A GEMM row whose second round ran while a shared VM held one of its cores.
  using meshtrain::plan::GemmRate;
  auto g = [](double gflops) {
    GemmRate r;
    r.shape = "small_128", r.m = r.n = r.k = 128, r.precision = "float32", r.threads = 2, r.gflops = gflops;
    return r;
  };
  const GemmRate r = meshtrain::plan::detail::median_of_rounds<GemmRate>({g(120), g(9), g(131)}, {&GemmRate::gflops});
  EXPECT_DOUBLE_EQ(r.gflops, 120);
  EXPECT_EQ(r.shape, "small_128");
  EXPECT_EQ(r.threads, 2);
}

TEST(Calibrate, GemmRateAgreesWithTheTrainersMeasurement) {
  // The same product (1024^3, one thread, float32) measured two ways.
  const double mine = quick().p.gemm_gflops("square_1024", "float32", 1);
  const double trainer = meshtrain::train::measured_gemm_gflops(1);
  ASSERT_GT(mine, 0);
  EXPECT_LT(mine, 3 * trainer);
  EXPECT_GT(mine, trainer / 3);
}

TEST(Calibrate, LinkFitsArePositiveAndReproduceTheirPoints) {
  const MachineProfile& p = quick().p;
  for (const char* op : {"all_reduce", "sendrecv"}) {
    const auto* f = p.link("threads", op);
    ASSERT_NE(f, nullptr) << op;
    EXPECT_EQ(f->world, 2);
    EXPECT_TRUE(positive(f->alpha_s)) << op;
    EXPECT_TRUE(positive(f->beta_s_per_byte)) << op;
    ASSERT_EQ(f->points.size(), 3u);
    const auto& large = f->points.back();
    EXPECT_NEAR(f->predict_s(static_cast<double>(large.bytes)), large.seconds, 0.5 * large.seconds) << op;
    double err = 0;
    for (const auto& pt : f->points) {
      EXPECT_TRUE(positive(pt.seconds));
      err = std::max(err, std::abs(f->predict_s(static_cast<double>(pt.bytes)) - pt.seconds) / pt.seconds);
    }
    EXPECT_NEAR(f->max_fit_error, err, 1e-9) << op;
  }
  // Outside mpirun the MPI links are named as not measured, with how to measure them.
  int mpi_notes = 0;
  for (const auto& n : p.not_measured)
    if (n.what.rfind("mpi_", 0) == 0) ++mpi_notes;
  EXPECT_EQ(mpi_notes, 2);
}

TEST(Calibrate, ReportsProgressOncePerMeasurement) {
  const auto& pr = quick().progress;
  ASSERT_FALSE(pr.empty());
  for (std::size_t i = 0; i < pr.size(); ++i) {
    EXPECT_EQ(pr[i].first, static_cast<int>(i + 1));
    EXPECT_EQ(pr[i].second, static_cast<int>(pr.size()));
  }
  // gemm + element-wise kernels + attention + convolutions + CNN layers per thread count (one
  // round in quick mode), plus the two lines that keep the kernels' and the CNN rows' medians,
  // ranks sharing cores, the call overhead and the threads link.
  const MachineProfile& p = quick().p;
  EXPECT_EQ(pr.size(),
            p.gemm.size() + p.elementwise.size() + p.attention.size() + p.conv.size() + p.cnn_layers.size() + 5);
}

TEST(Calibrate, RefusesMoreThreadsThanCores) {
  const int cores = meshtrain::plan::usable_cores();
  EXPECT_THROW(meshtrain::plan::calibrate({.quick = true, .threads = cores + 1, .mpi = false}), std::invalid_argument);
  EXPECT_THROW(meshtrain::plan::calibrate({.quick = true, .threads = -1, .mpi = false}), std::invalid_argument);
}

}  // namespace
