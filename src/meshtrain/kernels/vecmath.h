// Internal to kernels/: branch-free float math that GCC vectorises inside `#pragma omp simd`
// loops (std::exp / std::tanh are library calls and block vectorisation without -ffast-math).
// Limits: exp_approx has ~2 ulp error on [-87, 88] and clamps outside that range (so it never
// returns 0 or inf; callers that need an exact 0, e.g. causal masks, must not call it there).
// NaN inputs propagate.
#pragma once

#include <bit>
#include <cstdint>

namespace meshtrain::kernels::detail {

// ---- exp ----
// Cephes expf: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n by bits.
#pragma omp declare simd notinbranch
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(e);
}

// ---- tanh ----
// tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error ~1e-7 (relative error grows near 0, which
// is harmless where it is used: gelu adds 1 to it).
#pragma omp declare simd notinbranch
inline float tanh_approx(float u) { return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f); }

}  // namespace meshtrain::kernels::detail
