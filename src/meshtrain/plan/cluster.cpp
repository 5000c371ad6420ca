// The cluster file's strict reading and its conversion to the cost model's Hardware
// (plan/cluster.h).
#include "meshtrain/plan/cluster.h"

#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "meshtrain/io/json.h"
#include "meshtrain/plan/json_reader.h"

namespace meshtrain::plan {

namespace {
using nlohmann::json;

struct Reader : JsonReader {
  Reader(const json& j, std::string source, std::string where)
      : JsonReader(j, std::move(source), std::move(where),
                   {"a cluster file (version " + std::to_string(kClusterFileVersion) + ")",
                    "fix the field (docs/planner.md lists the cluster file's fields)"}) {}
};

// {"bandwidth_gbps": GB/s per device and direction, "latency_us": one message's latency}
Link read_link(Reader& parent, const std::string& key) {
  Reader r(parent.take(key), parent.source(), parent.name(key));
  Link l;
  l.beta_s_per_byte = 1.0 / (r.rate("bandwidth_gbps") * 1e9);
  l.alpha_s = r.rate("latency_us") * 1e-6;
  r.done();
  return l;
}

// "links" of a device cluster: intra_node always, inter_node when there are several nodes
// (allowed with one). A machine cluster: inter_node only.
void read_links(Reader& top, Hardware& hw, bool machine) {
  const bool needed = !machine || hw.nodes > 1;
  if (!needed && !top.has("links")) return;
  Reader l(top.take("links"), top.source(), "links");
  if (machine) {
    if (l.has("intra_node"))
      l.fail("links.intra_node", "is given, but the machine file measured the link inside the node; drop it");
  } else {
    hw.intra = read_link(l, "intra_node");
  }
  if (hw.nodes > 1 || l.has("inter_node")) hw.inter = read_link(l, "inter_node");
  l.done();
}

void read_device(Reader& top, Hardware& hw) {
  Reader d(top.take("device"), top.source(), "device");
  hw.peak_flops = d.rate("peak_tflops") * 1e12;
  hw.gemm_flops = d.rate("gemm_tflops") * 1e12;
  hw.attention_flops = d.rate("attention_tflops") * 1e12;
  hw.memory_bytes = d.rate("memory_gb") * 1e9;
  hw.bytes_per_s = d.rate("memory_bandwidth_gbps") * 1e9;
  hw.call_overhead_s = d.rate("kernel_overhead_us") * 1e-6;
  d.done();
  if (hw.gemm_flops > hw.peak_flops) d.fail("device.gemm_tflops", "is above device.peak_tflops (a sustained rate cannot pass the peak)");
  if (hw.attention_flops > hw.peak_flops)
    d.fail("device.attention_tflops", "is above device.peak_tflops (a sustained rate cannot pass the peak)");
}

// One node of machine `m` (read from `path`), with `memory_bytes` of memory: the ranks are
// threads of one process, at most kCpuRanksPerCore a core unless devices_per_node says.
Hardware one_node_of(const MachineProfile& m, double memory_bytes) {
  Hardware hw = hardware_from_machine(m, memory_bytes);
  hw.devices_per_node = kCpuRanksPerCore * hw.cores;
  return hw;
}

// A version 2 machine file records no memory: the refusal of a cluster that needs it.
std::string no_memory(const std::string& machine_path) {
  return machine_path + " records no memory (a version 2 machine file); measure the machine again with meshtrain "
                        "calibrate, or give the node's memory in GB (1e9 bytes) as memory_gb";
}

Hardware read_machine(Reader& top, const std::string& base_dir, std::string* path_out) {
  const std::string given = top.str("machine");
  if (given.empty()) top.fail("machine", "is empty; give the path of a file meshtrain calibrate wrote");
  std::filesystem::path p(given);
  if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
  *path_out = p.lexically_normal().string();
  MachineProfile m;
  try {
    m = read_machine_file(*path_out);
  } catch (const std::invalid_argument& e) {
    top.fail("machine", "names " + *path_out + ", which cannot be used (" + e.what() + ")");
  }
  // The node's memory: memory_gb when given, else what calibrate recorded.
  if (!top.has("memory_gb") && m.memory_bytes == 0) top.fail("memory_gb", "is missing; " + no_memory(*path_out));
  return one_node_of(m, top.has("memory_gb") ? top.rate("memory_gb") * 1e9 : static_cast<double>(m.memory_bytes));
}

}  // namespace

Cluster cluster_from_json(const json& j, const std::string& source, const std::string& base_dir) {
  Reader r(j, source, "");
  if (r.str("kind") != kClusterFileKind) r.fail("kind", std::string("is not '") + kClusterFileKind + "'");
  const int64_t version = r.integer("version", 1, std::numeric_limits<int>::max());
  if (version != kClusterFileVersion)
    r.fail("version", "is " + std::to_string(version) + " but this meshtrain reads version " +
                          std::to_string(kClusterFileVersion));
  Cluster c;
  c.name = r.str("name");
  if (r.has("note")) c.note = r.str("note");
  const int nodes = r.int32("nodes", 1, kMaxClusterDevices);
  const bool machine = r.has("machine");
  if (machine && r.has("device")) r.fail("device", "is given beside machine; give one of them");
  if (!machine && !r.has("device"))
    r.fail("device", "is missing; give a device object (rates by hand) or machine (a file meshtrain calibrate wrote)");
  if (machine) {
    c.hardware = read_machine(r, base_dir, &c.machine_path);
    const int cores = c.hardware.cores;
    if (int64_t{cores} * nodes > kMaxClusterDevices)
      r.fail("nodes", "is " + std::to_string(nodes) + ", which with the machine's " + std::to_string(cores) +
                          " cores makes more than " + std::to_string(kMaxClusterDevices) + " cores");
    // Ranks are threads of one process per node; each node has the machine's cores.
    if (r.has("devices_per_node")) c.hardware.devices_per_node = r.int32("devices_per_node", 1, kMaxClusterDevices);
    c.hardware.cores = cores * nodes;
  } else {
    c.hardware.devices_per_node = r.int32("devices_per_node", 1, kMaxClusterDevices);
    read_device(r, c.hardware);
  }
  if (int64_t{c.hardware.devices_per_node} * nodes > kMaxClusterDevices)
    r.fail("nodes", "is " + std::to_string(nodes) + ", which with " + std::to_string(c.hardware.devices_per_node) +
                        " devices per node makes more than " + std::to_string(kMaxClusterDevices) + " devices");
  c.hardware.nodes = nodes;
  c.hardware.name = c.name;
  read_links(r, c.hardware, machine);
  r.done();
  return c;
}

Cluster read_cluster_file(const std::string& path) {
  const json j = io::read_json_file_strict(path, path, "give a cluster file (JSON; docs/planner.md lists its fields)");
  return cluster_from_json(j, path, std::filesystem::path(path).parent_path().string());
}

Cluster cluster_of_machine(const MachineProfile& m, const std::string& path) {
  if (m.memory_bytes == 0) throw std::invalid_argument(no_memory(path));
  Cluster c;
  c.name = m.host.empty() ? std::filesystem::path(path).stem().string() : m.host;
  c.note = "one node of the machine file " + path;
  c.machine_path = path;
  c.hardware = one_node_of(m, static_cast<double>(m.memory_bytes));
  c.hardware.name = c.name;
  return c;
}

namespace {
// The refusal of a file whose "kind" is not one `accepted` reads: names the file, what it holds
// and the kinds accepted.
[[noreturn]] void wrong_kind(const json& j, const std::string& path, const std::string& accepted) {
  const std::string found = !j.is_object()              ? "is not a JSON object"
                            : !j.contains("kind")        ? "has no kind"
                                                         : "has kind " + j["kind"].dump();
  throw std::invalid_argument(path + " " + found + ", but " + accepted + "; give one");
}
}  // namespace

Cluster read_machine_as_cluster(const std::string& path) {
  const json j = io::read_json_file_strict(path, path, "give a machine file meshtrain calibrate wrote");
  const bool object = j.is_object() && j.contains("kind");
  if (object && j["kind"] == kClusterFileKind)
    throw std::invalid_argument(path + " is a cluster file, not a machine file; give it with --cluster");
  if (!object || j["kind"] != kMachineFileKind)
    wrong_kind(j, path, std::string("--machine reads a machine file (kind \"") + kMachineFileKind +
                            "\", written by meshtrain calibrate)");
  return cluster_of_machine(from_json(j, path), path);
}

Cluster read_cluster_or_machine_file(const std::string& path) {
  const json j = io::read_json_file_strict(
      path, path, "give a cluster file or a machine file meshtrain calibrate wrote (JSON; docs/planner.md)");
  const json* kind = j.is_object() && j.contains("kind") ? &j["kind"] : nullptr;
  if (kind && *kind == kMachineFileKind) return cluster_of_machine(from_json(j, path), path);
  if (kind && *kind == kClusterFileKind) return cluster_from_json(j, path, std::filesystem::path(path).parent_path().string());
  wrong_kind(j, path, std::string("plan reads a cluster file (kind \"") + kClusterFileKind + "\") or a machine file (kind \"" +
                         kMachineFileKind + "\", written by meshtrain calibrate)");
}

}  // namespace meshtrain::plan
