// Small element-wise helpers on flat arrays.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

// out = a + b
void add(float* out, const float* a, const float* b, int64_t n, int threads);
// y += x
void accumulate(float* y, const float* x, int64_t n, int threads);
// x *= s
void scale(float* x, float s, int64_t n, int threads);

}  // namespace meshtrain::kernels
