// The cluster file (plan/cluster.h): a device cluster's figures become the cost model's
// Hardware in SI units, a machine cluster takes the machine file's measurements relative to
// its own path, the shipped examples read, and every bad field is refused naming the file and
// the field. A machine file alone is the cluster of one node of it: the same hardware and the
// same plan as the cluster file of one node that points at it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include "meshtrain/model/spec.h"
#include "meshtrain/plan/cluster.h"
#include "meshtrain/plan/search.h"
#include "temp_dir.h"

namespace {
using meshtrain::plan::Cluster;
using nlohmann::json;

json device_cluster() {
  return json::parse(R"({
    "kind": "meshtrain cluster", "version": 1, "name": "two-nodes", "note": "for a test",
    "nodes": 2, "devices_per_node": 4,
    "device": {"peak_tflops": 100, "gemm_tflops": 80, "attention_tflops": 40, "memory_gb": 16,
               "memory_bandwidth_gbps": 1000, "kernel_overhead_us": 5},
    "links": {"intra_node": {"bandwidth_gbps": 200, "latency_us": 2},
              "inter_node": {"bandwidth_gbps": 10, "latency_us": 8}}})");
}

meshtrain::plan::MachineProfile machine(int cores) {
  meshtrain::plan::MachineProfile p;
  p.mode = "quick", p.date = "2025-01-31T12:00:00Z", p.meshtrain_commit = "abc", p.host = "h";
  p.cpu_model = "Test CPU", p.cores = cores, p.gemm_backend = "dnnl", p.bf16_isa = "emulated";
  p.calibrate_seconds = 1, p.call_overhead_s = 1e-6, p.oversubscribed_handoff_s = 1e-4;
  p.gemm = {{"square_1024", 1024, 1024, 1024, "float32", cores, 50.0 * cores}};
  p.elementwise = {{"add", 1 << 20, 1, 2e10}};
  return p;
}

// A machine file as calibrate fills one in (plan/calibrate.cpp): a GEMM rate at each thread
// count, the kernels' bandwidths, attention, the threads link of both operations, the memory;
// written by write_machine_file, as `meshtrain calibrate --out` writes it.
meshtrain::plan::MachineProfile calibrated(int cores) {
  meshtrain::plan::MachineProfile p = machine(cores);
  p.memory_bytes = int64_t{3} << 30;
  p.llc_bytes = 32 << 20, p.shared_core_efficiency = 0.9;
  p.gemm.clear();
  for (int t = 1; t <= cores; t *= 2) p.gemm.push_back({"square_1024", 1024, 1024, 1024, "float32", t, 100.0 * t});
  p.elementwise = {{"add", 1 << 20, 1, 2e10}, {"layernorm", 1 << 20, 1, 3e10}, {"gelu", 1 << 20, 1, 3e10},
                   {"adamw", 1 << 20, 1, 5e10}};
  p.attention = {{2, 256, 384, 6, 1, 50}};
  p.links = {{"threads", "all_reduce", 2, 5e-6, 1e-10, 0.1, {{8, 5e-6}, {1 << 20, 1.1e-4}}},
             {"threads", "sendrecv", 2, 1e-6, 1e-10, 0.1, {{8, 1e-6}, {1 << 20, 1.1e-4}}}};
  return p;
}

// What plan reports of a search: each ranked layout with its step time and memory.
std::vector<std::string> ranking(const Cluster& c) {
  const auto spec = meshtrain::model::model_spec("gpt-tiny");
  meshtrain::plan::SearchOptions o;
  o.batch = 8, o.seq = spec->gpt()->seq;
  std::vector<std::string> r;
  for (const auto& p : meshtrain::plan::search_layouts(*spec, c, o).ranked)
    r.push_back(p.layout.describe() + " " + std::to_string(p.step_s) + " s " + std::to_string(p.peak_bytes) + " B");
  return r;
}

