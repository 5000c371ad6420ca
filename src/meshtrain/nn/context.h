// Context: the state of one micro-batch between its forward and its backward (DESIGN
// decision 5). Each module saves what its backward needs under its own address; backward
// takes it back and the context drops it. A pipeline keeps one Context per micro-batch in
// flight, so 1F1B's memory bound is simply "at most P contexts alive".
//
// It also carries the rank's kernel thread budget (several ranks share one process's cores)
// and whether this is a training pass (an evaluation pass saves nothing).
//
// Concurrency: a Context belongs to one rank's thread; no locking.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "meshtrain/kernels/gemm.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {


struct Param;
class Module;

// Callbacks a parallel strategy hangs on the forward and backward passes (all optional):
// data parallelism starts a bucket's all-reduce when its last gradient is ready; ZeRO-3
// gathers a unit's parameters before its forward/backward and frees them after. Models call
// the unit hooks around each transformer block and around the model itself (the root unit).
struct Hooks {
  std::function<void(Param*)> grad_ready;  // p's gradient is final for this backward
  std::function<void(const Module*)> pre_forward, post_forward, pre_backward, post_backward;
};

// Tensors a skip connection carries between model pieces run separately (pipeline stages): the
// producer writes `out` in forward and reads its gradient from `in` in backward; the consumer
// reads `in` in forward and writes the gradient to `out` in backward (model/stage.h).
struct Portal {
  Tensor in;
  Tensor out;
};

class Context {
 public:
  explicit Context(int threads = 1, bool training = true, kernels::Precision precision = kernels::Precision::f32)
      : threads(threads), training(training), precision(precision) {}

  int threads;    // kernel thread budget of the rank that owns this context
  kernels::GemmOptions gemm() const { return {threads, precision}; }
  // The same with `w` as the B operand: under bf16 its copy for this step (kernels/gemm.h b16).
  kernels::GemmOptions gemm_with(const Param& w) const;
  bool training;  // false: forward only, nothing is saved
  kernels::Precision precision;  // of the matrix products (kernels/bf16.h)
  // The optimizer step whose weights this pass reads (-1: unknown, e.g. evaluation): bf16 weight
  // copies made for it are reused (Param::bf16_value). Set by the executor for training passes.
  int64_t weights_epoch = -1;
  // The training step this pass belongs to and the index of its micro-batch's first sample in
  // the step's global batch (set by the trainer): dropout keys its masks by them (nn/dropout.h).
  // step -1: no step (evaluation, or a caller that does not say): dropout passes x through.
  int64_t step = -1;
  int64_t first_sample = 0;
  Hooks* hooks = nullptr;  // not owned; null: no callbacks

  void grad_ready(Param* p) {
    if (hooks && hooks->grad_ready) hooks->grad_ready(p);
  }
  void pre_forward(const Module* m) {
    if (hooks && hooks->pre_forward) hooks->pre_forward(m);
  }
  void post_forward(const Module* m) {
    if (hooks && hooks->post_forward) hooks->post_forward(m);
  }
  void pre_backward(const Module* m) {
    if (hooks && hooks->pre_backward) hooks->pre_backward(m);
  }
  void post_backward(const Module* m) {
    if (hooks && hooks->post_backward) hooks->post_backward(m);
  }

  // Saves tensors for module m's backward (shares their storage; no copy).
  void save(const void* m, std::vector<Tensor> tensors);
  // The tensors m saved; throws if m saved nothing (backward without forward).
  std::vector<Tensor>& saved(const void* m);
  // Integer data m saved (token ids).
  std::vector<int32_t>& ints(const void* m) { return ints_[m]; }
  // Drops what m saved (called by m's backward when done).
  void release(const void* m);
  void clear();

  // ---- split backward (zero-bubble schedules) ----
  // While defer_weight_grads is set, layers with weights compute only their input gradient in
  // backward and defer the weight gradient: they hand a closure holding what it needs (their
  // input and output gradient, `bytes` of them, counted as saved) to defer(). run_deferred()
  // later runs every closure in the order deferred (each accumulates its gradients and reports
  // them ready) and drops what they held.
  bool defer_weight_grads = false;
  void defer(std::function<void(Context&)> weight_grad, int64_t bytes);

  // ---- exact gradient sums (train/trainer.h: TrainOptions::exact_sums) ----
  // 0: layers compute over all their rows at once and add parameter gradients into Param::grad.
  // k > 0: the rows of every batch this context sees are k equal slices (whole samples); the
  // layers with parameters run their kernels slice by slice and add each slice's parameter
  // gradient (a float32 result of the same call at every layout) into Param::grad_exact, in
  // float64. Whoever syncs gradients rounds the total into Param::grad.
  int grad_slices = 0;

  // ---- kernel spans (the trace's kernels track) ----
  // When set, layers report the time of their library kernels (convolutions) through it: a
  // name ("conv2d forward") and the call's start and end. KernelSpan reports its lifetime.
  using Clock = std::chrono::steady_clock;
  std::function<void(const char* name, Clock::time_point t0, Clock::time_point t1)> kernel_span;
  void run_deferred();
  bool has_deferred() const { return !deferred_.empty(); }

  // Bytes of saved activations held now, and the most held at once since construction.
  int64_t saved_bytes() const { return bytes_; }
  int64_t peak_saved_bytes() const { return peak_bytes_; }

 private:
  std::unordered_map<const void*, std::vector<Tensor>> saved_;
  std::unordered_map<const void*, std::vector<int32_t>> ints_;
  std::vector<std::pair<std::function<void(Context&)>, int64_t>> deferred_;
  int64_t bytes_ = 0;
  int64_t peak_bytes_ = 0;
};

// Reports [construction, destruction) to ctx.kernel_span, if set, under `name` (a literal).
class KernelSpan {
 public:
  KernelSpan(const Context& ctx, const char* name)
      : ctx_(ctx), name_(name), t0_(ctx.kernel_span ? Context::Clock::now() : Context::Clock::time_point{}) {}
  ~KernelSpan() {
    if (ctx_.kernel_span) ctx_.kernel_span(name_, t0_, Context::Clock::now());
  }
  KernelSpan(const KernelSpan&) = delete;
  KernelSpan& operator=(const KernelSpan&) = delete;

 private:
  const Context& ctx_;
  const char* name_;
  Context::Clock::time_point t0_;
};

}  // namespace meshtrain::nn
