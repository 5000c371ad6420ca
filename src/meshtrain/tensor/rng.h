// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11). A value is a pure
// function of (key, counter), so any rank can draw element i of any tensor without drawing
// the elements before it. This is what makes initialisation layout-invariant (DESIGN decision
// 1): parameter element i of tensor "h.0.attn.c_attn.weight" gets the same value whether the
// tensor lives whole on one rank or is split over eight.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace meshtrain {

// One Philox4x32-10 block: four 32-bit outputs for a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, uint64_t key);

// Stable 64-bit hash of a string (FNV-1a), used to key a tensor's stream by its name.
uint64_t hash_name(std::string_view name);

// Key of a named stream under a seed: tensors and data batches each get their own.
uint64_t stream_key(uint64_t seed, std::string_view name);

// Uniform float in [0, 1) for element `index` of the stream `key`.
float philox_uniform(uint64_t key, uint64_t index);
// Standard normal for element `index` of the stream `key` (Box-Muller on one Philox block).
float philox_normal(uint64_t key, uint64_t index);
// Uniform 64-bit integer for element `index` of the stream `key`.
uint64_t philox_u64(uint64_t key, uint64_t index);

// Fills out[0..n) with std * N(0,1) drawn at global indices first, first+1, ...
void fill_normal(float* out, int64_t n, uint64_t key, uint64_t first, float std);

// Fills a (rows, cols) block of a row-major global matrix with `global_cols` columns,
// starting at (row0, col0): out[r * cols + c] = std * normal(key, (row0+r)*global_cols + col0+c).
void fill_normal_block(float* out, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                       int64_t global_cols, uint64_t key, float std);

}  // namespace meshtrain
