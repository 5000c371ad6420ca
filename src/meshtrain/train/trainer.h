// The training loop: data -> forward/backward over micro-batches -> clip -> the optimizer, with
// validation every K steps, one metrics line per step, and checkpoints that resume
// bit-for-bit (the batch of a step is a function of (seed, step) and every kernel is
// deterministic for a fixed thread budget, so a resumed run recomputes exactly what the
// uninterrupted one did).
//
// Every rank runs the same loop (ranks are threads of this process, or MPI processes): it
// builds its part of the model, draws its rows of the global batch, and lets the data-parallel
// engine (parallel/data/data_parallel.h) synchronise gradients and shard optimizer state. Rank 0
// prints and writes metrics; every rank saves its pieces of each checkpoint (checkpoint/checkpoint.h:
// named parts of the full logical tensors, so any layout resumes any other).
// Limits: tensor and pipeline parallelism are validated here and run as their drivers land.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/data.h"
#include "meshtrain/kernels/bf16.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/graph.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/plan/cost.h"

namespace meshtrain::train {

enum class IntraSplit { tensor, spatial, branch };
// "tp", "spatial", "branch-parallel": the flag that sets it.
const char* intra_flag(IntraSplit s);

struct TrainOptions {
  // model and data
  std::string model = "gpt-tiny";  // a named config, ignored when config_file or graph is set
  std::string config_file;
  // A layer graph built in code (model/builder.h); it takes the place of model and config_file.
  std::shared_ptr<const model::Graph> graph;
  std::string data;
  DataOrder data_order = DataOrder::random;
  // Image models with an .npz: how 4-d images are laid out (automatic: from the shape).
  ImageLayout data_layout = ImageLayout::automatic;
  double val_fraction = 0.1;
  // layout (DESIGN "Interfaces")
  int dp = 1, tp = 1, pp = 1;
  // What the mesh's intra-layer axis (size tp) splits (model/cnn_layout.h): a transformer's or a
  // CNN's layers by features, filters and channels (--tp), a CNN's feature maps by row bands
  // (--spatial N: tp = N), an Inception block's branches (--branch-parallel N: tp = N).
  IntraSplit intra = IntraSplit::tensor;
  std::string branch_balance;  // --branch-parallel: the rank of each branch ("0,1,1,0"); empty: by cost
  int microbatches = 1;
  std::string schedule = "1f1b";  // with --pp > 1: naive, gpipe, 1f1b, interleaved, zb (zb-h1)
  int chunks = 1;                  // model chunks per pp rank (interleaved: 2 or more)
  std::string pp_balance;          // blocks per stage: "3,3,2,2", "flops" (also empty) or "profile"
  std::string pp_cuts;             // the layers stages 1, 2, ... begin at: "h.2" or "layer2.0.conv1,fc"
  bool recompute = false;          // keep each stage's input only; recompute its forward in backward
  int zero = 0;
  bool sequence_parallel = false;  // with --tp: layernorm/residual regions split along T
  bool pad_vocab = false;          // with --tp: pad a vocabulary tp does not divide
  int64_t bucket_bytes = 0;  // data-parallel gradient bucket size (0: the default)
  std::string backend = "threads";
  // Hosts (comm/hier.cpp): ranks [0, K) are host 0, [K, 2K) host 1, ... (0: not given; threads:
  // one host; mpi: the hosts mpirun placed the processes on).
  int ranks_per_host = 0;
  // The data-parallel gradient all-reduce: auto, ring, rhd, tree, hier or native (mpi).
  std::string allreduce = "auto";
  // parameter-server mode (train/ps_trainer.h): world = dp workers + ps_servers servers
  int ps_servers = 0;
  int64_t staleness = 0;  // -1: unbounded (asynchronous)
  double slow_worker_factor = 1.0;  // test flag: worker 0 sleeps so its step takes this many times longer
  // run
  int64_t steps = 500;
  int64_t batch = -1;  // global batch B (-1: the model's default; other values below 1 are refused)
  int64_t seq = -1;    // T (-1: the model's default; other values below 1 are refused)
  uint64_t seed = 1337;
  OptimizerConfig optim;  // --optimizer and its flags, the learning-rate schedule, clipping
  int threads = 0;  // kernel threads per rank (0: cores / ranks)
  kernels::Precision precision = kernels::Precision::f32;  // of the matrix products (--precision)
  kernels::Precision comm_dtype = kernels::Precision::f32;  // of the dp gradient buckets on the wire (--comm-dtype)
  // --exact-sums N (0: off): parameter gradients summed exactly, so that the loss curve does not
  // depend on how data parallelism groups the rows (image models). Every micro-batch's rows are
  // N equal slices, each rank computing N / dp of them: convolutions and linear layers run slice
  // by slice (the same kernel calls at every layout), each slice's float32 parameter gradient is
  // added into a float64 total, the totals are all-reduced in float64 and rounded to float32 once.
  // Needs dp dividing N, N dividing the rows of a micro-batch (batch / microbatches), and the
  // same --threads at every layout compared (a kernel's sums follow its thread count).
  int exact_sums = 0;
  int64_t eval_every = 250;
  int64_t eval_batches = 20;
  // outputs
  std::string metrics;  // JSON lines, one per step
  std::string trace;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  double checkpoint_every_s = 0;  // also save when this many seconds passed since the last save (0: off)
  int keep_checkpoints = 0;  // 0: keep all
  bool resume = false;
  bool save_initial = false;
  // Step-0 weights (--init-from FILE): whole tensors by parameter or buffer name, each rank
  // taking its part (model::load_initial). Null: the model's own (an ONNX file's initializers,
  // model::Graph::initial), unless init_from_seed, else --seed's draws.
  std::shared_ptr<const std::vector<std::pair<std::string, Tensor>>> initial_weights;
  std::string initial_source;  // names initial_weights in messages
  bool init_from_seed = false;  // --init-from seed: draw even where the model carries weights
  bool overwrite = false;  // outputs may replace files meshtrain did not write (train/outputs.h)
  // image models
  bool augment = false;           // random crop and flip of the training images (data/images.h)
  bool batch_norm_local = false;  // batch-norm statistics per rank (default: over the dp group)
  // The planner's hardware (plan/cost.h): with it, the run prints its predicted step time and
  // peak tensor memory per rank at the start, writes them in every metrics line, and at the
  // end prints them against what it measured. Null: no prediction (library calls).
  std::shared_ptr<const plan::Hardware> hardware;
  std::string hardware_source;  // where the hardware came from, for the message
  // Called once every option, the data and the checkpoints have been checked, before any rank
  // starts: work that must not come before a refusal (the CLI measures the machine here when
  // it has no machine file yet, so bad input is refused at once, not after the measurement).
  std::function<void(TrainOptions&)> on_checked;
  // Called on world rank 0 after each step's metrics line is written (also without --metrics),
  // with that line: the Python module's on_step. It runs on the rank's thread while the other
  // ranks go on to their next collective; an exception it throws ends the run as a failed rank
  // does (the others fail at once at their next collective) and train() rethrows it.
  std::function<void(const nlohmann::json& line)> on_step;
  // Test fault injection (--fail-rank R --fail-at-step N): world rank R throws at the start of
  // step N (0-based), as a rank lost mid-run; the other ranks fail at their next collective and
  // the run exits 1 naming rank R. -1: off.
  int fail_rank = -1;
  int64_t fail_at_step = -1;
  // `meshtrain launch` sets MESHTRAIN_LAUNCH_STATUS to a file; world rank 0 writes "running
  // from step N" there when its steps begin, which tells the launcher the job is up (a restart's
  // cost, and when --grow may stop it), and touches it after every step (its heartbeat: a job
  // whose steps stop coming is stalled). Empty: none.
  std::string launch_status_file;
  int64_t log_every = 1;  // progress line every N steps (0: none)
  bool quiet = false;     // no progress output at all
};

// The mesh as the run's header names it: "dp=2 tp=2 pp=1", with the intra-layer axis under its
// split's name ("dp=1 spatial=2 pp=1", "dp=1 branch=2 pp=2").
std::string mesh_str(const TrainOptions& o);

struct StepRecord {
  int64_t step = 0;  // 0-based index of the step just completed
  float loss = 0;
  float lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double peak_rss_mb = 0;
  // rank 0's communication in this step (data-parallel group)
  uint64_t comm_bytes_sent = 0;  // the dp group's
  uint64_t tp_bytes_sent = 0;    // the tp group's
  uint64_t comm_bytes_received = 0;
  uint64_t comm_bytes_cross_host = 0;  // of comm_bytes_sent, to ranks on other hosts (--ranks-per-host)
  double comm_wait_ms = 0;  // time blocked on communication not hidden behind compute
  std::optional<float> val_loss;
  // classifiers: the share of the step's batch (and of the validation batches) predicted right
  std::optional<float> accuracy, val_accuracy;
};

// The metrics line of a step: the fields every training mode writes (DESIGN decision 8).
nlohmann::json step_json(const StepRecord& r);

// Per-rank persistent bytes of training state (rank 0's), for the ZeRO memory report.
struct StateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
};

