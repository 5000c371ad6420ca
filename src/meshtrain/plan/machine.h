// The machine file: what `meshtrain calibrate` measured on one machine, for the planner's cost
// model (compute rates) and memory model, written as JSON (docs/planner.md lists every field).
//
// A MachineProfile holds measured figures only. Every rate is positive and finite; what could
// not be measured (bf16 products on a CPU without them, MPI links outside mpirun) is absent
// from the lists and said in a sentence instead, never replaced by a guessed number. Units are
// in the field names: gflops (1e9 floating-point operations per second), bytes_per_s, alpha_s
// (seconds per operation, the latency), beta_s_per_byte (seconds per byte).
//
// from_json is strict: an unknown or missing field, a value of the wrong type, a rate that is
// not a positive finite number, or another version is refused with std::invalid_argument
// naming the file and the field (e.g. "machine.json: gemm[3].gflops is -1; ..."), as is a
// count beyond kMaxMachineCount, a key given twice or a number beyond a double (io/json.h).
//
// Version 3 added memory_bytes; a version 2 file (without it) is still read, its memory 0
// (unknown), so a machine file measured before it keeps working wherever memory comes from
// elsewhere (a cluster file's memory_gb, train's own check). Version 4 added the layers of
// convolutional networks (conv, cnn_layers); a file of version 2 or 3 has none, and the cost
// model then prices a convolution as a GEMM and the other layers by the "add" bandwidth, as
// before (plan/cost.h says so in a note).
//
// Limits: one process's view (one host); the links of several hosts come from several files.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::plan {

inline constexpr int kMachineFileVersion = 4;
// The oldest version read (version 2: no memory_bytes).
inline constexpr int kMachineFileOldestVersion = 2;
// The most cores, threads and ranks (a link's world) a machine file may record; larger counts
// are refused, never wrapped to an int.
inline constexpr int kMaxMachineCount = 1 << 20;
// The "kind" every machine file carries; also how the output policy knows a file it wrote.
inline constexpr const char* kMachineFileKind = "meshtrain machine";

// One GEMM rate: C(m, n) = A(m, k) B(k, n), 2mnk floating-point operations per product.
struct GemmRate {
  std::string shape;      // the class: "square_1024", "mlp_up_bt512", "small_128", ...
  int64_t m = 0, n = 0, k = 0;
  std::string precision;  // "float32", or "bf16" (bf16 operands, float32 accumulation)
  int threads = 1;
  double gflops = 0;
  // Operands that come from memory: each product reads copies that rotate through more memory
  // than the last-level cache (a layer of a model whose activations do not fit in it);
  // otherwise the same operands every time (in the caches).
  bool cold = false;
};

// Element-wise bandwidth: c = a + b over float32 arrays of `elements`; 12 bytes an element
// move (two reads, one write).
struct ElementwiseRate {
  std::string op;  // "add"
  int64_t elements = 0;
  int threads = 1;
  double bytes_per_s = 0;
};

// kernels/attention.h forward + backward at (b, t, c, nh), causal. FLOPs counted as the model
// does: forward 2 b t^2 c (two products of the causal half), backward twice that, so
// 6 b t^2 c a step (the backward's recomputed scores are not counted).
struct AttentionRate {
  int64_t b = 0, t = 0, c = 0, nh = 0;
  int threads = 1;
  double gflops = 0;
};

// One convolution as nn::Conv2d runs it (kernels/conv.h: oneDNN's primitives): a shape class,
// input (n, ic, h, h), oc filters of k x k, padding k / 2, in one memory format; the rate of
// each of its three calls, forward, input gradient (backward-data) and weight gradient
// (backward-weights), each 2 n oh ow oc ic k k floating-point operations.
struct ConvRate {
  // "blocked": activations in oneDNN's blocked layout where the channel count divides by its
  // block (what one rank of a graph whose every layer takes it runs); "nchw": NCHW activations,
  // converted into the primitive's layout and back inside every call (the splits', and every
  // graph with a max pool or a concat).
  std::string format;
  int64_t n = 1, ic = 1, oc = 1, k = 1, stride = 1, h = 1;
  int threads = 1;
  double fwd_gflops = 0, bwd_data_gflops = 0, bwd_weights_gflops = 0;
};

// A memory-bound layer of a convolutional network as nn/ runs it, forward and backward through
// a Context (the output tensor and the saved ones included): seconds of one call each way on an
// input of `elements` floats, (n, 32, h, h) (pools: kernel 2, stride 2; concat: two halves of
// the channels; reorder: NCHW to blocked and back).
struct LayerRate {
  // batchnorm, batchnorm_relu, relu, add, add_relu, maxpool, avgpool, global_pool, concat,
  // reorder, gelu, flatten
  std::string op;
  std::string format;  // "blocked" or "nchw" (as ConvRate)
  int64_t elements = 1;
  int threads = 1;
  double fwd_s = 0, bwd_s = 0;
};

struct LinkPoint {
  int64_t bytes = 0;
  double seconds = 0;  // the slowest rank's mean time of one operation, best of the repetitions
};

// One link class and operation: time(n bytes) = alpha_s + beta_s_per_byte * n for one
// operation at `world` ranks, n as bench comm counts it (the whole buffer for all_reduce, one
// message for sendrecv). Fitted through the smallest and the largest point;
// max_fit_error is the largest |model - measured| / measured over all points.
struct LinkFit {
  std::string link;  // "threads", "mpi_shared_memory" or "mpi_tcp"
  std::string op;    // "all_reduce" or "sendrecv"
  int world = 2;
  double alpha_s = 0, beta_s_per_byte = 0, max_fit_error = 0;
  std::vector<LinkPoint> points;  // ascending bytes, at least 2
  double predict_s(double bytes) const { return alpha_s + beta_s_per_byte * bytes; }
};

