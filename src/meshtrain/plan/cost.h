// The planner's cost model and memory model: what one training step of a layout will take, and
// how much memory each rank will hold, predicted from the model's own description of its layers
// (model/cost.h, asked through ModelSpec) and from a hardware description (a machine file that
// `meshtrain calibrate` measured, or a cluster file; plan/cluster.h).
//
// Step time, for one layout (dp x tp x pp, micro-batches, schedule, ZeRO stage, recomputation):
//   - per stage, the forward and backward of one micro-batch: every layer's FLOPs at the GEMM
//     rate the machine file measured for the nearest shape class and the rank's kernel threads
//     (attention at its own measured rate), memory-bound layers at the measured bandwidth, plus
//     a fixed cost per kernel call; the tensor-parallel all-reduces each layer asks for;
//   - the pipeline: the schedule's own action lists (pipeline/schedule.h, the lists the
//     executor runs) replayed by pipeline/simulate.h with those per-stage times and the
//     boundary transfers (alpha + beta x bytes);
//   - data parallelism: buckets all-reduced (reduce-scattered at ZeRO 2/3) while the last
//     micro-batch's backward runs, so only what does not fit under it is exposed; ZeRO 1-3's
//     parameter all-gather after the optimizer step, ZeRO-3's per-unit gathers in forward and
//     backward with the next unit's prefetched (the first exposed);
//   - the optimizer step and the gradient norm: bytes of parameters, gradients and state moved;
//   - ranks that share cores (threads of one process on a CPU): the step is at least the work
//     of all ranks divided by the cores (time-sharing), and collectives' latency grows with
//     ranks per core (comm/select.h).
// Collective costs are those of the algorithm `auto` picks (comm/select.h) with the link's
// fitted alpha and beta.
//
// Memory per rank: parameters, gradients and optimizer state per ZeRO stage and per tp/pp shard,
// the activations of the micro-batches the schedule keeps in flight on that rank (peak_in_flight;
// with recomputation only each one's stage input, plus one whole micro-batch), the largest
// transient of a backward, ZeRO-3's gathered units, and bf16 weight copies. The figure is tensor
// memory (what the rank allocates as tensors); a process also holds its data set, libraries and
// allocator slack, which train's start-up check adds (train/validate.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/model/spec.h"
#include "meshtrain/pipeline/partition.h"
#include "meshtrain/pipeline/simulate.h"
#include "meshtrain/plan/machine.h"

namespace meshtrain::plan {

// One layout of a training step (the flags of `meshtrain train`).
struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";  // pp > 1: naive, gpipe, 1f1b, interleaved, zb
  int chunks = 1;
  int zero = 0;
  bool recompute = false;
  bool sequence_parallel = false;
  int64_t batch = 1;  // global batch (samples)
  int64_t seq = 1;    // sequence length (token models; 1 for images)
  int threads = 1;    // kernel threads per rank
  bool bf16 = false;  // bf16 matrix products (bf16 weight copies)
  int optimizer_state = 2;  // floats of optimizer state per parameter: AdamW/LAMB 2, SGD momentum 1, SGD 0
  int64_t bucket_bytes = 4 << 20;
  // How the tp axis splits a convolutional network (train's --tp, --spatial, --branch-parallel):
  // filters and channels, row bands, or an Inception block's branches (placed by
  // `branch_balance`: "", "flops" or one rank per branch). Transformers: always tensor.
  enum class Split { tensor, spatial, branch } split = Split::tensor;
  std::string branch_balance;
  // A vocabulary tp does not divide is padded (train's --pad-vocab; the planner assumes it and
  // prints the flag).
  bool pad_vocab = true;
  // Units per pipeline stage (stage s = chunk * pp + rank); empty: balanced by FLOPs as the
  // trainer does without --pp-balance.
  std::vector<pipeline::LayerSpan> stages;
  int world() const { return dp * tp * pp; }
  std::string describe() const;  // "dp=2 tp=1 pp=2 m=4 1f1b zero=1"
};

struct Link {
  double alpha_s = 0;          // per message step
  double beta_s_per_byte = 0;  // per byte
};

// What the cost model knows of the hardware.
struct Hardware {
  std::string name;
  int nodes = 1;
  int devices_per_node = 1;
  // CPU machines: ranks run as threads of one process per node and share these cores (0: each
  // device is its own, as GPUs are).
  int cores = 0;
  double memory_bytes = 0;     // per device (CPU: per node)
  double peak_flops = 0;       // per device, for MFU (CPU: all cores' float32 GEMM rate)
  // Rates, when no machine file gives them by shape and thread count.
  double gemm_flops = 0;       // sustained matrix-product rate per device
  double attention_flops = 0;  // attention's rate per device
  double bytes_per_s = 0;      // memory bandwidth per device
  double call_overhead_s = 0;  // fixed cost of one kernel call
  Link intra, inter;           // inside a node, across nodes (all-reduce fits)
  bool has_machine = false;
  MachineProfile machine;      // measured rates (calibrate)
  int devices() const { return nodes * devices_per_node; }
};

