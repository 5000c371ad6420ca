// The optimizers of the training loop (--optimizer adamw|sgd|lamb) over a set of Params, with
// what they share: the learning-rate schedule (linear warm-up, then cosine decay to a floor as
// nanoGPT does, or step decay as SGD's classical recipe does), clipping by the global gradient
// norm, and "a non-finite norm applies nothing".
//
//   AdamW  (Loshchilov & Hutter): decoupled weight decay; state exp_avg, exp_avg_sq.
//   SGD    (torch.optim.SGD, dampening 0): momentum, optional Nesterov, L2 weight decay added
//          to the gradient (as PyTorch does, not decoupled); state momentum_buffer (none at
//          momentum 0).
//   LAMB   (You et al. 2019, Algorithm 2): Adam's moments with bias correction, the decay in
//          the update u = m_hat / (sqrt(v_hat) + eps) + wd p, and per parameter tensor the trust
//          ratio ||p|| / ||u|| (1 where either norm is 0) scaling lr; state exp_avg, exp_avg_sq.
//          The ratio applies to the weights that decay (2-D matrices); biases and norms keep
//          ratio 1, as BERT's LAMB and NVIDIA's FusedLAMB exclude them from layer adaptation.
// Weight decay applies to the parameters whose `decay` flag is set (not biases or norms).
//
// An optimizer works on whatever part of each parameter this rank holds (the whole tensor, a
// tensor-parallel shard, or a ZeRO slice): its state tensors have the same size. What must be
// layout-invariant goes through hooks the caller fills (DESIGN decision 1):
//   - the global gradient norm: step()'s `norm_reduce`, or step_with_grad_sq() given the
//     global sum of squares;
//   - LAMB's per-tensor norms: set_param_sq_reduce(), which maps per-parameter local sums of
//     squares to the sums over the whole logical tensors (train/trainer.cpp reduces them over
//     the dp group under ZeRO and over tp for split parameters).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/nn/param.h"

namespace meshtrain::train {

enum class OptimizerKind { adamw, sgd, lamb };
enum class LrSchedule { cosine, step };

std::string to_string(OptimizerKind k);
std::string to_string(LrSchedule s);
// Parse the flag values; throw std::invalid_argument with a sentence naming the flag.
OptimizerKind parse_optimizer(const std::string& name);
LrSchedule parse_lr_schedule(const std::string& name);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  // ---- the learning-rate schedule (every optimizer) ----
  float lr = 1e-3f;
  float min_lr = 1e-4f;      // cosine: the floor
  int64_t warmup_steps = 100;
  int64_t decay_steps = 0;   // cosine: reaches min_lr here (0: the run's total steps)
  LrSchedule schedule = LrSchedule::cosine;
  int64_t step_every = 0;    // step: lr is multiplied by step_gamma every step_every steps (>= 1)
  float step_gamma = 0.1f;
  // ---- every optimizer ----
  std::optional<float> weight_decay = std::nullopt;  // unset: the optimizer's default (default_weight_decay)
  float grad_clip = 1.0f;              // <= 0: no clipping
  // ---- AdamW and LAMB ----
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float eps = 1e-8f;
  // ---- SGD ----
  float momentum = 0.9f;  // 0: plain SGD, no state
  bool nesterov = false;
};

// AdamW 0.1 (nanoGPT), LAMB 0.01 (You et al.'s BERT runs), SGD 0 (PyTorch's default).
float default_weight_decay(OptimizerKind k);
inline float weight_decay_of(const OptimizerConfig& c) { return c.weight_decay.value_or(default_weight_decay(c.kind)); }

// Learning rate at 0-based `step`: linear warm-up over warmup_steps, then
//   cosine: cosine from lr to min_lr at decay_steps, min_lr after;
//   step:   lr * step_gamma ^ floor(step / step_every) (steps counted from the run's start, as
//           PyTorch's StepLR after a warm-up counts them).
float lr_at(const OptimizerConfig& c, int64_t step);