struct NotMeasured {
  std::string what;    // "bf16 GEMM", "mpi_shared_memory", ...
  std::string reason;  // a sentence, with how to measure it where there is a way
};

struct MachineProfile {
  int version = kMachineFileVersion;
  std::string mode;            // "quick" or "full"
  std::string date;            // UTC, ISO 8601 ("2025-01-31T12:00:00Z")
  std::string meshtrain_commit;  // the source's git commit at configure time, or "unknown"
  std::string host;
  std::string cpu_model;       // /proc/cpuinfo "model name", or "unknown"
  int cores = 1;               // the cores this process may use
  std::string gemm_backend;    // kernels::gemm_backend()
  std::string bf16_isa;        // kernels::bf16_isa(): "emulated" means no bf16 products
  double calibrate_seconds = 0;  // the wall time of the measurement
  // The fixed cost of one kernel call on one thread (the mean of a tiny GEMM and a tiny
  // element-wise pass): what a layer costs beyond its FLOPs and bytes.
  double call_overhead_s = 0;
  // The last-level cache of the CPU the process runs on (sysfs), shared by the ranks of one
  // process; 0: unknown. Activations beyond it are written to and read back from memory.
  int64_t llc_bytes = 0;
  // The memory this machine's processes may use: MemTotal in /proc/meminfo, or a lower cgroup
  // memory limit; the planner's memory of a node when the file is planned for alone. 0:
  // unknown (no /proc/meminfo, or a version 2 file).
  int64_t memory_bytes = 0;
  // Ranks that outnumber the cores (threads of one process) take turns: the share of the
  // cores' work they still get done, measured at two ranks a core (1: no loss).
  double shared_core_efficiency = 1;
  // At two ranks a core, the time a pipeline hand-over takes beyond the message: the receiving
  // rank, asleep in its receive, waking and being given a core.
  double oversubscribed_handoff_s = 0;
  std::vector<GemmRate> gemm;
  std::vector<ElementwiseRate> elementwise;
  std::vector<AttentionRate> attention;
  // Version 4: convolutional networks' layers (empty in older files).
  std::vector<ConvRate> conv;
  std::vector<LayerRate> cnn_layers;
  std::vector<LinkFit> links;
  std::vector<NotMeasured> not_measured;

  // The best rate for (shape, precision, threads); 0 when absent.
  double gemm_gflops(const std::string& shape, const std::string& precision, int threads) const;
  const LinkFit* link(const std::string& link, const std::string& op) const;  // null when absent
};

nlohmann::json to_json(const MachineProfile& p);
// `source` names the file in messages. Throws std::invalid_argument.
MachineProfile from_json(const nlohmann::json& j, const std::string& source);
// Reads and parses a machine file; throws std::invalid_argument (missing file, bad JSON, fields).
MachineProfile read_machine_file(const std::string& path);
// to_json, dumped with two-space indents, written atomically (io::write_file_atomic).
void write_machine_file(const MachineProfile& p, const std::string& path);

// ---- measuring ----
struct CalibrateOptions {
  bool quick = false;  // a few seconds: fewer shapes, thread counts, sizes and repetitions
  int threads = 0;     // the most threads measured; 0: every core
  // The rounds every kernel and layer row is measured in, interleaved over the whole run; each
  // row keeps the median of its rounds (quick mode: always one). More rounds spread a
  // calibration over more of a shared machine's slower and faster states.
  int rounds = 3;
  // Measure the MPI links when launched by mpirun (all ranks take part; only rank 0 measures
  // the compute rates and the threads link).
  bool mpi = true;
};

// One line of progress: `done` of `total` measurements finished, `line` says which and its figure.
using CalibrateProgress = std::function<void(int done, int total, const std::string& line)>;

// Measures this machine. Throws std::invalid_argument for bad options (threads below 0).
// Under mpirun, ranks other than 0 return a profile holding the MPI links only.
MachineProfile calibrate(const CalibrateOptions& o, const CalibrateProgress& progress = {});

// The readable summary `meshtrain calibrate` prints.
std::string summary_table(const MachineProfile& p);

// ---- the machine file a run uses ----
// $MESHTRAIN_MACHINE_FILE when set, else $XDG_CACHE_HOME/meshtrain/machine.json, else
// $HOME/.cache/meshtrain/machine.json, else meshtrain-UID/machine.json in the temporary
// directory ("" when there is none).
std::string default_machine_path();
// The machine file of `meshtrain train`'s cost model: `path` when given (read; a bad file
// throws std::invalid_argument naming it); else the file at default_machine_path() when it
// was measured on this host, CPU model and number of cores; else, when `may_calibrate`, a
// quick calibration (about 8 s on a 2-core AMD EPYC VM), written there for the next run (a note on stderr; a
// failed write is said and the run goes on). nullopt: none could be had. `source` says which.
// `quick_calibration(path)` makes the quick calibration and writes it to `path` (the program
// runs it as a child process, so that its buffers never count in the run's memory); null: in
// this process.
std::optional<MachineProfile> machine_for_run(const std::string& path, bool may_calibrate, std::string* source,
                                              const std::function<bool(const std::string&)>& quick_calibration = {});

// The cores this process may run on (its affinity mask; hardware_concurrency without one).
int usable_cores();

}  // namespace meshtrain::plan
