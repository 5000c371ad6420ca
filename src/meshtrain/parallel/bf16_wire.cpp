// bf16 on the wire (bf16_wire.h).
#include "meshtrain/parallel/bf16_wire.h"

#include <algorithm>
#include <stdexcept>

#include "meshtrain/kernels/bf16.h"

namespace meshtrain::parallel {

namespace {
kernels::bf16_t* as_bf16(float* slots) { return reinterpret_cast<kernels::bf16_t*>(slots); }
const kernels::bf16_t* as_bf16(const float* slots) { return reinterpret_cast<const kernels::bf16_t*>(slots); }
}  // namespace

// ---- pieces ----
int64_t bf16_slots(const std::vector<std::size_t>& counts) {
  const int64_t most = static_cast<int64_t>(*std::max_element(counts.begin(), counts.end()));
  return (most + 1) / 2;
}

std::vector<std::size_t> even_counts(int64_t n, int p) {
  std::vector<std::size_t> c;
  for (int q = 0; q < p; ++q) c.push_back(static_cast<std::size_t>(n / p + (q < n % p ? 1 : 0)));
  return c;
}

void pack_bf16_slices(const float* x, const std::vector<std::size_t>& counts, std::vector<float>& packed) {
  const int64_t slots = bf16_slots(counts);
  packed.assign(static_cast<size_t>(slots) * counts.size(), 0.f);
  int64_t off = 0;
  for (size_t q = 0; q < counts.size(); ++q) {
    kernels::to_bf16(x + off, as_bf16(packed.data() + q * slots), static_cast<int64_t>(counts[q]));
    off += static_cast<int64_t>(counts[q]);
  }
}

void sum_bf16_blocks(const std::vector<float>& packed, int p, int64_t slots, int64_t n, float scale, float* out) {
  std::fill(out, out + n, 0.f);
  for (int q = 0; q < p; ++q) {
    const kernels::bf16_t* in = as_bf16(packed.data() + q * slots);
    for (int64_t i = 0; i < n; ++i) out[i] += kernels::from_bf16(in[i]);
  }
  if (scale != 1.0f)
    for (int64_t i = 0; i < n; ++i) out[i] *= scale;
}

void all_gather_bf16(comm::Communicator& c, const float* mine, const std::vector<std::size_t>& counts, float* out) {
  const int64_t slots = bf16_slots(counts);
  std::vector<float> own(static_cast<size_t>(slots), 0.f), all(static_cast<size_t>(slots) * counts.size());
  kernels::to_bf16(mine, as_bf16(own.data()), static_cast<int64_t>(counts[c.rank()]));
  c.all_gather(std::span<const float>(own), std::span<float>(all));
  int64_t off = 0;
  for (size_t q = 0; q < counts.size(); ++q) {
    kernels::from_bf16(as_bf16(all.data() + q * slots), out + off, static_cast<int64_t>(counts[q]));
    off += static_cast<int64_t>(counts[q]);
  }
}

// ---- whole operations ----
namespace {
// The float32 sum of the caller's slice (counts[rank] values) into `mine`.
void reduce_scatter_into(comm::Communicator& c, const float* in, const std::vector<std::size_t>& counts, float scale,
                         std::vector<float>& mine) {
  std::vector<float> out, back;
  pack_bf16_slices(in, counts, out);
  back.resize(out.size());
  c.all_to_all(std::span<const float>(out), std::span<float>(back));
  mine.resize(counts[c.rank()]);
  sum_bf16_blocks(back, c.size(), bf16_slots(counts), static_cast<int64_t>(mine.size()), scale, mine.data());
}
}  // namespace

void all_reduce_bf16(comm::Communicator& c, std::span<float> x, float scale) {
  const auto counts = even_counts(static_cast<int64_t>(x.size()), c.size());
  std::vector<float> mine;
  reduce_scatter_into(c, x.data(), counts, scale, mine);
  all_gather_bf16(c, mine.data(), counts, x.data());
}

void reduce_scatter_bf16(comm::Communicator& c, std::span<const float> in, std::span<float> out) {
  if (in.size() != out.size() * static_cast<size_t>(c.size()))
    throw std::invalid_argument("reduce_scatter_bf16: the input must be p equal slices of the output's size");
  std::vector<float> mine;
  reduce_scatter_into(c, in.data(), std::vector<std::size_t>(c.size(), out.size()), 1.0f, mine);
  std::copy(mine.begin(), mine.end(), out.begin());
}

void all_gather_bf16(comm::Communicator& c, std::span<const float> in, std::span<float> out) {
  if (out.size() != in.size() * static_cast<size_t>(c.size()))
    throw std::invalid_argument("all_gather_bf16: the output must be p slices of the input's size");
  all_gather_bf16(c, in.data(), std::vector<std::size_t>(c.size(), in.size()), out.data());
}

}  // namespace meshtrain::parallel
