#include "meshtrain/nn/param.h"

#include "meshtrain/kernels/bf16.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "meshtrain/tensor/rng.h"

namespace meshtrain::nn {

Shape ShardSpec::local_shape(const Shape& global) const {
  if (!is_split()) return global;
  if (dim < 0 || dim >= static_cast<int>(global.size()))
    throw std::invalid_argument("shard dim " + std::to_string(dim) + " outside shape " +
                                shape_str(global));
  if (padded && groups != 1)
    throw std::invalid_argument("a padded shard spec splits one group only");
  if (padded) {
    Shape s = global;
    s[dim] = (global[dim] + size - 1) / size;
    return s;
  }
  if (global[dim] % (static_cast<int64_t>(groups) * size) != 0)
    throw std::invalid_argument("dimension " + std::to_string(dim) + " of " + shape_str(global) +
                                " (" + std::to_string(groups) + " part(s)) does not split over " +
                                std::to_string(size) + " ranks");
  Shape s = global;
  s[dim] = global[dim] / size;
  return s;
}

int64_t ShardSpec::global_index(const Shape& global, int64_t i) const {
  if (!is_split()) return i;
  // The local shape without allocating (this runs once per element at initialisation).
  int64_t local[8];
  for (size_t d = 0; d < global.size() && d < 8; ++d) local[d] = global[d];
  if (global.size() > 8 || dim < 0 || dim >= static_cast<int>(global.size()))
    throw std::invalid_argument("bad shard spec for shape " + shape_str(global));
  local[dim] = padded ? (global[dim] + size - 1) / size : global[dim] / size;
  // Decompose i into local coordinates (row-major), map the split coordinate, recompose.
  int64_t idx = 0, rem = i;
  int64_t coord[8];
  const int nd = static_cast<int>(global.size());
  for (int d = nd - 1; d >= 0; --d) {
    coord[d] = rem % local[d];
    rem /= local[d];
  }
  int64_t part_local = local[dim] / groups;    // this rank's share of one group
  int64_t part_global = global[dim] / groups;  // one group in the full tensor
  int64_t g = coord[dim] / part_local, within = coord[dim] % part_local;
  coord[dim] = g * part_global + static_cast<int64_t>(rank) * part_local + within;
  if (coord[dim] >= global[dim]) return -1;  // padding (padded specs only)
  for (size_t d = 0; d < global.size(); ++d) idx = idx * global[d] + coord[d];
  return idx;
}

int64_t ShardSpec::real_rows(const Shape& global) const {
  if (!is_split()) return global[dim];
  const int64_t local = local_shape(global)[dim];
  if (!padded) return local;
  return std::clamp<int64_t>(global[dim] - static_cast<int64_t>(rank) * local, 0, local);
}

void ShardSpec::for_each_run(const Shape& global, int64_t begin, int64_t end,
                             const std::function<void(int64_t, int64_t, int64_t)>& fn) const {
  if (begin >= end) return;
  if (!is_split()) return fn(begin, begin, end - begin);
  const Shape local = local_shape(global);
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < global.size(); ++d) inner *= global[d];
  const int64_t part_global = global[dim] / groups, part_local = local[dim] / groups;
  const int64_t real = std::clamp<int64_t>(part_global - static_cast<int64_t>(rank) * part_local, 0, part_local);
  const int64_t block = part_local * inner, real_n = real * inner;
  if (block == 0) return;
  for (int64_t i = begin; i < end;) {
    const int64_t b = i / block, w = i % block, next = std::min(end, (b + 1) * block);
    if (w < real_n) {
      const int64_t o = b / groups, g = b % groups;
      const int64_t row0 = o * groups * part_global + g * part_global + static_cast<int64_t>(rank) * part_local;
      fn(i, row0 * inner + w, std::min(next, b * block + real_n) - i);
    }
    i = next;
  }
}

std::string ShardSpec::str() const {
  if (is_owned()) return "owned(" + std::to_string(rank) + "/" + std::to_string(size) + ")";
  if (!is_split()) return "replicated";
  std::ostringstream os;
  os << "split(dim=" << dim << ", groups=" << groups << ", " << rank << "/" << size
     << (padded ? ", padded" : "") << ")";
  return os.str();
}

Param::Param(std::string n, Shape global, ShardSpec s, bool d)
    : name(std::move(n)), global_shape(std::move(global)), shard(s), decay(d) {
  Shape local = shard.local_shape(global_shape);
  value = Tensor(local);
  grad = Tensor(local);
}

Param Param::buffer(std::string name, Shape global_shape, ShardSpec shard) {
  Param p;
  p.name = std::move(name);
  p.global_shape = std::move(global_shape);
  p.shard = shard;
  p.decay = false;
  p.value = Tensor(p.shard.local_shape(p.global_shape));
  return p;
}

void init_normal(Param& p, uint64_t seed, float std) {
  uint64_t key = stream_key(seed, p.name);
  float* v = p.value.data();
  const int64_t n = p.value.numel();
  if (!p.shard.is_split()) {
    fill_normal(v, n, key, 0, std);
    return;
  }
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = p.shard.global_index(p.global_shape, i);
    v[i] = g < 0 ? 0.f : std * philox_normal(key, static_cast<uint64_t>(g));
  }
}

void init_uniform(Param& p, uint64_t seed, float lo, float hi) {
  const uint64_t key = stream_key(seed, p.name);
  float* v = p.value.data();
  const int64_t n = p.value.numel();
  const float width = hi - lo;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = p.shard.global_index(p.global_shape, i);
    v[i] = g < 0 ? 0.f : lo + width * philox_uniform(key, static_cast<uint64_t>(g));
  }
}

void init_constant(Param& p, float v) { p.value.fill(v); }

// ---- bf16 copy ----
const uint16_t* Param::bf16_value(int64_t epoch, int threads) const {
  if (epoch < 0) return nullptr;
  if (bf16_epoch != epoch || value_bf16.size() != static_cast<size_t>(value.numel())) {
    value_bf16.resize(static_cast<size_t>(value.numel()));
    kernels::to_bf16(value.data(), value_bf16.data(), value.numel(), threads);
    bf16_epoch = epoch;
  }
  return value_bf16.data();
}

void Param::drop_bf16() const {
  value_bf16 = {};
  bf16_epoch = -1;
}

void Param::add_exact(const float* g) {
  for (size_t i = 0; i < grad_exact.size(); ++i) grad_exact[i] += static_cast<double>(g[i]);
}

void Param::add_exact(const double* g) {
  for (size_t i = 0; i < grad_exact.size(); ++i) grad_exact[i] += g[i];
}

void for_row_slices(int64_t n, int k, const std::function<void(int64_t, int64_t)>& f) {
  if (k <= 1) return f(0, n);
  if (n % k != 0)
    throw std::invalid_argument("exact gradient sums: " + std::to_string(n) + " rows do not make " + std::to_string(k) +
                                " equal slices");
  const int64_t rows = n / k;
  for (int i = 0; i < k; ++i) f(i * rows, rows);
}

}  // namespace meshtrain::nn
