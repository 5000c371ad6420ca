// PipeDream-2BW's weight versions on one pipeline rank (--schedule pipedream-2bw, pp > 1).
//
// The schedule runs the next step's forwards while the previous step's last backwards are
// still owed (pipeline/executor.h, windows), so a rank holds, per parameter:
//   value   the weights the current step's micro-batches run forward (and backward) on, W(t-1);
//   stash   the version before it, W(t-2), which the previous step's owed backwards ran forward
//           on and must run backward on (PipeDream's weight stashing, two versions: "2BW");
//   grad    the current step's gradient, accumulating over its micro-batches;
//   ready   the previous step's gradient, complete, waiting for the update at the step's end.
// The update at the end of step t applies the previous step's gradient, computed at W(t-2), to
// W(t-1): the recurrence W(t) = W(t-1) - lr grad f(W(t-2)), one step of staleness for every
// stage (Narayanan et al., ICML 2021). A flush (evaluation, checkpoint, the end) drains the
// pipeline and applies the current step's gradient too, so that nothing is in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "meshtrain/nn/param.h"

namespace meshtrain::train {

class WeightVersions {
 public:
  // `finish`: makes the accumulated gradients final in Param::grad (the data-parallel sync, or
  // the exact sums rounded); `zero`: zeroes them for the next step (the trainer's). `views`:
  // the gradients are views into buffers something else holds (data parallelism's buckets), so
  // their contents move; otherwise the tensors trade places, which costs no pass over them.
  WeightVersions(std::vector<nn::Param*> params, std::function<void()> finish, std::function<void()> zero,
                 bool views);

  // Around the backward of a micro-batch of the previous step: values and stash trade places.
  void swap_stash();
  // The rank's first backward of step `step`: the gradient accumulated so far (the previous
  // step's, complete) is copied to `ready`; the parameters' own starts again from zero.
  void start_step(int64_t step);
  // The step whose gradient is ready (none after a flush or at the start).
  std::optional<int64_t> ready_step() const { return ready_step_ >= 0 ? std::optional(ready_step_) : std::nullopt; }
  // Before an update: the stash takes the current values (the version the steps in flight use).
  void keep_current();
  // grad and ready trade contents (the optimizer reads grad, which data parallelism's buckets
  // view, so the contents move, not the tensors), and back after the update.
  void swap_ready();
  void clear_ready() { ready_step_ = -1; }
  // The current step's gradient was applied at a flush and zeroed: nothing is pending.
  void after_flush() { grad_step_ = -1, ready_step_ = -1; }
  // The bytes of the stash and the ready gradients this rank allocated.
  int64_t bytes() const;

 private:
  std::vector<nn::Param*> params_;
  std::function<void()> finish_, zero_;
  bool views_;
  std::vector<Tensor> stash_, ready_;
  int64_t grad_step_ = -1;   // the step whose gradient `grad` accumulates (-1: none yet)
  int64_t ready_step_ = -1;  // the step whose gradient `ready` holds (-1: none)
};

}  // namespace meshtrain::train
