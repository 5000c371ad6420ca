// DataParallel: gradient synchronisation over the dp axis, and ZeRO stages 1-3.
//
// Parameters are grouped into buckets. Each bucket owns two flat buffers (values, gradients)
// and every parameter's value and grad become views into them, so communication works on a
// bucket without copies (PyTorch DDP's "gradient as bucket view").
//   - Stages 0-2: buckets are filled in reverse parameter order (the order backward produces
//     gradients) up to `bucket_bytes`. Stage 3: one bucket per unit (the model's root
//     parameters, then one per transformer block), because a unit is what is gathered.
//     Parameters named in own_bucket sit alone in a bucket (stage 3: within their unit).
//   - A bucket's communication starts (async Work) from the grad_ready hook as soon as its last
//     gradient is final, so it overlaps the rest of backward; with gradient accumulation only
//     the last micro-batch communicates (set_sync).
//   - Stage 0: all-reduce (avg) each gradient bucket; every rank updates everything.
//   - Stage 1: all-reduce, but each rank updates only its slice of every bucket (optimizer
//     state / dp); the updated values are all-gathered after the step.
//   - Stage 2: reduce-scatter (avg) instead: each rank keeps only its gradient slice; the full
//     gradient buffer is freed after the step (gradients / dp).
//   - Stage 3: the values are sharded too: a unit's values are all-gathered just before its
//     forward and again before its backward, and freed after; the next unit's gather is
//     started (prefetched) while the current one computes (parameters / dp).
// Bucket slices: a bucket of n elements gives rank r the elements [off_r, off_r + n_r) with
// n_r = n / dp + (r < n % dp) — uneven slices, so any n and any dp work.
//
// The optimizer (train/) updates optimizer_params(): the parameters themselves at stage 0, or
// per-rank "segment" parameters (views of this rank's slices, carrying the original's weight
// decay flag) at stages 1-3. reduce_grad_sq() makes the clipping norm global.
// For the gradient noise scale (train/noise_scale.h), measure_local_grad_sq() makes each bucket
// add the squares of this rank's own gradients as its communication starts, before the
// all-reduce (or reduce-scatter) averages them over dp.
//
// Concurrency: all calls from the rank's own thread; the dp communicator runs the bucket
// operations in issue order on its progress thread. Every rank issues the same operations in
// the same order (the hooks fire in program order, identical on every rank).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/nn/module.h"

namespace meshtrain::parallel {

// Default bucket size: see docs/benchmarks.md, "Data parallelism".
inline constexpr int64_t kDefaultBucketBytes = 4 << 20;

struct DataParallelOptions {
  int zero = 0;                           // ZeRO stage 0..3
  int64_t bucket_bytes = kDefaultBucketBytes;  // stages 0-2
  // Parameters that get a bucket of their own (at stage 3: of their own within their unit), so
  // that this rank's slice of them is the same on every rank that holds them whatever else the
  // model holds: the tied token table of the first and the last pipeline stage, whose
  // gradients are summed across the two stages (synced_grad).
  std::vector<const nn::Param*> own_bucket = {};
  // Element type of the gradients on the wire (--comm-dtype). bf16: each rank sends its
  // bucket's gradients rounded to bf16, half the bytes of float32, and the sums are made in
  // float32 (comm_bf16 in data_parallel.cpp): an all-to-all of the bf16 slices (the
  // reduce-scatter), a float32 sum in rank order on the slice's owner, then (stages 0 and 1)
  // an all-gather of the owner's sum rounded to bf16, which every rank, the owner too, takes
  // as the gradient, so replicas stay identical. The all-to-all overlaps backward as the
  // float32 all-reduce does; the sum and the all-gather run when the step waits for it.
  bool bf16_wire = false;
  // Exact sums (train/trainer.h: TrainOptions::exact_sums): the layers leave each parameter's
  // gradient as a float64 total in Param::grad_exact; a bucket all-reduces those totals in
  // float64 and rounds the average into its float32 gradients (stages 0-1) or this rank's slice
  // (stages 2-3). Twice the bytes of a float32 all-reduce.
  bool exact_sums = false;
  // The algorithm of the gradient all-reduces (stages 0-1, float32 and exact sums); automatic:
  // the dp communicator's choice (comm/select.h), hier: by hosts (comm/hier.cpp).
  comm::Algorithm allreduce = comm::Algorithm::automatic;
};

// A unit of ZeRO-3: the module whose hooks gather it, and its parameters.
struct Unit {
  const nn::Module* module;
  std::vector<nn::Param*> params;
};

class DataParallel {
 public:
  // `units` in forward order (root first, then the blocks); together they hold every
  // parameter once. Collective-free construction (the values are identical on every rank
  // already: layout-invariant initialisation).
  DataParallel(std::vector<Unit> units, std::shared_ptr<comm::Communicator> dp,
               const DataParallelOptions& opt);
  ~DataParallel();