// Every rank's state and the parameters it holds (tp-local elements of its stages), for the
// per-rank memory report against the analytic formulas.
struct RankState {
  StateBytes bytes;
  int64_t held_params = 0;
};

// One rank's part of a checkpoint save, measured on the rank's own thread.
struct RankSave {
  double seconds = 0;          // writing its two files (after rank 0 made the folder)
  int64_t bytes_written = 0;   // their size
  int64_t model_elements = 0;  // elements of its model pieces (its optimizer file: twice as many)
  int64_t resident_bytes = 0;  // tensor bytes it held when the save began (tensor_bytes_live_thread)
  int64_t peak_bytes = 0;      // the most it held during the save (tensor_bytes_peak_thread)
};

struct TrainResult {
  model::GPTConfig config;
  std::vector<StepRecord> steps;  // the steps run by this call (after a resume: from there)
  std::optional<float> final_val_loss;
  std::optional<float> final_val_accuracy;  // classifiers
  std::string model;                        // the model's name (any family)
  int stopped_by = 0;  // the signal that stopped the run early (train/stop.h); 0: ran to the end
  int64_t start_step = 0;
  double wall_s = 0;
  StateBytes state_bytes;
  std::vector<RankState> ranks;  // by world rank
  std::vector<RankSave> saves;   // the run's last checkpoint save, by world rank
  double last_save_s = 0;        // that save on rank 0, from the first barrier to `latest`
  std::vector<int64_t> restore_bytes_read;  // --resume: piece bytes each rank read, by world rank
  std::vector<int64_t> restore_tensor_bytes;  // and the tensor memory that rose while it read (peak - before)
  // The most tensor memory each rank held during a training step (tensor_bytes_peak_thread,
  // from the step's start to its optimizer step; evaluation and checkpoint saves not counted),
  // by world rank.
  std::vector<int64_t> peak_tensor_bytes;
  // The cost model's prediction for this run (with TrainOptions::hardware).
  std::optional<plan::Prediction> predicted;
  double start_rss_mb = 0;      // the process's resident memory when train() began
  double measured_step_s = 0;  // the median step time (steps after the first two when there are 5 or more)
};