// One line for the run's header: "optimizer sgd (momentum 0.9, Nesterov) | weight decay 0 (L2) |
// lr 0.1, 5 warm-up steps, then x0.1 every 30 steps | clip 1".
std::string describe(const OptimizerConfig& c);

// The state an optimizer of `c` keeps per parameter, by checkpoint name prefix (a piece of
// prefix P of parameter N is named "P.N"), in the order Optimizer::state() lists them.
std::vector<std::string> state_prefixes(const OptimizerConfig& c);

// Per-parameter sums of squares: `sq` holds `per_param` values for each parameter the
// optimizer holds, in its order (sq[i * per_param + j]); the hook replaces each local sum with
// the sum over the whole logical tensor. Every rank of a group calls it at the same point.
using ParamSqReduce = std::function<void(std::span<double> sq, size_t per_param)>;

class Optimizer {
 public:
  // One state tensor per parameter, shaped like its value, under a checkpoint name prefix.
  struct StateSlot {
    std::string prefix;
    std::vector<Tensor> tensors;  // tensors[i] belongs to params()[i]
  };

  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Sum of squares of the local gradients (double).
  double local_grad_sq() const;
  // One update at 0-based `step`; returns the global gradient norm before clipping.
  // `norm_reduce` maps the local sum of squares to the global one (identity if empty).
  // When that norm is not finite (NaN or inf) nothing is applied: weights, state and the
  // update count stay as they were, and the caller sees the norm.
  double step(int64_t step, const std::function<double(double)>& norm_reduce = {});
  // The same with the global sum of squares computed by the caller (no local pass here).
  double step_with_grad_sq(int64_t step, double global_sq);
  // The reduction of per-parameter sums of squares (identity until set); LAMB calls it once a
  // step, the others never.
  void set_param_sq_reduce(ParamSqReduce f) { param_sq_reduce_ = std::move(f); }

  // ---- state, for checkpoints ----
  const std::vector<StateSlot>& state() const { return state_; }
  std::vector<StateSlot>& state() { return state_; }  // a restore reads into the tensors in place
  // Every state tensor as "prefix.<param name>" (local parts).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors);
  int64_t updates() const { return t_; }
  void set_updates(int64_t t) { t_ = t; }

  const std::vector<nn::Param*>& params() const { return params_; }
  const OptimizerConfig& config() const { return cfg_; }
  int64_t state_bytes() const;

 protected:
  // `cfg.kind` names the optimizer (its state comes from state_prefixes(cfg)).
  Optimizer(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads);
  // The update itself, after the clipping scale is known and t_ counts it (1-based).
  virtual void apply(int64_t step, float lr, float grad_scale) = 0;
  // Where the update of p may write the next step's bf16 copy of its value (null: nowhere),
  // and marking it written (as AdamW did alone before).
  static uint16_t* bf16_target(nn::Param* p, int64_t step);
  static void bf16_written(nn::Param* p, int64_t step);

  std::vector<nn::Param*> params_;
  OptimizerConfig cfg_;
  int threads_;
  int64_t t_ = 0;  // updates applied so far
  ParamSqReduce param_sq_reduce_;

 private:
  std::vector<StateSlot> state_;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads);
  std::vector<Tensor>& exp_avg() { return state()[0].tensors; }
  std::vector<Tensor>& exp_avg_sq() { return state()[1].tensors; }

 private:
  void apply(int64_t step, float lr, float grad_scale) override;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads);

 private:
  void apply(int64_t step, float lr, float grad_scale) override;
};

class LAMB : public Optimizer {
 public:
  LAMB(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads);
  // The trust ratios of the last update, per parameter (1 for those not adapted).
  const std::vector<double>& trust_ratios() const { return ratios_; }

 private:
  void apply(int64_t step, float lr, float grad_scale) override;
  std::vector<double> ratios_;
};

// The optimizer `cfg.kind` names.
std::unique_ptr<Optimizer> make_optimizer(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads);

}  // namespace meshtrain::train
