#include "meshtrain/train/weight_versions.h"

#include <algorithm>
#include <utility>

namespace meshtrain::train {

WeightVersions::WeightVersions(std::vector<nn::Param*> params, bool exact_sums)
    : params_(std::move(params)), exact_(exact_sums) {
  for (nn::Param* p : params_) {
    stash_.push_back(p->value.clone());
    ready_.push_back(Tensor::zeros(p->grad.shape()));
  }
}

// A bf16 copy of the values (--precision bf16) belongs to the version it was made from: dropped
// at each swap, so the products make it again from the version now in place.
void WeightVersions::swap_stash() {
  for (size_t i = 0; i < params_.size(); ++i) {
    std::swap(params_[i]->value, stash_[i]);
    params_[i]->drop_bf16();
  }
}

void WeightVersions::start_step(int64_t step) {
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Param& p = *params_[i];
    if (exact_) {
      std::transform(p.grad_exact.begin(), p.grad_exact.end(), ready_[i].data(),
                     [](double g) { return static_cast<float>(g); });
      std::fill(p.grad_exact.begin(), p.grad_exact.end(), 0.0);
    } else {
      std::swap(p.grad, ready_[i]);
      p.grad.zero();
    }
  }
  ready_step_ = grad_step_;
  grad_step_ = step;
}

void WeightVersions::keep_current() {
  for (size_t i = 0; i < params_.size(); ++i)
    std::copy_n(params_[i]->value.data(), params_[i]->value.numel(), stash_[i].data());
}

void WeightVersions::swap_ready() {
  for (size_t i = 0; i < params_.size(); ++i) std::swap(params_[i]->grad, ready_[i]);
}

int64_t WeightVersions::bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < params_.size(); ++i) b += stash_[i].bytes() + ready_[i].bytes();
  return b;
}

}  // namespace meshtrain::train
