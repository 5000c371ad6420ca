// Param: one trainable tensor with its name, gradient and shard spec (DESIGN decision 6).
// `value` and `grad` hold this rank's local part; `global_shape` is the full logical tensor the
// checkpoint stores under `name`. The shard spec says where the local part sits in the global
// tensor, and initialisation draws each local element from the counter-based RNG at its
// *global* index, so a shard holds exactly what the full tensor holds there (decision 1).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {

// How a parameter is laid out over the tensor-parallel axis: on every tp rank whole and equal
// (replicated), cut along a dimension (split), or whole on one tp rank only, the others not
// holding it at all (owned: an Inception branch under --branch-parallel, parallel/branch/cnn_branch.h).
struct ShardSpec {
  enum class Kind { kReplicated, kSplit, kOwned };
  Kind kind = Kind::kReplicated;
  int dim = 0;     // the dimension split over tp (kSplit)
  int groups = 1;  // that dimension is `groups` equal parts, each split over tp separately
                   // (the fused qkv projection is [q | k | v]: groups = 3, so a rank holds its
                   // heads' columns of each of q, k and v)
  int rank = 0;    // this rank's index on the tp axis (kOwned: the owner's, which is this rank's)
  int size = 1;    // the tp axis size
  bool padded = false;  // (groups 1) dim need not divide: every rank holds ceil(D / size) rows,
                        // rank r rows [r ceil(D/size), ...) of which those at D and beyond are
                        // padding (zero, never part of the full tensor)

  static ShardSpec replicated() { return {}; }
  static ShardSpec split(int dim, int rank, int size, int groups = 1) {
    return {Kind::kSplit, dim, groups, rank, size};
  }
  static ShardSpec split_padded(int dim, int rank, int size) {
    return {Kind::kSplit, dim, 1, rank, size, true};
  }
  // Owned by tp rank `owner` of `size`: the whole tensor, held by that rank alone.
  static ShardSpec owned(int owner, int size) { return {Kind::kOwned, 0, 1, owner, size}; }
  bool is_split() const { return kind == Kind::kSplit && size > 1; }
  bool is_owned() const { return kind == Kind::kOwned; }
  // Whether tp rank `tp_rank`, holding this parameter, is the one that counts its elements (the
  // gradient norm, LAMB's per-parameter norms) and writes them to checkpoints: every rank its
  // part of a split one, the owner an owned one, tp rank 0 a replicated one. Owned and
  // replicated tensors are whole (local shape = global shape; a checkpoint piece of either
  // carries no tp spec).
  bool counted_on(int tp_rank) const { return is_split() || is_owned() || tp_rank == 0; }
  // Local shape of a tensor whose global shape is `global`; throws if it does not divide (and
  // the spec is not padded).
  Shape local_shape(const Shape& global) const;
  // Global flat index of local flat index `i` (row-major both) for a tensor of global shape;
  // -1 for a padding element.
  int64_t global_index(const Shape& global, int64_t i) const;
  // Rows of `dim` this rank holds that are real (not padding): local rows minus padding.
  int64_t real_rows(const Shape& global) const;
  // The local flat range [begin, end) as runs contiguous in both the local and the global tensor:
  // fn(local_index, global_index, count) for each, in increasing order of both indices; padding
  // is skipped. Viewing the tensor as (outer, D, inner) with D = groups * part_global, rank r's
  // part of group g is rows g * part_global + r * part_local + [0, part_local) of D, so each
  // local block of part_local * inner elements is one run. Checkpoints (gathering, cutting,
  // reading pieces saved at another tp) all map through this one function.
  void for_each_run(const Shape& global, int64_t begin, int64_t end,
                    const std::function<void(int64_t local, int64_t global, int64_t n)>& fn) const;
  std::string str() const;  // "replicated", "split(dim=1, groups=3, 2/4)" or "owned(1/2)"
};

struct Param {
  std::string name;
  Shape global_shape;
  ShardSpec shard;
  bool decay = true;  // AdamW weight decay applies (2-D weights); off for biases and norms
  Tensor value;       // local part
  Tensor grad;        // same shape as value; accumulates (+=) over backward calls
  // bf16 copy of `value` for one step's products (--precision bf16): made at its first use in
  // a step and reused by every later product and micro-batch of that step (Context::
  // weights_epoch names the step); ZeRO-3 drops it with the gathered values.
  // A cache of `value`, so a const Param can fill it.
  mutable std::vector<uint16_t> value_bf16;
  mutable int64_t bf16_epoch = -1;
  // The copy for `epoch` (converting `value` if it was made for another); null if epoch < 0.
  const uint16_t* bf16_value(int64_t epoch, int threads) const;
  void drop_bf16() const;

  Param() = default;
  Param(std::string name, Shape global_shape, ShardSpec shard = {}, bool decay = true);
  // A buffer: state saved with the model but not trained (batch norm's running statistics). Its
  // grad is empty; modules list it through collect_buffers, never collect_params (nn/module.h).
  static Param buffer(std::string name, Shape global_shape, ShardSpec shard = {});
  bool is_buffer() const { return grad.numel() == 0 && value.numel() > 0; }
  int64_t numel() const { return value.numel(); }
  // The local part's shape and size from the spec (valid even while ZeRO-3 has released the
  // value).
  Shape local_shape() const { return shard.local_shape(global_shape); }
  int64_t local_numel() const { return shape_numel(local_shape()); }
  void zero_grad() { grad.zero(); }

  // Exact gradient sums (Context::grad_slices): while not empty (local_numel() values), layers
  // add their gradient contributions here in float64 instead of into `grad`; a sum of float32
  // slice results in float64 does not depend on the order of its terms (short of an exponent
  // spread of 29 bits), so the total is the same however a layout groups the slices.
  std::vector<double> grad_exact;
  void add_exact(const float* g);   // grad_exact += g (local_numel() values)
  void add_exact(const double* g);
};

// Runs f(first_row, rows) for each of the k equal slices of n rows (k <= 1: once, all of them).
// Throws std::invalid_argument when k does not divide n.
void for_row_slices(int64_t n, int k, const std::function<void(int64_t, int64_t)>& f);

// ---- initialisation (layout-invariant) ----
// value[i] = std * N(0,1) drawn from stream (seed, name) at the element's global index.
void init_normal(Param& p, uint64_t seed, float std);
// value[i] = lo + (hi - lo) * U[0,1) drawn from stream (seed, name) at the element's global index.
void init_uniform(Param& p, uint64_t seed, float lo, float hi);
void init_constant(Param& p, float v);

}  // namespace meshtrain::nn
