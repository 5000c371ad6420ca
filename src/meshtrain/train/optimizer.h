// AdamW over a set of Params, with global gradient-norm clipping, plus the learning-rate
// schedule (linear warm-up, then cosine decay to a floor), nanoGPT's recipe.
//
// The optimizer works on whatever part of each parameter this rank holds (the whole tensor,
// a tensor-parallel shard, or a ZeRO slice): it keeps exp_avg / exp_avg_sq of the same size.
// The gradient norm is global: `norm_reduce` (if set) sums the local sum of squares over the
// ranks that hold distinct parts, so clipping is layout-invariant (DESIGN decision 1).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "meshtrain/nn/param.h"

namespace meshtrain::train {

struct AdamWConfig {
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup_steps = 100;
  int64_t decay_steps = 0;  // cosine reaches min_lr here (0: the run's total steps)
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // <= 0: no clipping
};

// Learning rate at 0-based `step`: linear warm-up over warmup_steps, cosine to min_lr at
// decay_steps, min_lr after.
float lr_at(const AdamWConfig& c, int64_t step);

class AdamW {
 public:
  AdamW(std::vector<nn::Param*> params, const AdamWConfig& cfg, int threads);

  // Sum of squares of the local gradients (double).
  double local_grad_sq() const;
  // One update at 0-based `step`; returns the global gradient norm before clipping.
  // `norm_reduce` maps the local sum of squares to the global one (identity if empty).
  // When that norm is not finite (NaN or inf) nothing is applied: weights, moments and the
  // update count stay as they were, and the caller sees the norm.
  double step(int64_t step, const std::function<double(double)>& norm_reduce = {});
  // The same with the global sum of squares computed by the caller (no local pass here).
  double step_with_grad_sq(int64_t step, double global_sq);

  // State for checkpoints: exp_avg.<name>, exp_avg_sq.<name> (local parts) and the step count.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors);
  // Moments per parameter, in the order of the constructor's params; a checkpoint restore
  // reads into them in place.
  const std::vector<Tensor>& exp_avg() const { return m_; }
  const std::vector<Tensor>& exp_avg_sq() const { return v_; }
  std::vector<Tensor>& exp_avg() { return m_; }
  std::vector<Tensor>& exp_avg_sq() { return v_; }
  int64_t updates() const { return t_; }
  void set_updates(int64_t t) { t_ = t; }

  const AdamWConfig& config() const { return cfg_; }
  int64_t state_bytes() const;

 private:
  std::vector<nn::Param*> params_;
  std::vector<Tensor> m_, v_;
  AdamWConfig cfg_;
  int threads_;
  int64_t t_ = 0;  // updates applied so far
};

}  // namespace meshtrain::train