// A machine file as hardware: one node, its cores, the given memory.
Hardware hardware_from_machine(const MachineProfile& m, double memory_bytes);

// Tensor memory of one rank, by part (bytes).
struct RankMemory {
  double params = 0, grads = 0, optimizer = 0, activations = 0, temp = 0, buffers = 0;
  int in_flight = 0;  // micro-batches whose activations it holds at once
  // A CNN split whose tp ranks hold different amounts (the branch split's branches): each tp
  // rank's total; the parts above are the largest's. Empty: the ranks hold alike.
  std::vector<double> by_tp_rank;
  double total() const { return params + grads + optimizer + activations + temp + buffers; }
};

struct Prediction {
  Layout layout;
  double step_s = 0;
  double compute_s = 0;      // the pipeline's makespan (compute and its tp all-reduces)
  double tp_comm_s = 0;      // of which tensor-parallel all-reduces, on the slowest stage
  double dp_comm_s = 0;      // data-parallel communication not hidden behind backward
  double optimizer_s = 0;    // the optimizer step, norm and zeroing
  double bubble = 0;         // idle share of the pipeline (mean over ranks)
  double comm_share = 0;     // (tp + exposed dp + pp transfer) / step
  double flops_per_step = 0;  // the model's, all ranks
  double mfu = 0;            // flops_per_step / step_s / (peak_flops x world)
  double samples_per_s = 0;
  double tokens_per_s = 0;
  // Every op of the first stage on its first rank, as the step above prices it (seconds of its
  // forward and backward, the intra-layer collectives apart): `meshtrain plan --layout --ops`.
  struct OpTime {
    std::string stage_op, kernel;  // the layer's name, and the kernel it is priced as
    double fwd_s = 0, bwd_s = 0, comm_s = 0;
  };
  std::vector<OpTime> ops;
  std::vector<RankMemory> memory;  // per pipeline rank
  double peak_bytes = 0;           // the most any rank holds
  std::vector<pipeline::LayerSpan> stages;
  pipeline::Schedule schedule;
  pipeline::Timeline timeline;     // the simulated step (seconds)
  // Sentences on what the prediction could not use (a machine file without the convolutional
  // layers' rates: convolutions priced as GEMMs and the other layers by bandwidth, as before
  // version 4).
  std::vector<std::string> notes;
};

// The one check of whether `spec` can run at layout `l`, shared by train (its start-up
// validation), plan (--layout and every layout its search tries) and launch (the layouts a
// job's survivors may take). Throws std::invalid_argument with a sentence: counts below 1, a
// batch dp x micro-batches does not divide, a ZeRO stage outside 0..3, a split the model's
// layers cannot take (tp against a transformer's heads, hidden size and vocabulary, or a CNN's
// channel counts, feature-map rows or branches: parallel/'s validate_* say which values
// work), more pipeline stages than units.
void check_layout(const model::ModelSpec& spec, const Layout& l);

// Predicts one layout. Throws std::invalid_argument with a sentence for a layout the model
// cannot take (check_layout).
Prediction predict(const model::ModelSpec& spec, const Layout& l, const Hardware& hw);

// Where several ranks share one node's cores (a machine file's hardware: ranks are threads of one
// process), one rank on all the cores they use (threads = theirs together, at most the cores;
// the same global batch, one micro-batch, no ZeRO): its predicted step, and `l`'s speed as a
// share of that rank's (one rank's step / `l`'s; below 1: `l` is slower). nullopt for one
// rank, hardware without shared cores, or a layout either side the model cannot price. train
// says so when a split does not pay at its size (below 0.9); plan ranks the layouts.
struct AgainstOneRank {
  double one_rank_step_s = 0;
  int one_rank_threads = 1;
  double speed = 1;  // one_rank_step_s / the layout's step
};
std::optional<AgainstOneRank> against_one_rank(const model::ModelSpec& spec, const Layout& l, const Hardware& hw,
                                               double step_s);

// The memory model alone (also train's start-up check).
std::vector<RankMemory> predict_memory(const model::ModelSpec& spec, const Layout& l);

// Units per stage balanced by FLOPs (the trainer's default without --pp-balance).
std::vector<pipeline::LayerSpan> balance_stages(const model::ModelSpec& spec, const Layout& l);

}  // namespace meshtrain::plan
