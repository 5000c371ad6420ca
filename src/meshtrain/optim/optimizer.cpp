#include "meshtrain/optim/optimizer.h"

#include <cmath>
#include <sstream>
#include <map>
#include <stdexcept>

#include "meshtrain/kernels/adamw.h"
#include "meshtrain/kernels/lamb.h"
#include "meshtrain/kernels/sgd.h"

namespace meshtrain::train {

// ---- names ----

std::string to_string(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::lamb: return "lamb";
  }
  return "?";
}

std::string to_string(LrSchedule s) { return s == LrSchedule::cosine ? "cosine" : "step"; }

OptimizerKind parse_optimizer(const std::string& name) {
  for (OptimizerKind k : {OptimizerKind::adamw, OptimizerKind::sgd, OptimizerKind::lamb})
    if (name == to_string(k)) return k;
  throw std::invalid_argument("--optimizer must be adamw, sgd or lamb, not '" + name + "'");
}

LrSchedule parse_lr_schedule(const std::string& name) {
  if (name == "cosine") return LrSchedule::cosine;
  if (name == "step") return LrSchedule::step;
  throw std::invalid_argument("--lr-schedule must be cosine or step, not '" + name + "'");
}

float default_weight_decay(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw: return 0.1f;
    case OptimizerKind::lamb: return 0.01f;
    case OptimizerKind::sgd: return 0.0f;
  }
  return 0.0f;
}

// ---- the schedule ----

float lr_at(const OptimizerConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<float>(step + 1) / static_cast<float>(c.warmup_steps);
  if (c.schedule == LrSchedule::step) {
    const int64_t every = c.step_every > 0 ? c.step_every : 1;
    return static_cast<float>(c.lr * std::pow(static_cast<double>(c.step_gamma), static_cast<double>(step / every)));
  }
  if (step >= c.decay_steps) return c.min_lr;
  double ratio = static_cast<double>(step - c.warmup_steps) /
                 static_cast<double>(c.decay_steps - c.warmup_steps);
  double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(c.min_lr + coeff * (c.lr - c.min_lr));
}

std::string describe(const OptimizerConfig& c) {
  std::ostringstream s;
  s << "optimizer " << to_string(c.kind);
  if (c.kind == OptimizerKind::sgd) {
    if (c.momentum == 0) s << " (no momentum)";
    else s << " (momentum " << c.momentum << (c.nesterov ? ", Nesterov)" : ")");
  } else {
    s << " (beta1 " << c.beta1 << ", beta2 " << c.beta2 << ", eps " << c.eps
      << (c.kind == OptimizerKind::lamb ? ", trust ratio per weight tensor)" : ")");
  }
  s << " | weight decay " << weight_decay_of(c) << (c.kind == OptimizerKind::sgd ? " (L2)" : " (decoupled)");
  s << " | lr " << c.lr << ", " << c.warmup_steps << " warm-up steps";
  // A warm-up longer than the run: say where the rate stops, since it never reaches --lr.
  if (c.decay_steps > 0 && c.warmup_steps > c.decay_steps)
    s << " (NOTE: more than the run's " << c.decay_steps << " steps, so the rate ends at " << lr_at(c, c.decay_steps - 1)
      << " and never reaches " << c.lr << "; lower --warmup to use --lr)";
  s << ", then ";
  if (c.schedule == LrSchedule::step)
    s << "x" << c.step_gamma << " every " << c.step_every << " steps";
  else
    s << "cosine to " << c.min_lr << " at step " << c.decay_steps;
  s << " | gradient clip ";
  if (c.grad_clip > 0) s << c.grad_clip;
  else s << "off";
  return s.str();
}

std::vector<std::string> state_prefixes(const OptimizerConfig& c) {
  switch (c.kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::lamb: return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::sgd:
      if (c.momentum == 0.0f) return {};
      return {"momentum_buffer"};
  }
  return {};
}

// ---- the shared part ----

Optimizer::Optimizer(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads)
    : params_(std::move(params)), cfg_(cfg), threads_(threads) {
  for (const std::string& prefix : state_prefixes(cfg_)) {
    StateSlot slot{prefix, {}};
    for (auto* p : params_) slot.tensors.emplace_back(p->value.shape());
    state_.push_back(std::move(slot));
  }
}

double Optimizer::local_grad_sq() const {
  double s = 0;
  for (auto* p : params_) s += kernels::sum_squares(p->grad.data(), p->grad.numel(), threads_);
  return s;
}

double Optimizer::step(int64_t step, const std::function<double(double)>& norm_reduce) {
  double sq = local_grad_sq();
  if (norm_reduce) sq = norm_reduce(sq);
  return step_with_grad_sq(step, sq);
}

double Optimizer::step_with_grad_sq(int64_t step, double sq) {
  double norm = std::sqrt(sq);
  // A non-finite norm means a gradient overflowed or is NaN: apply nothing (no state, no
  // weight, no update count changes) and let the caller stop the run on the returned norm.
  if (!std::isfinite(norm)) return norm;
  float scale = 1.f;
  if (cfg_.grad_clip > 0 && norm > cfg_.grad_clip) scale = static_cast<float>(cfg_.grad_clip / norm);
  ++t_;
  apply(step, lr_at(cfg_, step), scale);
  return norm;
}

// A weight whose bf16 copy the products read in this step (--precision bf16, the optimizer
// updating the whole tensor the layers use) gets the next step's copy in the same pass.
uint16_t* Optimizer::bf16_target(nn::Param* p, int64_t step) {
  const bool copy = p->bf16_epoch == step && p->value_bf16.size() == static_cast<size_t>(p->value.numel());
  return copy ? p->value_bf16.data() : nullptr;
}

