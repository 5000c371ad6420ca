// Concatenation of NCHW tensors along channels (DenseNet and Inception blocks), viewed as
// (N, C_i, HW) with one HW for all:
//   forward:  out(N, sum C_i, HW): out(n, off_i + c, :) = inp_i(n, c, :), off_i = C_0 + ... + C_{i-1}
//   backward: dinp_i(N, C_i, HW) = the same slices of dout (written): a split.
// Both copy contiguous runs of C_i * HW floats; the (n, i) runs are split over the `threads`
// budget.
#pragma once

#include <cstdint>
#include <span>

namespace meshtrain::kernels {

// inputs[i] is (N, channels[i], HW) (may be null when channels[i] is 0); a null dinputs[i]
// skips that part in backward.
void concat_channels_forward(float* out, std::span<const float* const> inputs, std::span<const int64_t> channels,
                             int64_t N, int64_t HW, int threads);
void concat_channels_backward(std::span<float* const> dinputs, const float* dout, std::span<const int64_t> channels,
                              int64_t N, int64_t HW, int threads);

}  // namespace meshtrain::kernels
