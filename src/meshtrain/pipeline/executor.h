// Executor: runs one rank's action list of a Schedule (schedule.h, after add_send_recv) on the
// model chunks this rank holds — one executor for every schedule (DESIGN decision 4). The
// single-rank step is the trivial schedule: one stage, m micro-batches.
//
// What it does per action:
//   F       a fresh nn::Context for (stage, micro-batch); forward of the chunk on its input (the
//           received activation, the previous stage's output on this rank, or nothing on the
//           first stage); the output is kept for SEND_F or the next stage on this rank.
//   B       backward of that micro-batch from its output gradient (received, handed over by the
//           next stage on this rank, or nothing on the last stage); the context is released.
//   RECV_*  waits for a receive that was posted when the step began (posted early, waited
//           late), so a transfer overlaps whatever the rank computes before it needs the data.
//   SEND_*  posts an asynchronous send; all sends are waited for at the end of the step.
// Messages travel over the pp group's communicator with tags of their own range
// (kPipelineTagBase + ...), keyed by (sending stage, micro-batch, direction), so no other user
// of the group (or of a world communicator) can take them.
//
//   I       backward_input: the input gradient (sent or handed over like B's), the weight
//           gradients deferred in the micro-batch's context, which stays alive;
//   W       backward_weights: the deferred weight gradients; the context is released.
//
// Asynchronous schedules (Schedule::period > 0, pipedream-2bw): the rank's list holds three
// steps unrolled; the executor cuts it into windows, the part one step runs: `first` (the
// warm-up and the first step's steady part), `steady` (one step's forwards, interleaved with
// the backwards of the previous step's last micro-batches and this step's first ones) and
// `drain` (the backwards still owed, run when the pipeline is flushed). A window's actions
// number the micro-batches of its step 0 .. m-1 and those of the step before -m .. -1; the
// contexts of the micro-batches a window leaves in flight, and its sends not yet delivered,
// carry over to the next window. The stage learns from the sign of `mb` in backward which
// step's weights the micro-batch ran forward on. Tags carry the step's parity, so a message of
// one step never matches a receive of the next.
// Concurrency: an Executor belongs to one rank's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/nn/context.h"
#include "meshtrain/pipeline/schedule.h"

namespace meshtrain::pipeline {

// One model chunk (a stage) as the executor drives it.
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Forward of micro-batch `mb`: `input` is the previous stage's output (empty on the first
  // stage, which reads its tokens itself). Returns the output (empty on the last stage, which
  // keeps its loss itself).
  // `portal`: a skip connection across stages (portal_from / portal_to below): forward reads
  // portal.in (the skip tensor it adds) and writes portal.out (the one it makes).
  virtual Tensor forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal) = 0;
  // Backward of `mb` from `dy`, the gradient of the output (empty on the last stage). `last` is
  // true for the stage's final backward of the step (data parallelism syncs its gradients
  // then). Returns the gradient of the input (empty on the first stage).
  // portal.in: the gradient of the skip tensor this stage made; portal.out: the gradient of the
  // one it added.
  virtual Tensor backward(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) = 0;
  // Split backward (I then W, zero-bubble schedules): the input gradient only, the weight
  // gradients deferred in ctx; then, later, the weight gradients. `last` as for backward. The
  // defaults refuse: a stage that cannot split says so.
  virtual Tensor backward_input(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal);
  // After a backward (B) of `mb` and the send of its input gradient, if any: work that should
  // not delay that gradient (PipeDream's update). The default does nothing.
  virtual void after_backward(int mb) { (void)mb; }
  virtual void backward_weights(nn::Context& ctx, int mb, bool last);
  // A skip connection across stages: the stage this one's skip tensor goes to and the stage
  // whose skip tensor this one adds (-1: none). The executor sends it straight there, past the
  // stages between, and its gradient straight back; these transfers are not actions of the list
  // (they follow the F and B chain, so they add no order the dry run would need to check).
  virtual int portal_to() const { return -1; }
  virtual int portal_from() const { return -1; }
  // Shapes of what crosses this stage's boundaries: what it receives forward (and sends back
  // as a gradient), what it sends forward (and receives back as a gradient), and the skip
  // tensor a portal carries to or from it. A transformer's are all one shape; a convolutional
  // network's shrink from stage to stage. Each defaults to boundary_shape(), for stages whose
  // boundaries all have one shape.
  virtual Shape input_shape() const { return boundary_shape(); }
  virtual Shape output_shape() const { return boundary_shape(); }
  virtual Shape portal_shape() const { return boundary_shape(); }
  virtual Shape boundary_shape() const;  // the default refuses: override it or the three above
};

