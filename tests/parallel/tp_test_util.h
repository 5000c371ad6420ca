// Helpers for the tensor-parallel tests: deterministic random tensors, slices of a full tensor
// as a shard spec lays them out, gathered gradients, and a relative comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/nn/param.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/tensor/rng.h"

namespace tp_test {

using namespace meshtrain;

// N(0, std) values keyed by (seed, name): the same on every rank.
inline Tensor randn(Shape shape, const std::string& name, float std = 1.0f, uint64_t seed = 7) {
  Tensor t = Tensor::empty(std::move(shape));
  fill_normal(t.data(), t.numel(), stream_key(seed, name), 0, std);
  return t;
}

// This rank's part of `full` under `spec` (e.g. split(2, r, p) of a (B, T, C) activation).
inline Tensor shard_of(const Tensor& full, nn::ShardSpec spec) {
  nn::Param tmp("shard", full.shape(), spec);
  parallel::load_full_tensor(tmp, full);
  return tmp.value;
}

// The full gradient of p, gathered over tp (collective).
inline Tensor full_grad(const nn::Param& p, comm::Communicator& tp) {
  return parallel::full_tensor(p, p.grad, tp).clone();
}

inline float max_abs(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t[i]));
  return m;
}

// |a - b| <= rtol * max|b| elementwise (scale-relative, as float round-off of reordered sums is).
inline ::testing::AssertionResult close(const Tensor& a, const Tensor& b, float rtol,
                                        const std::string& what) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure()
           << what << ": shape " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  const float d = max_abs_diff(a, b), s = std::max(max_abs(b), 1e-30f);
  if (d <= rtol * s) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": max |diff| " << d << " > " << rtol << " * max |ref| " << s;
}

}  // namespace tp_test
