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

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {


class Context {
 public:
  explicit Context(int threads = 1, bool training = true) : threads(threads), training(training) {}

  int threads;    // kernel thread budget of the rank that owns this context
  bool training;  // false: forward only, nothing is saved

  // Saves tensors for module m's backward (shares their storage; no copy).
  void save(const void* m, std::vector<Tensor> tensors);
  // The tensors m saved; throws if m saved nothing (backward without forward).
  std::vector<Tensor>& saved(const void* m);
  // Integer data m saved (token ids).
  std::vector<int32_t>& ints(const void* m) { return ints_[m]; }
  // Drops what m saved (called by m's backward when done).
  void release(const void* m);
  void clear();

  // Bytes of saved activations held now, and the most held at once since construction.
  int64_t saved_bytes() const { return bytes_; }
  int64_t peak_saved_bytes() const { return peak_bytes_; }

 private:
  std::unordered_map<const void*, std::vector<Tensor>> saved_;
  std::unordered_map<const void*, std::vector<int32_t>> ints_;
  int64_t bytes_ = 0;
  int64_t peak_bytes_ = 0;
};

}  // namespace meshtrain::nn
