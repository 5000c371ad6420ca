// One validation pass over the options of `meshtrain train` (and the thread and size checks the
// other subcommands share), run before any rank thread starts or any step is taken.
//
// Every check throws std::invalid_argument with one sentence that names the flag (or the
// config field) and says what to change; the CLI turns it into exit 2. What it covers:
//   - ranges and finiteness of every flag (negative sizes, nan/inf rates, beta2 outside [0, 1),
//     a --val-fraction that leaves no validation tokens, ...);
//   - cross-option rules (layout divisibility, ZeRO with the parameter server, --slow-worker
//     without --ps-servers, checkpoint flags without --checkpoint-dir, tensor-parallel shapes);
//   - thread counts against the machine: at most kThreadsPerCore x cores kernel threads per
//     rank, and at most kRanksPerCore x cores threads (ranks x kernel threads) in one process;
//   - memory against the machine: the bytes of the run per process (estimate_memory: the
//     planner's memory model for every rank in it, the data, the validation batches) must fit
//     in the available memory (MemAvailable in /proc/meminfo, lowered by a cgroup memory limit);
//   - output paths (train/outputs.h): --metrics and --trace must name a file in an existing
//     directory, and --checkpoint-dir must not be (or lie under) a regular file; no output may
//     be an input, another output, or a file the program did not write (without --overwrite).
// Limits: the memory figure is a lower bound (kernel workspaces and allocator slack are not
// counted), so a run it admits can still run out of memory; it refuses only runs that cannot fit.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/data/data.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::train {

// Caps relative to the cores of the machine (see the header comment).
inline constexpr int kThreadsPerCore = 4;
inline constexpr int kRanksPerCore = 16;

// What the checks compare against; probe() reads the running machine, tests build their own.
struct Machine {
  int cores = 1;
  int64_t memory_bytes = 0;  // available memory; 0: unknown (no memory check)
  std::string memory_source;  // where memory_bytes came from, for the message
  static Machine probe();
};

// Bytes one process of the run holds (all its ranks together), by part: the planner's memory
// model (plan/cost.h predict_memory: tensors per rank, activations including the backward's
// transients and the pipeline's buffers) for every rank in the process, plus the data and the
// validation batches; the parameter server's ranks by their own sum (a GPT: an analytic one;
// an image model: each worker as a dp rank of the memory model without optimizer state, the
// servers as one more copy of the values and gradients with the optimizer's state).
struct MemoryEstimate {
  double params = 0, grads = 0, optimizer = 0, activations = 0, data = 0;
  double eval = 0;  // the token and target rows of --eval-batches validation batches
  int ranks = 1;    // ranks in this process
  double total() const { return params + grads + optimizer + activations + data + eval; }
};
MemoryEstimate estimate_memory(const TrainOptions& o, const model::ModelSpec& spec);

// Checks `o` (batch and seq already resolved from the model; threads may still be 0 = auto)
// against the model and the machine. Throws std::invalid_argument with a sentence.
void validate_options(const TrainOptions& o, const model::GPTConfig& cfg, const Machine& m);

// The output policy of train/outputs.h over the run's paths: --data and --config read;
// --metrics, --trace and its .svg written; --checkpoint-dir managed. Part of validate_options.
void check_paths(const TrainOptions& o);

// Image models (a ModelSpec whose input is images): the checks of validate_options that apply
// to them (ranges, layout rules, threads, memory, paths), and a sentence for what they cannot
// take yet (--recompute, bf16, --seq, --augment with the sequential order; with --ps-servers:
// --exact-sums, and a batch-norm graph at staleness above 0 without --batch-norm local).
void validate_image_options(const TrainOptions& o, const model::ModelSpec& spec, const Machine& m);

// Checks that need the loaded token file: token ids inside the model's vocabulary, and both
// splits long enough for one batch (the validation split for one --seq window).
void validate_dataset(const TrainOptions& o, const model::GPTConfig& cfg, const TokenDataset& data);

// ---- pieces shared with the other subcommands ----

// A kernel-thread count given by `flag`: 1 .. kThreadsPerCore x cores (0 is allowed when
// `zero_means_auto`).
void check_threads(const std::string& flag, int64_t threads, const Machine& m, bool zero_means_auto);
// A number of ranks run as threads of this process (each with `threads_per_rank` kernel
// threads): at most kRanksPerCore x cores in all. `what` names the flags that set it.
void check_ranks(const std::string& what, int64_t ranks, int64_t threads_per_rank, const Machine& m);
// --bucket-mb in bytes: a finite size from 4 bytes to 1 TiB.
int64_t bucket_bytes_from_mb(double mb);
// --ranks-per-host K over `world` ranks (train and bench comm): K at least 1 and dividing the
// world, so every host holds as many ranks. Throws std::invalid_argument with a sentence.
void check_ranks_per_host(int k, int world);
// --ranks-per-host and --allreduce of a training run: the hosts, and what hier needs (a
// data-parallel group spread evenly over two or more hosts). Part of validate_options.
void check_hosts(const TrainOptions& o);
// An output file `path` of `flag`: not a directory, in an existing, writable directory in which
// a file can in fact be created (tried with an unnamed file that leaves nothing behind, so a
// read-only mount or /proc is refused for root too).
void check_output_file(const std::string& flag, const std::string& path);
// An output directory `path` of `flag`: a directory, or creatable (its nearest existing
// ancestor is a writable directory).
void check_output_dir(const std::string& flag, const std::string& path);
// Bytes as text: "512 B", "3.1 GiB", "8.7e+18 GiB".
std::string format_bytes(double bytes);

}  // namespace meshtrain::train