  nn::Hooks* hooks() { return &hooks_; }
  // Zeroes the gradients (reallocating freed stage-2/3 buffers) before a step's first micro-batch.
  void begin_step();
  // Whether the gradients of the coming backward are final for this step (last micro-batch).
  void set_sync(bool on) { sync_ = on; }
  // Waits for every bucket's gradient communication; stage 2/3 then free the full gradients.
  void finish_grad_sync();
  // What the optimizer updates (see the header comment).
  std::vector<nn::Param*> optimizer_params();
  // From now on every bucket, as its gradient communication starts, adds the sum of squares of
  // this rank's local (not yet averaged) gradients of the parameters `counted` accepts; off
  // when `counted` is empty. The float32 gradients only (not with exact sums).
  void measure_local_grad_sq(std::function<bool(const nn::Param*)> counted) { counted_ = std::move(counted); }
  // The sum since the last call, and starts a new one (once a step, after finish_grad_sync).
  double take_local_grad_sq() {
    const double s = local_sq_;
    local_sq_ = 0;
    return s;
  }
  // The global sum of squares of the gradients from this rank's local one.
  double reduce_grad_sq(double local);
  // The original parameter of an optimizer_params() entry (itself at stage 0).
  const nn::Param* origin(const nn::Param* opt_param) const;
  // After finish_grad_sync: the gradient of p this rank keeps, reduced over dp — all of it at
  // stages 0-1, this rank's slice at stages 2-3 (p must have a bucket of its own there).
  std::span<float> synced_grad(const nn::Param* p);
  // After the optimizer: stage 1/2 all-gather the updated values.
  void finish_optimizer_step();

  // ---- checkpoints (each rank saves and loads what it holds, checkpoint/checkpoint.h) ----
  // The flat element offset of an optimizer_params() entry inside its parameter's (tp-local)
  // tensor: the segment covers [offset, offset + numel) of origin(q); 0 at stage 0.
  int64_t segment_offset(const nn::Param* opt_param) const;
  // The original parameters, in units' order.
  const std::vector<nn::Param*>& params() const { return params_; }

  // ---- accounting ----
  struct Memory {
    int64_t param_bytes = 0;  // persistent values held by this rank (full or slice)
    int64_t grad_bytes = 0;   // persistent gradients (full or slice)
  };
  Memory memory() const;
  int zero() const { return opt_.zero; }
  comm::Communicator& group() { return *dp_; }

 private:
  struct Bucket;
  void grad_ready(nn::Param* p);
  void launch(Bucket& b);
  void launch_bf16(Bucket& b);  // bf16 wire: the all-to-all of bf16 slices
  void finish_bf16(Bucket& b);  // bf16 wire: the float32 sum and (stages 0, 1) the all-gather
  void launch_exact(Bucket& b);  // exact sums: the float64 all-reduce of the totals
  void finish_exact(Bucket& b);  // exact sums: the average rounded into the float32 gradients
  void gather_bucket(size_t b, bool wait);
  void release_bucket(size_t b);
  void on_pre(const nn::Module* m, bool backward);
  void on_post(const nn::Module* m, bool backward);

  std::shared_ptr<comm::Communicator> dp_;
  DataParallelOptions opt_;
  std::vector<nn::Param*> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::map<const nn::Param*, Bucket*> bucket_of_;
  std::map<const nn::Module*, size_t> unit_of_;  // stage 3: module -> unit index
  std::vector<std::vector<size_t>> unit_buckets_;  // stage 3: the buckets of each unit
  std::vector<std::unique_ptr<nn::Param>> segments_;
  std::map<const nn::Param*, const nn::Param*> origin_;  // segment -> its parameter
  std::map<const nn::Param*, int64_t> segment_offset_;   // segment -> its offset in the parameter
  nn::Hooks hooks_;
  bool sync_ = true;
  std::function<bool(const nn::Param*)> counted_;  // measure_local_grad_sq
  double local_sq_ = 0;
};

}  // namespace meshtrain::parallel
