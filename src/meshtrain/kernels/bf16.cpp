// bf16 conversions and the report of what runs bf16 products (kernels/bf16.h).
#include "meshtrain/kernels/bf16.h"

#include <stdexcept>

namespace meshtrain::kernels {

const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision parse_precision(const std::string& s) {
  if (s == "fp32" || s == "f32" || s == "float32") return Precision::f32;
  if (s == "bf16" || s == "bfloat16") return Precision::bf16;
  throw std::invalid_argument("unknown precision '" + s + "': use fp32 or bf16");
}

void to_bf16(const float* in, bf16_t* out, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

void from_bf16(const bf16_t* in, float* out, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = from_bf16(in[i]);
}

void round_bf16(float* x, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace meshtrain::kernels
