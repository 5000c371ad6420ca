#include "meshtrain/train/weight_versions.h"

#include <algorithm>
#include <utility>

namespace meshtrain::train {

WeightVersions::WeightVersions(std::vector<nn::Param*> params, std::function<void()> finish,
                               std::function<void()> zero, bool views)
    : params_(std::move(params)), finish_(std::move(finish)), zero_(std::move(zero)), views_(views) {
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
  if (grad_step_ >= 0) {  // else nothing accumulated since the start or the last flush
    finish_();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (views_) std::copy_n(params_[i]->grad.data(), params_[i]->grad.numel(), ready_[i].data());
      else std::swap(params_[i]->grad, ready_[i]);
    }
    zero_();
  }
  ready_step_ = grad_step_;
  grad_step_ = step;
}

void WeightVersions::keep_current() {
  for (size_t i = 0; i < params_.size(); ++i)
    std::copy_n(params_[i]->value.data(), params_[i]->value.numel(), stash_[i].data());
}

void WeightVersions::swap_ready() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!views_) {
      std::swap(params_[i]->grad, ready_[i]);
      continue;
    }
    float* g = params_[i]->grad.data();
    std::swap_ranges(g, g + params_[i]->grad.numel(), ready_[i].data());
  }
}

int64_t WeightVersions::bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < params_.size(); ++i) b += stash_[i].bytes() + ready_[i].bytes();
  return b;
}

}  // namespace meshtrain::train
