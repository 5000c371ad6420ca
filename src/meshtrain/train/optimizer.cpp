#include "meshtrain/train/optimizer.h"

#include <cmath>
#include <map>
#include <stdexcept>

#include "meshtrain/kernels/adamw.h"

namespace meshtrain::train {

float lr_at(const AdamWConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<float>(step + 1) / static_cast<float>(c.warmup_steps);
  if (step >= c.decay_steps) return c.min_lr;
  double ratio = static_cast<double>(step - c.warmup_steps) /
                 static_cast<double>(c.decay_steps - c.warmup_steps);
  double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(c.min_lr + coeff * (c.lr - c.min_lr));
}

AdamW::AdamW(std::vector<nn::Param*> params, const AdamWConfig& cfg, int threads)
    : params_(std::move(params)), cfg_(cfg), threads_(threads) {
  for (auto* p : params_) {
    m_.emplace_back(p->value.shape());
    v_.emplace_back(p->value.shape());
  }
}

double AdamW::local_grad_sq() const {
  double s = 0;
  for (auto* p : params_) s += kernels::sum_squares(p->grad.data(), p->grad.numel(), threads_);
  return s;
}

double AdamW::step(int64_t step, const std::function<double(double)>& norm_reduce) {
  double sq = local_grad_sq();
  if (norm_reduce) sq = norm_reduce(sq);
  return step_with_grad_sq(step, sq);
}

double AdamW::step_with_grad_sq(int64_t step, double sq) {
  double norm = std::sqrt(sq);
  // A non-finite norm means a gradient overflowed or is NaN: apply nothing (no moment, no
  // weight, no update count changes) and let the caller stop the run on the returned norm.
  if (!std::isfinite(norm)) return norm;
  float scale = 1.f;
  if (cfg_.grad_clip > 0 && norm > cfg_.grad_clip) scale = static_cast<float>(cfg_.grad_clip / norm);
  ++t_;
  kernels::AdamWParams ap;
  ap.lr = lr_at(cfg_, step);
  ap.beta1 = cfg_.beta1;
  ap.beta2 = cfg_.beta2;
  ap.eps = cfg_.eps;
  ap.grad_scale = scale;
  ap.step = t_;
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Param* p = params_[i];
    ap.weight_decay = p->decay ? cfg_.weight_decay : 0.f;
    // A weight whose bf16 copy the products read in this step (--precision bf16, the optimizer
    // updating the whole tensor the layers use) gets the next step's copy in the same pass.
    const bool copy = p->bf16_epoch == step && p->value_bf16.size() == static_cast<size_t>(p->value.numel());
    kernels::adamw_update(p->value.data(), p->grad.data(), m_[i].data(), v_[i].data(),
                          p->value.numel(), ap, threads_, copy ? p->value_bf16.data() : nullptr);
    if (copy) p->bf16_epoch = step + 1;
  }
  return norm;
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i]->name, m_[i]);
    out.emplace_back("exp_avg_sq." + params_[i]->name, v_[i]);
  }
  return out;
}

void AdamW::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::map<std::string, const Tensor*> by_name;
  for (auto& [n, t] : tensors) by_name[n] = &t;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [prefix, dst] : {std::pair{"exp_avg.", &m_[i]}, std::pair{"exp_avg_sq.", &v_[i]}}) {
      std::string name = prefix + params_[i]->name;
      auto it = by_name.find(name);
      if (it == by_name.end()) throw std::runtime_error("optimizer state lacks " + name);
      if (it->second->shape() != dst->shape())
        throw std::runtime_error("optimizer state " + name + " has shape " +
                                 shape_str(it->second->shape()) + ", expected " +
                                 shape_str(dst->shape()));
      dst->copy_from(*it->second);
    }
  }
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < m_.size(); ++i) b += m_[i].bytes() + v_[i].bytes();
  return b;
}

}  // namespace meshtrain::train
