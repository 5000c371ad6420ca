#include "meshtrain/train/noise_scale.h"

#include <stdexcept>

namespace meshtrain::train {

NoiseEstimate noise_estimate(double sq_small, double sq_big, double b_small, double b_big) {
  if (!(b_small > 0 && b_big > b_small)) throw std::invalid_argument("noise_estimate needs B > b > 0");
  NoiseEstimate e;
  e.grad_sq = (b_big * sq_big - b_small * sq_small) / (b_big - b_small);
  e.trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big);
  return e;
}

double stat_efficiency(double noise_scale, double b0, double b) { return (noise_scale + b0) / (noise_scale + b); }

void GradNoiseScale::update(const NoiseEstimate& e) {
  grad_sq_ = theta_ * grad_sq_ + (1 - theta_) * e.grad_sq;
  trace_ = theta_ * trace_ + (1 - theta_) * e.trace;
  weight_ = theta_ * weight_ + (1 - theta_);
}

std::optional<double> GradNoiseScale::scale() const {
  if (weight_ <= 0 || grad_sq() <= 0 || trace() < 0) return std::nullopt;
  return trace() / grad_sq();
}

}  // namespace meshtrain::train
