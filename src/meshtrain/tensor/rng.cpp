#include "meshtrain/tensor/rng.h"

#include <cmath>

namespace meshtrain {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, uint64_t key) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t stream_key(uint64_t seed, std::string_view name) {
  // Mix the seed through one Philox block so nearby seeds give unrelated keys.
  auto r = philox4x32({static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), 0x6d657368u,
                       0x7472616eu},
                      hash_name(name));
  return (static_cast<uint64_t>(r[0]) << 32) | r[1];
}

static inline std::array<uint32_t, 4> block(uint64_t key, uint64_t index) {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u}, key);
}

static inline float to_unit(uint32_t x) {  // [0, 1) with 24 bits
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

float philox_uniform(uint64_t key, uint64_t index) { return to_unit(block(key, index)[0]); }

uint64_t philox_u64(uint64_t key, uint64_t index) {
  auto r = block(key, index);
  return (static_cast<uint64_t>(r[0]) << 32) | r[1];
}

float philox_normal(uint64_t key, uint64_t index) {
  auto r = block(key, index);
  // u1 in (0, 1] so the log is finite.
  double u1 = (static_cast<double>(r[0]) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(r[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void fill_normal(float* out, int64_t n, uint64_t key, uint64_t first, float std) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = std * philox_normal(key, first + i);
}

void fill_normal_block(float* out, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                       int64_t global_cols, uint64_t key, float std) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] =
          std * philox_normal(key, static_cast<uint64_t>((row0 + r) * global_cols + col0 + c));
}

}  // namespace meshtrain
