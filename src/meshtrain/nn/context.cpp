#include "meshtrain/nn/context.h"

#include "meshtrain/nn/param.h"

#include <algorithm>
#include <stdexcept>

namespace meshtrain::nn {

void Context::save(const void* m, std::vector<Tensor> tensors) {
  if (!training) return;
  auto& slot = saved_[m];
  for (auto& t : slot) bytes_ -= t.bytes();
  for (auto& t : tensors) bytes_ += t.bytes();
  slot = std::move(tensors);
  peak_bytes_ = std::max(peak_bytes_, bytes_);
}

std::vector<Tensor>& Context::saved(const void* m) {
  auto it = saved_.find(m);
  if (it == saved_.end())
    throw std::logic_error("backward of a module whose forward saved nothing in this context "
                           "(forward in evaluation mode, or backward called twice)");
  return it->second;
}

void Context::release(const void* m) {
  auto it = saved_.find(m);
  if (it != saved_.end()) {
    for (auto& t : it->second) bytes_ -= t.bytes();
    saved_.erase(it);
  }
  ints_.erase(m);
}

void Context::clear() {
  saved_.clear();
  ints_.clear();
  deferred_.clear();
  bytes_ = 0;
}

void Context::defer(std::function<void(Context&)> weight_grad, int64_t bytes) {
  deferred_.emplace_back(std::move(weight_grad), bytes);
  bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, bytes_);
}

void Context::run_deferred() {
  auto work = std::move(deferred_);
  deferred_.clear();
  for (auto& [fn, bytes] : work) {
    fn(*this);
    bytes_ -= bytes;
  }
}

kernels::GemmOptions Context::gemm_with(const Param& w) const {
  kernels::GemmOptions o{threads, precision};
  if (precision == kernels::Precision::bf16) o.b16 = w.bf16_value(weights_epoch, threads);
  return o;
}

}  // namespace meshtrain::nn
