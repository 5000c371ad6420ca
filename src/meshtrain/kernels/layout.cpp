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

namespace {
// Copies between NCHW and layout `block`, into the layout when `into` (else out of it).
void convert(float* out, const float* inp, int64_t N, int64_t C, int64_t HW, int block, bool into, const char* who) {
  check_activation_block(block, C, who);
  if (block == 0) {
    std::memcpy(out, inp, static_cast<size_t>(N * C * HW) * sizeof(float));
    return;
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t plain = (n * C + c) * HW + i, laid = activation_offset(n, c, i, C, HW, block);
        out[into ? laid : plain] = inp[into ? plain : laid];
      }
}
}  // namespace

void to_activation_layout(float* out, const float* nchw, int64_t N, int64_t C, int64_t HW, int block) {
  convert(out, nchw, N, C, HW, block, /*into=*/true, "to_activation_layout");
}

void from_activation_layout(float* nchw, const float* inp, int64_t N, int64_t C, int64_t HW, int block) {
  convert(nchw, inp, N, C, HW, block, /*into=*/false, "from_activation_layout");
}

}  // namespace meshtrain::kernels