inline constexpr int kPipelineTagBase = 1 << 23;  // tags kPipelineTagBase .. kMaxUserTag

// One action as it ran, for timelines (times since the step began).
struct ActionTiming {
  Action action;
  double start_us = 0, end_us = 0;
};

struct StepStats {
  std::chrono::steady_clock::time_point start;  // when the step began (timeline times count from it)
  double step_us = 0;
  double compute_us = 0;               // F, B (, I, W) time on this rank
  double bubble = 0;                   // (step - compute) / step: idle inside this rank's step
  int64_t peak_saved_bytes = 0;        // most activation bytes the live contexts held at once
  int max_in_flight = 0;               // most (stage, micro-batch) contexts alive at once
  int64_t portal_bytes_sent = 0, portal_bytes_received = 0;  // skip connections across ranks
  std::vector<ActionTiming> timeline;  // every action of the step, in the order run
};

class Executor {
 public:
  // `schedule` must have its communication (add_send_recv) and pass validate(); `chunks[c]` is
  // this rank's chunk c (stage schedule.shape.stage_of(rank, c)). `pp` is the pipeline group
  // (rank = pipeline rank); it may be null when pp == 1.
  Executor(Schedule schedule, int rank, comm::Communicator* pp, std::vector<StageRunner*> chunks,
           int threads, kernels::Precision precision = kernels::Precision::f32);

  // Runs this rank's list once (one step). Throws CommError from the transfers. An asynchronous
  // schedule runs its next window: `first` after a flush (or at the start), else `steady`.
  StepStats run_step();
  // Asynchronous schedules: the backwards still in flight, so that nothing is (a flush, before
  // a checkpoint, an evaluation or the end). Does nothing when nothing is in flight.
  StepStats drain();
  bool in_flight() const { return !live_.empty(); }

  // Forward only (evaluation): every micro-batch through every stage in order, contexts that
  // save nothing.
  void forward_only(int microbatches);

  const Schedule& schedule() const { return schedule_; }
  // The optimizer step the coming run_step's weights belong to (nn::Context::weights_epoch):
  // bf16 weight copies are made once for it and reused by every micro-batch.
  void set_weights_epoch(int64_t epoch) { weights_epoch_ = epoch; }
  // Exact gradient sums: the row slices of every training micro-batch (nn::Context::grad_slices).
  void set_grad_slices(int k) { grad_slices_ = k; }
  // Where the layers report their kernels' time in training steps (nn::Context::kernel_span;
  // the trace's kernels track, beside the steps' compute spans). Null: not reported.
  using KernelSpans = std::function<void(const char*, nn::Context::Clock::time_point, nn::Context::Clock::time_point)>;
  void set_kernel_spans(KernelSpans f) { kernel_spans_ = std::move(f); }

 private:
  enum class Msg { activation = 0, gradient = 1, portal = 2, portal_grad = 3 };
  // `mb`: the micro-batch's number counted over steps (step * m + micro-batch).
  int tag(int sender_stage, int64_t mb, Msg kind) const;
  using Key = std::pair<int, int64_t>;  // (stage, micro-batch counted over steps)
  // One list: `batch` is the step its micro-batches 0 .. m-1 belong to (negative ones: the step before).
  StepStats run_list(const std::vector<Action>& list, int64_t batch, bool last_window);
  // Asynchronous schedules: this rank's windows, cut from the unrolled list.
  std::vector<Action> first_, steady_, drain_;
  void cut_windows();
  int64_t next_batch_ = 0;  // the step the next window's forwards belong to
  bool flushed_ = true;     // nothing in flight: the next window is `first`
  std::map<Key, std::unique_ptr<nn::Context>> live_;  // contexts in flight (across windows)
  std::vector<std::pair<comm::Work, Tensor>> sends_;  // sends not yet delivered (across windows)

  Schedule schedule_;
  int rank_;
  comm::Communicator* pp_;
  std::vector<StageRunner*> chunks_;
  int threads_;
  kernels::Precision precision_;
  int64_t weights_epoch_ = -1;
  int grad_slices_ = 0;
  KernelSpans kernel_spans_;
  int eval_round_ = 0;
};

}  // namespace meshtrain::pipeline