void Optimizer::bf16_written(nn::Param* p, int64_t step) { p->bf16_epoch = step + 1; }

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i)
    for (const StateSlot& s : state_) out.emplace_back(s.prefix + "." + params_[i]->name, s.tensors[i]);
  return out;
}

void Optimizer::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::map<std::string, const Tensor*> by_name;
  for (auto& [n, t] : tensors) by_name[n] = &t;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (StateSlot& s : state_) {
      Tensor& dst = s.tensors[i];
      const std::string name = s.prefix + "." + params_[i]->name;
      auto it = by_name.find(name);
      if (it == by_name.end()) throw std::runtime_error("optimizer state lacks " + name);
      if (it->second->shape() != dst.shape())
        throw std::runtime_error("optimizer state " + name + " has shape " + shape_str(it->second->shape()) +
                                 ", expected " + shape_str(dst.shape()));
      dst.copy_from(*it->second);
    }
  }
}

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const StateSlot& s : state_)
    for (const Tensor& t : s.tensors) b += t.bytes();
  return b;
}

namespace {
OptimizerConfig with_kind(OptimizerConfig c, OptimizerKind k) {
  c.kind = k;
  return c;
}
}  // namespace

// ---- AdamW ----

AdamW::AdamW(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads)
    : Optimizer(std::move(params), with_kind(cfg, OptimizerKind::adamw), threads) {}

void AdamW::apply(int64_t step, float lr, float grad_scale) {
  kernels::AdamWParams ap;
  ap.lr = lr;
  ap.beta1 = cfg_.beta1;
  ap.beta2 = cfg_.beta2;
  ap.eps = cfg_.eps;
  ap.grad_scale = grad_scale;
  ap.step = t_;
  const float wd = weight_decay_of(cfg_);
  std::vector<Tensor>&m = exp_avg(), &v = exp_avg_sq();
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Param* p = params_[i];
    ap.weight_decay = p->decay ? wd : 0.f;
    uint16_t* copy = bf16_target(p, step);
    kernels::adamw_update(p->value.data(), p->grad.data(), m[i].data(), v[i].data(), p->value.numel(), ap, threads_,
                          copy);
    if (copy) bf16_written(p, step);
  }
}

// ---- SGD ----

SGD::SGD(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads)
    : Optimizer(std::move(params), with_kind(cfg, OptimizerKind::sgd), threads) {}

void SGD::apply(int64_t step, float lr, float grad_scale) {
  kernels::SGDParams sp;
  sp.lr = lr;
  sp.momentum = cfg_.momentum;
  sp.nesterov = cfg_.nesterov;
  sp.grad_scale = grad_scale;
  const float wd = weight_decay_of(cfg_);
  const bool momentum = !state().empty();
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Param* p = params_[i];
    sp.weight_decay = p->decay ? wd : 0.f;
    uint16_t* copy = bf16_target(p, step);
    kernels::sgd_update(p->value.data(), p->grad.data(), momentum ? state()[0].tensors[i].data() : nullptr,
                        p->value.numel(), sp, threads_, copy);
    if (copy) bf16_written(p, step);
  }
}

// ---- LAMB ----

LAMB::LAMB(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads)
    : Optimizer(std::move(params), with_kind(cfg, OptimizerKind::lamb), threads), ratios_(params_.size(), 1.0) {}

// Pass 1 over every parameter (moments, local sums of squares), one reduction of the sums to
// whole-tensor norms, pass 2 over every parameter (the update scaled by its trust ratio).
void LAMB::apply(int64_t step, float lr, float grad_scale) {
  kernels::LAMBParams lp;
  lp.beta1 = cfg_.beta1;
  lp.beta2 = cfg_.beta2;
  lp.eps = cfg_.eps;
  lp.grad_scale = grad_scale;
  lp.step = t_;
  const float wd = weight_decay_of(cfg_);
  std::vector<Tensor>&m = state()[0].tensors, &v = state()[1].tensors;
  const size_t n = params_.size();
  std::vector<double> sq(2 * n, 0.0);  // (||p||^2, ||u||^2) per parameter
  for (size_t i = 0; i < n; ++i) {
    nn::Param* p = params_[i];
    lp.weight_decay = p->decay ? wd : 0.f;
    const kernels::LAMBSums s = kernels::lamb_moments(p->value.data(), p->grad.data(), m[i].data(), v[i].data(),
                                                      p->value.numel(), lp, threads_);
    sq[2 * i] = s.param_sq, sq[2 * i + 1] = s.update_sq;
  }
  if (param_sq_reduce_) param_sq_reduce_(sq, 2);
  for (size_t i = 0; i < n; ++i) {
    nn::Param* p = params_[i];
    lp.weight_decay = p->decay ? wd : 0.f;
    const double wn = std::sqrt(sq[2 * i]), un = std::sqrt(sq[2 * i + 1]);
    ratios_[i] = p->decay && wn > 0 && un > 0 ? wn / un : 1.0;
    uint16_t* copy = bf16_target(p, step);
    kernels::lamb_apply(p->value.data(), m[i].data(), v[i].data(), p->value.numel(), lp,
                        static_cast<float>(static_cast<double>(lr) * ratios_[i]), threads_, copy);
    if (copy) bf16_written(p, step);
  }
}

// ---- the factory ----

std::unique_ptr<Optimizer> make_optimizer(std::vector<nn::Param*> params, const OptimizerConfig& cfg, int threads) {
  switch (cfg.kind) {
    case OptimizerKind::adamw: return std::make_unique<AdamW>(std::move(params), cfg, threads);
    case OptimizerKind::sgd: return std::make_unique<SGD>(std::move(params), cfg, threads);
    case OptimizerKind::lamb: return std::make_unique<LAMB>(std::move(params), cfg, threads);
  }
  throw std::invalid_argument("unknown optimizer");
}

}  // namespace meshtrain::train
