#include "meshtrain/kernels/concat.h"

#include <cstring>
#include <stdexcept>
#include <vector>

namespace meshtrain::kernels {

namespace {

constexpr int64_t kParallelMin = 1 << 16;  // elements

// Channel offset of each part in the concatenation; `total` gets the sum.
std::vector<int64_t> offsets(std::span<const int64_t> channels, size_t parts, int64_t& total) {
  if (parts != channels.size()) throw std::invalid_argument("concat_channels: one channel count per part");
  std::vector<int64_t> off(channels.size());
  total = 0;
  for (size_t i = 0; i < channels.size(); ++i) {
    if (channels[i] < 0) throw std::invalid_argument("concat_channels: negative channel count");
    off[i] = total;
    total += channels[i];
  }
  return off;
}

}  // namespace

// ---- forward ----
void concat_channels_forward(float* out, std::span<const float* const> inputs, std::span<const int64_t> channels,
                             int64_t N, int64_t HW, int threads) {
  int64_t total = 0;
  const std::vector<int64_t> off = offsets(channels, inputs.size(), total);
  const int64_t P = static_cast<int64_t>(inputs.size());
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && N * total * HW > kParallelMin)
  for (int64_t r = 0; r < N * P; ++r) {  // run r: sample n, part i
    const int64_t n = r / P, i = r % P;
    if (channels[i] == 0) continue;  // an empty part may have no storage at all
    std::memcpy(out + (n * total + off[i]) * HW, inputs[i] + n * channels[i] * HW,
                static_cast<size_t>(channels[i] * HW) * sizeof(float));
  }
}

// ---- backward ----
void concat_channels_backward(std::span<float* const> dinputs, const float* dout, std::span<const int64_t> channels,
                              int64_t N, int64_t HW, int threads) {
  int64_t total = 0;
  const std::vector<int64_t> off = offsets(channels, dinputs.size(), total);
  const int64_t P = static_cast<int64_t>(dinputs.size());
#pragma omp parallel for num_threads(threads) if (parallel : threads > 1 && N * total * HW > kParallelMin)
  for (int64_t r = 0; r < N * P; ++r) {
    const int64_t n = r / P, i = r % P;
    if (!dinputs[i] || channels[i] == 0) continue;
    std::memcpy(dinputs[i] + n * channels[i] * HW, dout + (n * total + off[i]) * HW,
                static_cast<size_t>(channels[i] * HW) * sizeof(float));
  }
}

}  // namespace meshtrain::kernels
