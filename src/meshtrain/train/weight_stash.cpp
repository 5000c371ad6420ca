#include "meshtrain/train/weight_stash.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace meshtrain::train {

WeightStash::WeightStash(std::vector<nn::Param*> params, int64_t delay, bool strict)
    : params_(std::move(params)), delay_(delay), strict_(strict) {}

// A bf16 copy of the values (--precision bf16) belongs to the version it was made from: dropped
// at each swap, so the products make it again from the version now in place.
void WeightStash::swap_in(int64_t v) {
  std::vector<Tensor>& kept = stash_.at(v);
  for (size_t i = 0; i < params_.size(); ++i) {
    std::swap(params_[i]->value, kept[i]);
    params_[i]->drop_bf16();
  }
  swapped_ = swapped_ < 0 ? v : -1;
}

void WeightStash::begin_forward(int64_t k) {
  const int64_t v = needed(k);
  if (v != current_) {
    if (strict_)
      throw std::logic_error("pipedream: the forward of micro-batch " + std::to_string(k) + " finds weights version " +
                             std::to_string(current_) + " where the recurrence needs " + std::to_string(v) +
                             " (delay " + std::to_string(delay_) + "); the schedule's order is broken");
    if (!stash_.count(v))
      throw std::logic_error("pipedream: weights version " + std::to_string(v) + " for micro-batch " +
                             std::to_string(k) + " was not kept");
    swap_in(v);
  }
  ++users_[v];
  version_of_[k] = v;
  next_f_ = k + 1;
}

void WeightStash::end_forward(int64_t) {
  if (swapped_ >= 0) swap_in(swapped_);
}

void WeightStash::begin_backward(int64_t k) {
  auto it = version_of_.find(k);
  if (it == version_of_.end())
    throw std::logic_error("pipedream: the backward of micro-batch " + std::to_string(k) + " has no forward in flight");
  if (it->second != current_) swap_in(it->second);
}

void WeightStash::end_backward(int64_t k) {
  if (swapped_ >= 0) swap_in(swapped_);
  const int64_t v = version_of_.at(k);
  version_of_.erase(k);
  if (--users_[v] == 0) users_.erase(v);
}

void WeightStash::begin_update() {
  // The current values are still needed by a micro-batch in flight, or by a later forward (the
  // next forward needs needed(next_f_); later ones newer versions): they go to the stash, the
  // parameters take a copy that the update changes. Moving them (rather than copying into the
  // stash) leaves any tensor a layer saved at its forward pointing at the values it read.
  if (!users_.count(current_) && needed(next_f_) > current_) return;
  std::vector<Tensor> kept;
  kept.reserve(params_.size());
  for (nn::Param* p : params_) {
    Tensor copy = p->value.clone();
    kept.push_back(std::exchange(p->value, std::move(copy)));
    p->drop_bf16();
  }
  stash_[current_] = std::move(kept);
  peak_bytes_ = std::max(peak_bytes_, bytes());
}

void WeightStash::end_update() {
  ++current_;
  // An update per micro-batch: a bf16 copy made before it is of the old values.
  for (nn::Param* p : params_) p->drop_bf16();
  const int64_t oldest = needed(next_f_);
  std::erase_if(stash_, [&](const auto& e) { return e.first < oldest && !users_.count(e.first); });
}

void WeightStash::flush(int64_t next) {
  if (!version_of_.empty())
    throw std::logic_error("pipedream: a flush with " + std::to_string(version_of_.size()) + " micro-batches in flight");
  current_ = k0_ = next_f_ = next;
  stash_.clear();
}

int64_t WeightStash::bytes() const {
  int64_t b = 0;
  for (const auto& [v, values] : stash_)
    for (const Tensor& t : values) b += t.bytes();
  return b;
}

}  // namespace meshtrain::train
