// The cluster file: the hardware `meshtrain plan` plans for, as JSON (docs/planner.md lists
// every field and where the example files' figures come from). Two ways to describe a device:
//
//   - "device" + "links": rates given by hand (a GPU's datasheet, a benchmark): peak and
//     sustained GEMM rate, attention's rate, memory and its bandwidth, the fixed cost of a
//     kernel launch, and the links inside and across nodes (bandwidth per device and
//     direction, latency). Converted as beta = 1 / bandwidth (s per byte), alpha = latency.
//   - "machine": a machine file `meshtrain calibrate` wrote (path relative to the cluster
//     file), whose measured rates the cost model reads by shape and thread count
//     (hardware_from_machine, plan/cost.h). Its ranks are threads of one process per node
//     that share the node's cores, so a node holds up to "devices_per_node" ranks (default
//     kCpuRanksPerCore x the machine's cores) and "memory_gb" is the node's, shared by them;
//     Hardware::cores is the cores of all nodes. "links" may then hold "inter_node" only (the
//     machine file measured the link inside the node) and must when "nodes" is above 1.
//     "memory_gb" may be left out when the machine file records its memory (version 3).
//
// A machine file is also a cluster on its own: one node of that machine (cluster_of_machine),
// so that `meshtrain calibrate --out m.json` then `meshtrain plan --machine m.json` (or
// `--cluster m.json`) plans for the machine measured, with no cluster file to write.
//
// The reader is strict, as the machine file's (plan/json_reader.h): an unknown or missing
// field, a value of the wrong type, a rate that is not a positive finite number, both or
// neither of "device" and "machine", a sustained rate above the peak, or another version is
// refused with std::invalid_argument naming the file and the field ("c.json: devices_per_node
// is 0, less than 1; ..."), as is a count beyond kMaxClusterDevices (never wrapped to an int),
// and a key given twice or a number beyond a double (io/json.h).
//
// Limits: one kind of device and two link classes (inside a node, across nodes); no
// topology beyond that (rails, oversubscribed spines), no per-node differences.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/plan/cost.h"

namespace meshtrain::plan {

inline constexpr int kClusterFileVersion = 1;
inline constexpr const char* kClusterFileKind = "meshtrain cluster";
// Ranks per core a machine-file cluster runs at most by default (threads of one process:
// beyond a few per core, time-sharing only adds switching).
inline constexpr int kCpuRanksPerCore = 4;
// The most devices (nodes x devices_per_node) and, for a machine cluster, cores (nodes x the
// machine's cores) a cluster file may describe: about a million, so that the planner's "1024 x
// the nodes" stays within an int.
inline constexpr int kMaxClusterDevices = 1 << 20;

struct Cluster {
  std::string name;
  std::string note;          // free text ("" when the file has none)
  std::string machine_path;  // the machine file read, resolved ("" for a "device" cluster)
  Hardware hardware;
  bool cpu() const { return hardware.cores > 0; }
};

// `source` names the file in messages; `base_dir` is where a relative "machine" path starts
// (the cluster file's directory). Throws std::invalid_argument.
Cluster cluster_from_json(const nlohmann::json& j, const std::string& source, const std::string& base_dir);
// Reads and parses a cluster file (and the machine file it names); throws std::invalid_argument.
Cluster read_cluster_file(const std::string& path);

// ---- a machine file as a cluster ----
// Machine `m` (read from `path`) planned for alone: one node of it, exactly as a cluster file
// {"nodes": 1, "machine": path} without devices_per_node or memory_gb reads it (all its cores,
// kCpuRanksPerCore ranks a core, its memory_bytes the node's memory), named after its host.
// A machine file that records no memory (version 2) is refused, saying how to mend it.
Cluster cluster_of_machine(const MachineProfile& m, const std::string& path);
// `plan --machine FILE`: a machine file as cluster_of_machine; a cluster file is refused
// (pointing at --cluster), any other file as read_machine_file refuses it.
Cluster read_machine_as_cluster(const std::string& path);
// `plan --cluster FILE`: by its "kind", a cluster file (read_cluster_file) or a machine file
// (cluster_of_machine); any other kind, or none, is refused naming the file and both kinds.
Cluster read_cluster_or_machine_file(const std::string& path);

}  // namespace meshtrain::plan
