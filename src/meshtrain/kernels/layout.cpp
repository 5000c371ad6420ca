#include "meshtrain/kernels/layout.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace meshtrain::kernels {

void check_activation_block(int block, int64_t C, const char* who) {
  if (block < 0 || (block > 0 && C % block != 0))
    throw std::invalid_argument(std::string(who) + ": a layout of " + std::to_string(block) +
                                "-channel blocks cannot hold " + std::to_string(C) + " channels");
}

void to_activation_layout(float* out, const float* nchw, int64_t N, int64_t C, int64_t HW, int block) {
  check_activation_block(block, C, "to_activation_layout");
  if (block == 0) {
    std::memcpy(out, nchw, static_cast<size_t>(N * C * HW) * sizeof(float));
    return;
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) out[activation_offset(n, c, i, C, HW, block)] = nchw[(n * C + c) * HW + i];
}

void from_activation_layout(float* nchw, const float* inp, int64_t N, int64_t C, int64_t HW, int block) {
  check_activation_block(block, C, "from_activation_layout");
  if (block == 0) {
    std::memcpy(nchw, inp, static_cast<size_t>(N * C * HW) * sizeof(float));
    return;
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) nchw[(n * C + c) * HW + i] = inp[activation_offset(n, c, i, C, HW, block)];
}

}  // namespace meshtrain::kernels