std::string refusal(const json& j, const std::string& base = "") {
  try {
    meshtrain::plan::cluster_from_json(j, "c.json", base);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ClusterFile, DeviceFiguresBecomeHardwareInSiUnits) {
  const json j = device_cluster();
  const Cluster c = meshtrain::plan::cluster_from_json(j, "c.json", "");
  const auto& hw = c.hardware;
  EXPECT_EQ(c.name, "two-nodes");
  EXPECT_EQ(c.note, "for a test");
  EXPECT_EQ(c.machine_path, "");
  EXPECT_FALSE(c.cpu());
  EXPECT_EQ(hw.nodes, 2);
  EXPECT_EQ(hw.devices_per_node, 4);
  EXPECT_EQ(hw.devices(), 8);
  EXPECT_FALSE(hw.has_machine);
  const json& d = j["device"];
  EXPECT_DOUBLE_EQ(hw.peak_flops, d["peak_tflops"].get<double>() * 1e12);
  EXPECT_DOUBLE_EQ(hw.gemm_flops, d["gemm_tflops"].get<double>() * 1e12);
  EXPECT_DOUBLE_EQ(hw.attention_flops, d["attention_tflops"].get<double>() * 1e12);
  EXPECT_DOUBLE_EQ(hw.memory_bytes, d["memory_gb"].get<double>() * 1e9);
  EXPECT_DOUBLE_EQ(hw.bytes_per_s, d["memory_bandwidth_gbps"].get<double>() * 1e9);
  EXPECT_DOUBLE_EQ(hw.call_overhead_s, d["kernel_overhead_us"].get<double>() * 1e-6);
  // A link moves bandwidth_gbps x 1e9 bytes a second after latency_us.
  EXPECT_NEAR(hw.intra.alpha_s + hw.intra.beta_s_per_byte * 200e9, 2e-6 + 1.0, 1e-12);
  EXPECT_NEAR(hw.inter.alpha_s + hw.inter.beta_s_per_byte * 10e9, 8e-6 + 1.0, 1e-12);
  // One node needs no inter_node link (and may have one).
  json one = j;
  one["nodes"] = 1;
  one["links"].erase("inter_node");
  EXPECT_EQ(meshtrain::plan::cluster_from_json(one, "c.json", "").hardware.devices(), 4);
  json note_less = j;
  note_less.erase("note");
  EXPECT_EQ(meshtrain::plan::cluster_from_json(note_less, "c.json", "").note, "");
}

TEST(ClusterFile, MachineClusterReadsTheMachineFileBesideIt) {
  meshtrain::testing::TempDir dir("cluster");
  std::filesystem::create_directories(dir.path() / "sub");
  meshtrain::plan::write_machine_file(machine(3), dir.file("sub/m.machine.json"));
  json j = {{"kind", "meshtrain cluster"}, {"version", 1}, {"name", "cpu"}, {"nodes", 1},
            {"machine", "m.machine.json"}, {"memory_gb", 2}};
  std::ofstream(dir.file("sub/c.json")) << j.dump();
  const Cluster c = meshtrain::plan::read_cluster_file(dir.file("sub/c.json"));
  EXPECT_TRUE(c.cpu());
  EXPECT_TRUE(c.hardware.has_machine);
  EXPECT_EQ(c.hardware.cores, 3);
  EXPECT_EQ(c.hardware.devices_per_node, meshtrain::plan::kCpuRanksPerCore * 3);
  EXPECT_DOUBLE_EQ(c.hardware.memory_bytes, 2e9);
  EXPECT_EQ(std::filesystem::path(c.machine_path), std::filesystem::path(dir.file("sub/m.machine.json")));
  EXPECT_EQ(c.hardware.machine.cpu_model, "Test CPU");

  // Two nodes: twice the cores, an inter_node link required, devices_per_node as given.
  j["nodes"] = 2;
  EXPECT_NE(refusal(j, dir.file("sub")).find("links is missing"), std::string::npos) << refusal(j, dir.file("sub"));
  j["links"] = {{"inter_node", {{"bandwidth_gbps", 12.5}, {"latency_us", 20}}}};
  j["devices_per_node"] = 5;
  const Cluster two = meshtrain::plan::cluster_from_json(j, "c.json", dir.file("sub"));
  EXPECT_EQ(two.hardware.cores, 6);
  EXPECT_EQ(two.hardware.devices(), 10);
  EXPECT_DOUBLE_EQ(two.hardware.inter.alpha_s, 20e-6);

  // The machine file is looked for beside the cluster file, not in the working directory.
  EXPECT_NE(refusal(j, dir.file("elsewhere")).find("machine names"), std::string::npos);
  // An intra_node link is the machine file's to give.
  j["links"]["intra_node"] = {{"bandwidth_gbps", 1}, {"latency_us", 1}};
  EXPECT_NE(refusal(j, dir.file("sub")).find("links.intra_node is given"), std::string::npos);
}

TEST(ClusterFile, AMachineFileIsTheClusterOfOneNodeOfIt) {
  meshtrain::testing::TempDir dir("cluster");
  const std::string m = dir.file("m.json");
  meshtrain::plan::write_machine_file(calibrated(2), m);
  // The cluster file a user would write for it: one node, the machine file, nothing else.
  json by_hand = {{"kind", "meshtrain cluster"}, {"version", 1}, {"name", "by-hand"}, {"nodes", 1}, {"machine", "m.json"}};
  std::ofstream(dir.file("c.json")) << by_hand.dump();
  // ... and with the node's memory written out as calibrate recorded it.
  by_hand["memory_gb"] = static_cast<double>(int64_t{3} << 30) / 1e9;
  std::ofstream(dir.file("c_memory.json")) << by_hand.dump();

  const Cluster hand = meshtrain::plan::read_cluster_file(dir.file("c.json"));
  for (const Cluster& c : {meshtrain::plan::read_cluster_or_machine_file(m), meshtrain::plan::read_machine_as_cluster(m),
                           meshtrain::plan::read_cluster_or_machine_file(dir.file("c.json")),
                           meshtrain::plan::read_cluster_file(dir.file("c_memory.json"))}) {
    EXPECT_TRUE(c.cpu());
    EXPECT_EQ(c.hardware.nodes, 1);
    EXPECT_EQ(c.hardware.cores, 2) << "all the cores calibrate recorded";
    EXPECT_EQ(c.hardware.devices_per_node, meshtrain::plan::kCpuRanksPerCore * 2);
    EXPECT_NEAR(c.hardware.memory_bytes, static_cast<double>(int64_t{3} << 30), 1e-3);
    EXPECT_TRUE(c.hardware.has_machine);
    EXPECT_EQ(meshtrain::plan::to_json(c.hardware.machine), meshtrain::plan::to_json(calibrated(2)));
    EXPECT_EQ(std::filesystem::path(c.machine_path), std::filesystem::path(m));
    EXPECT_DOUBLE_EQ(c.hardware.peak_flops, hand.hardware.peak_flops);
    EXPECT_EQ(c.hardware.inter.alpha_s, hand.hardware.inter.alpha_s);
    EXPECT_EQ(c.hardware.inter.beta_s_per_byte, hand.hardware.inter.beta_s_per_byte);
  }
  const Cluster alone = meshtrain::plan::read_cluster_or_machine_file(m);
  EXPECT_EQ(alone.name, "h") << "named after the host calibrate ran on";
  // The same plan: every layout ranked alike, with the same step time and memory.
  const std::vector<std::string> planned = ranking(alone);
  ASSERT_FALSE(planned.empty());
  EXPECT_EQ(planned, ranking(hand));
  EXPECT_EQ(planned, ranking(meshtrain::plan::read_cluster_file(dir.file("c_memory.json"))));
}

TEST(ClusterFile, APlanFileOfNeitherKindIsRefusedNamingBoth) {
  meshtrain::testing::TempDir dir("cluster");
  auto message = [](const std::function<Cluster()>& read) -> std::string {
    try {
      read();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  using meshtrain::plan::read_cluster_or_machine_file;
  using meshtrain::plan::read_machine_as_cluster;
  std::ofstream(dir.file("other.json")) << R"({"kind": "meshtrain trace", "version": 1})";
  std::ofstream(dir.file("kindless.json")) << R"({"name": "x"})";
  std::ofstream(dir.file("list.json")) << "[1, 2]";
  for (const char* f : {"other.json", "kindless.json", "list.json"}) {
    const std::string m = message([&] { return read_cluster_or_machine_file(dir.file(f)); });
    EXPECT_EQ(m.rfind(dir.file(f) + " ", 0), 0u) << m;
    EXPECT_NE(m.find("plan reads a cluster file (kind \"meshtrain cluster\") or a machine file (kind \"meshtrain machine\""),
              std::string::npos) << m;
    const std::string mm = message([&] { return read_machine_as_cluster(dir.file(f)); });
    EXPECT_EQ(mm.rfind(dir.file(f) + " ", 0), 0u) << mm;
    EXPECT_NE(mm.find("--machine reads a machine file (kind \"meshtrain machine\""), std::string::npos) << mm;
  }
  EXPECT_NE(message([&] { return read_cluster_or_machine_file(dir.file("other.json")); }).find("has kind \"meshtrain trace\""),
            std::string::npos);
  // --machine given a cluster file says where it goes.
  const std::string c = (std::filesystem::path(MESHTRAIN_SOURCE_DIR) / "examples" / "clusters" / "h100-node.json").string();
  EXPECT_NE(message([&] { return read_machine_as_cluster(c); }).find("is a cluster file, not a machine file; give it with --cluster"),
            std::string::npos);
  // A machine file's own fields are checked as read_machine_file checks them.
  json bad = meshtrain::plan::to_json(calibrated(2));
  bad["cores"] = 0;
  std::ofstream(dir.file("bad.json")) << bad.dump();
  EXPECT_NE(message([&] { return read_cluster_or_machine_file(dir.file("bad.json")); }).find("bad.json: cores is 0, less than 1"),
            std::string::npos);
  // A version 2 machine file records no memory: planned alone it is refused saying how to
  // mend it; pointed at by a cluster file, memory_gb is then required.
  meshtrain::plan::MachineProfile v2 = calibrated(2);
  v2.version = 2, v2.memory_bytes = 0;
  meshtrain::plan::write_machine_file(v2, dir.file("v2.json"));
  const std::string old = message([&] { return read_machine_as_cluster(dir.file("v2.json")); });
  EXPECT_NE(old.find("v2.json records no memory (a version 2 machine file); measure the machine again with meshtrain calibrate"),
            std::string::npos) << old;
  EXPECT_EQ(message([&] { return read_cluster_or_machine_file(dir.file("v2.json")); }), old);
  json j = {{"kind", "meshtrain cluster"}, {"version", 1}, {"name", "cpu"}, {"nodes", 1}, {"machine", "v2.json"}};
  EXPECT_NE(refusal(j, dir.path().string()).find("c.json: memory_gb is missing; "), std::string::npos)
      << refusal(j, dir.path().string());
  j["memory_gb"] = 4;
  EXPECT_EQ(refusal(j, dir.path().string()), "");
}

TEST(ClusterFile, TheShippedExamplesRead) {
  const std::filesystem::path dir = std::filesystem::path(MESHTRAIN_SOURCE_DIR) / "examples" / "clusters";
  for (const char* name : {"h100-node.json", "a100-3072.json", "this-machine.json"}) {
    const std::string path = (dir / name).string();
    std::ifstream f(path);
    ASSERT_TRUE(f) << path;
    const json j = json::parse(f);
    Cluster c;
    ASSERT_NO_THROW(c = meshtrain::plan::read_cluster_file(path)) << path;
    EXPECT_EQ(c.name, j["name"].get<std::string>());
    EXPECT_EQ(c.hardware.nodes, j["nodes"].get<int>());
    EXPECT_FALSE(c.note.empty()) << name;
    if (j.contains("device")) {
      EXPECT_EQ(c.hardware.devices(), j["nodes"].get<int>() * j["devices_per_node"].get<int>());
      EXPECT_DOUBLE_EQ(c.hardware.memory_bytes, j["device"]["memory_gb"].get<double>() * 1e9);
    } else {
      EXPECT_TRUE(c.cpu());
      EXPECT_GT(c.hardware.machine.gemm.size(), 0u);
    }
  }
}

struct BadCase {
  const char* name;
  std::function<void(json&)> spoil;
  const char* words;  // the message must hold them
};

// Each case spoils a good cluster file; its refusal names the file and holds the case's words.
void expect_refused(const std::vector<BadCase>& cases) {
  for (const auto& c : cases) {
    json j = device_cluster();
    c.spoil(j);
    const std::string m = refusal(j);
    EXPECT_EQ(m.rfind("c.json: ", 0), 0u) << c.name << ": " << m;
    EXPECT_NE(m.find(c.words), std::string::npos) << c.name << ": " << m;
  }
}

TEST(ClusterFile, RefusesBadFilesNamingTheField) {
  const std::vector<BadCase> cases = {
      {"unknown top", [](json& j) { j["colour"] = "blue"; }, "colour is not a field of a cluster file"},
      {"unknown device", [](json& j) { j["device"]["fp8_tflops"] = 1; }, "device.fp8_tflops is not a field"},
      {"unknown link", [](json& j) { j["links"]["intra_node"]["mtu"] = 9000; }, "links.intra_node.mtu is not a field"},
      {"unknown link class", [](json& j) { j["links"]["rail"] = json::object(); }, "links.rail is not a field"},
      {"zero devices", [](json& j) { j["devices_per_node"] = 0; }, "devices_per_node is 0"},
      {"zero nodes", [](json& j) { j["nodes"] = 0; }, "nodes is 0"},
      {"fraction nodes", [](json& j) { j["nodes"] = 1.5; }, "nodes is 1.5, not an integer"},
      {"missing name", [](json& j) { j.erase("name"); }, "name is missing"},
      {"note not text", [](json& j) { j["note"] = 3; }, "note is number, not a string"},
      {"kind", [](json& j) { j["kind"] = "meshtrain machine"; }, "kind is not 'meshtrain cluster'"},
      {"version", [](json& j) { j["version"] = 2; }, "version is 2"},
      {"neither", [](json& j) { j.erase("device"); }, "device is missing"},
      {"both", [](json& j) { j["machine"] = "m.json"; }, "device is given beside machine"},
      {"inter missing", [](json& j) { j["links"].erase("inter_node"); }, "links.inter_node is missing"},
      {"intra missing", [](json& j) { j["links"].erase("intra_node"); }, "links.intra_node is missing"},
      {"links missing", [](json& j) { j.erase("links"); }, "links is missing"},
      {"gemm above peak", [](json& j) { j["device"]["gemm_tflops"] = 101; }, "device.gemm_tflops is above"},
      {"attention above peak", [](json& j) { j["device"]["attention_tflops"] = 200; }, "device.attention_tflops is above"},
      {"not object", [](json& j) { j["device"] = 3; }, "device is not a JSON object"},
      {"whole file", [](json& j) { j = json::array(); }, "the file is not a JSON object"},
  };
  expect_refused(cases);
  // Every rate: missing, zero, negative, not a number, each refused by its own name.
  for (const char* f : {"peak_tflops", "gemm_tflops", "attention_tflops", "memory_gb", "memory_bandwidth_gbps",
                        "kernel_overhead_us"}) {
    for (const json& bad : {json(0), json(-1), json("fast"), json(nullptr)}) {
      json j = device_cluster();
      j["device"][f] = bad;
      const std::string m = refusal(j);
      EXPECT_NE(m.find(std::string("device.") + f + " is "), std::string::npos) << f << " = " << bad << ": " << m;
    }
    json j = device_cluster();
    j["device"].erase(f);
    EXPECT_NE(refusal(j).find(std::string("device.") + f + " is missing"), std::string::npos) << f;
  }
  for (const char* link : {"intra_node", "inter_node"})
    for (const char* f : {"bandwidth_gbps", "latency_us"}) {
      json j = device_cluster();
      j["links"][link][f] = 0;
      const std::string m = refusal(j);
      EXPECT_NE(m.find(std::string("links.") + link + "." + f + " is 0"), std::string::npos) << m;
    }
  EXPECT_EQ(refusal(device_cluster()), "");
}

// Counts are range-checked before they become ints: 2^32 + 1 nodes never wraps to 1 node, and
// 1e12 (a JSON float) is refused rather than cast.
TEST(ClusterFile, RefusesCountsBeyondTheirRangeNeverWrapping) {
  const std::vector<BadCase> cases = {
      {"nodes 2^32+1", [](json& j) { j["nodes"] = 4294967297ULL; }, "nodes is 4294967297, more than 1048576"},
      {"nodes 1e12", [](json& j) { j["nodes"] = 1e12; }, "nodes is 1000000000000.0, not an integer from 1 to 1048576"},
      {"nodes uint64", [](json& j) { j["nodes"] = 18446744073709551615ULL; }, "nodes is 18446744073709551615, more than"},
      {"nodes -2^32", [](json& j) { j["nodes"] = -4294967296LL; }, "nodes is -4294967296, less than 1"},
      {"devices 2^31", [](json& j) { j["devices_per_node"] = 2147483648LL; }, "devices_per_node is 2147483648, more than"},
      {"version 2^32+1", [](json& j) { j["version"] = 4294967297ULL; }, "version is 4294967297, more than 2147483647"},
      {"devices in all", [](json& j) { j["nodes"] = 1 << 19; j["devices_per_node"] = 4; },
       "nodes is 524288, which with 4 devices per node makes more than 1048576 devices"},
  };
  expect_refused(cases);
  json j = device_cluster();
  j["nodes"] = 1 << 18;
  EXPECT_EQ(refusal(j), "") << "2^18 nodes of 4 devices read";
}

TEST(ClusterFile, ReadingAFileSaysWhatIsWrongWithIt) {
  meshtrain::testing::TempDir dir("cluster");
  auto message = [](const std::string& path) -> std::string {
    try {
      meshtrain::plan::read_cluster_file(path);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(dir.file("absent.json")).find("absent.json does not exist; give a cluster file"), std::string::npos);
  std::ofstream(dir.file("bad.json")) << "{ not json";
  EXPECT_NE(message(dir.file("bad.json")).find("bad.json is not valid JSON: syntax error at line 1"), std::string::npos);
  EXPECT_NE(message(dir.path().string()).find("is a directory"), std::string::npos);
  // The strict reading (io/json.h): a key given twice, at the top or nested, and a number
  // beyond a double, each named.
  std::ofstream(dir.file("dup.json")) << R"({"kind": "meshtrain cluster", "nodes": 1, "nodes": 4294967297})";
  EXPECT_NE(message(dir.file("dup.json")).find("dup.json gives the field \"nodes\" more than once in the top-level object"),
            std::string::npos)
      << message(dir.file("dup.json"));
  std::string nested = device_cluster().dump();
  nested.insert(nested.find("\"latency_us\""), "\"latency_us\": 1, ");
  std::ofstream(dir.file("nested.json")) << nested;
  EXPECT_NE(message(dir.file("nested.json")).find("more than once in links.inter_node"), std::string::npos)
      << message(dir.file("nested.json"));
  std::ofstream(dir.file("big.json")) << R"({"kind": "meshtrain cluster", "device": {"gemm_tflops": 1e999}})";
  EXPECT_NE(message(dir.file("big.json")).find("big.json gives device.gemm_tflops as 1e999, a number beyond the range of a double"),
            std::string::npos)
      << message(dir.file("big.json"));
  json j = {{"kind", "meshtrain cluster"}, {"version", 1}, {"name", "cpu"}, {"nodes", 1},
            {"machine", "missing.machine.json"}, {"memory_gb", 2}};
  std::ofstream(dir.file("c.json")) << j.dump();
  const std::string m = message(dir.file("c.json"));
  EXPECT_NE(m.find("c.json: machine names"), std::string::npos) << m;
  EXPECT_NE(m.find("missing.machine.json"), std::string::npos) << m;
}

}  // namespace
