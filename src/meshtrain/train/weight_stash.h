// PipeDream's weight stashing on one pipeline stage (--schedule pipedream): an update after
// every micro-batch's backward, and each micro-batch's backward on the weights its forward used.
//
// Stage s of p runs 1F1B without a flush, so when micro-batch k runs forward there, the
// backwards of micro-batches up to k - (p - s) have updated it: its weights are version
// v(k) = k - d, d = p - 1 - s (version v: v updates applied). The last stage (d = 0) always runs on
// the newest weights; the first (d = p - 1) on weights p - 1 updates old (Harlap et al. 2018,
// "PipeDream"; Narayanan et al. 2019). A backward must use the version its forward used, so
// each version a micro-batch in flight ran forward on is stashed until that backward is done:
// stage s holds d of them beside the current weights.
//
// The recurrence, per stage s, over the micro-batches k counted across steps:
//   W_s(k + 1) = W_s(k) - lr u(grad_s f(W_0(v_0(k)), ..., W_{p-1}(v_{p-1}(k)); x_k))
//   v_s(k) = max(k0, k - d_s)
// where k0 is the first micro-batch after the last flush (a flush drains the pipeline: the
// run's start, an evaluation, the end), after which every stage starts from its newest weights.
//
// The same class computes the recurrence two ways. In a pipeline (`strict`) the version a
// forward needs must be the current one — the schedule's order makes it so, and a forward that
// finds other weights throws, naming the stage and versions. On one rank holding all p stages
// (`--pp 1 --chunks p`: the reference), every micro-batch runs through all stages in turn, so
// the current weights are always the newest; a forward then swaps in the older version the
// recurrence names, which the stash keeps for as long as a later forward may need it.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "meshtrain/nn/param.h"

namespace meshtrain::train {

class WeightStash {
 public:
  // `params`: the stage's parameters (the tensors the layers read); `delay`: d = p - 1 - s.
  WeightStash(std::vector<nn::Param*> params, int64_t delay, bool strict);

  // Around the forward of micro-batch k (counted across steps): the version it runs on is put
  // in place (strict: checked to be in place already), and back after.
  void begin_forward(int64_t k);
  void end_forward(int64_t k);
  // Around its backward: the version its forward used.
  void begin_backward(int64_t k);
  void end_backward(int64_t k);
  // Around the update that follows the backward: before it, the current values are set aside
  // if a micro-batch in flight (or a later forward) still needs them; after it, the version
  // count moves on and what no one needs any more is freed.
  void begin_update();
  void end_update();
  // The pipeline is drained: no micro-batch is in flight, and the next forward (micro-batch
  // `next`) and every one after it start again from the newest weights (k0 = next).
  void flush(int64_t next);

  int64_t version() const { return current_; }
  int64_t delay() const { return delay_; }
  // The versions kept beside the current one, and their bytes (what this stage allocated).
  int stashed() const { return static_cast<int>(stash_.size()); }
  int64_t bytes() const;
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  int64_t needed(int64_t k) const { return std::max(k0_, k - delay_); }
  void swap_in(int64_t v);  // values <-> stash_[v]
  std::vector<nn::Param*> params_;
  int64_t delay_;
  bool strict_;
  int64_t current_ = 0;    // updates applied (counted across steps, from the run's first micro-batch)
  int64_t k0_ = 0;         // the first micro-batch after the last flush
  int64_t next_f_ = 0;     // the micro-batch the next forward runs
  std::map<int64_t, std::vector<Tensor>> stash_;  // version -> the values it had
  std::map<int64_t, int> users_;                  // version -> micro-batches in flight on it
  std::map<int64_t, int64_t> version_of_;         // micro-batch in flight -> its version
  int64_t swapped_ = -1;                          // the version swapped in now (-1: current)
  int64_t peak_bytes_ = 0;
};

}  // namespace meshtrain::train
