// bfloat16: the upper 16 bits of an IEEE float32 (8 exponent bits, 7 stored mantissa bits).
// Conversion rounds to nearest, ties to even (as AVX512-BF16's vcvtneps2bf16 and PyTorch do);
// NaN stays NaN. A product of two bf16 values is exact in float32 (8 + 8 significant bits fit
// in 24), so "bf16 operands with float32 accumulation" loses precision only in the rounding of
// the operands: each operand's relative error is at most 2^-8 (half a unit in the last of its 8 significant bits).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace meshtrain::kernels {

// Precision of the matrix products (GEMMs and attention's products). Everything else (layer
// norm, softmax, GELU, cross-entropy, the optimizer, master weights) is float32 in both.
enum class Precision { f32, bf16 };

const char* to_string(Precision p);  // "fp32" | "bf16"
// "fp32" (or "f32", "float32") | "bf16" (or "bfloat16"); throws std::invalid_argument otherwise.
Precision parse_precision(const std::string& s);

using bf16_t = uint16_t;

inline bf16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<bf16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<bf16_t>(u >> 16);
}

inline float from_bf16(bf16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// x rounded to the nearest bf16 value, as a float.
inline float round_bf16(float x) { return from_bf16(to_bf16(x)); }

// Element-wise conversions of n values (vectorised loops; `threads` splits large arrays).
void to_bf16(const float* in, bf16_t* out, int64_t n, int threads = 1);
void from_bf16(const bf16_t* in, float* out, int64_t n, int threads = 1);
void round_bf16(float* x, int64_t n, int threads = 1);  // in place

// What the bf16 products run on: "avx512_core_amx" (AMX tiles), "avx512_core_bf16"
// (AVX512-BF16 dot products), or "emulated" (bf16-rounded operands through the float32 GEMM:
// the same numbers, no speed-up) where the CPU or the BLAS build has neither.
std::string bf16_isa();
// The sentence to print when bf16 is asked for but only emulated.
std::string bf16_fallback_note();

}  // namespace meshtrain::kernels