// The planner's layout of a run: its options and the units of each pipeline stage.
plan::Layout plan_layout(const TrainOptions& o, const std::vector<pipeline::LayerSpan>& spans);

// A non-finite loss or gradient norm: the run stops at that step (what() names it) without
// applying it; no checkpoint of that state is saved, so the last one stays `latest`.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The swimlane drawn beside a --trace file: X.json -> X.svg, any other name -> name + ".svg".
std::string trace_svg_path(const std::string& trace);

// The step-0 weights a run starts from: TrainOptions::initial_weights, else the model's own (an
// ONNX file's, model::Graph::initial) unless --init-from seed; null: --seed's draws. `source`
// names them in messages.
const std::vector<std::pair<std::string, Tensor>>* initial_weights(const TrainOptions& o, const model::ModelSpec& spec,
                                                                   std::string* source);

// Reads the model config, resolves defaults (batch and seq when -1, threads when 0,
// decay_steps) and runs the validation pass of train/validate.h against this machine; throws
// std::invalid_argument with a sentence saying what to change.
model::GPTConfig resolve_options(TrainOptions& opt);

// Runs training as configured. Bad input throws std::invalid_argument, DataError or
// CheckpointError before any step runs (among them: --resume with a missing directory or with
// step folders none of which verifies; a new run, without --resume, into a directory that
// already holds step folders). While running: TrainingDiverged, CheckpointWriteError (a save
// failed), io::WriteError (a metrics or trace file could not be written: a full disk), CommError;
// the last checkpoint saved stays `latest`, and nothing is printed as written that was not.
// A step that saves records its metrics line (without the save's timings) in the checkpoint's
// state before `latest` names it; the line goes to the metrics file after the save, with a
// "checkpoint" object of the save's timings.
// --resume continues from the newest valid step folder (checkpoint/checkpoint.h) and leaves the
// metrics file with exactly one line for each step up to that one (train/metrics.h: later and
// cut lines dropped, duplicates collapsed, a missing line written back from the checkpoint that
// recorded it), printing a note to stderr for anything it chose, skipped, repaired or could not
// repair.
TrainResult train(TrainOptions opt);

}  // namespace meshtrain::train
