// Element-wise reduction kernels (see reduce.h).
#include "meshtrain/comm/reduce.h"

#include <algorithm>
#include <cstdint>

namespace meshtrain::comm {

// ---- typed loops ----
template <class T>
static void reduce_typed(T* __restrict a, const T* __restrict b, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
      break;
    case ReduceOp::max:
      for (std::size_t i = 0; i < n; ++i) a[i] = a[i] < b[i] ? b[i] : a[i];
      break;
    case ReduceOp::min:
      for (std::size_t i = 0; i < n; ++i) a[i] = b[i] < a[i] ? b[i] : a[i];
      break;
  }
}

void reduce_into(void* inout, const void* in, std::size_t count, DType t, ReduceOp op) {
  switch (t) {
    case DType::f32: reduce_typed(static_cast<float*>(inout), static_cast<const float*>(in), count, op); break;
    case DType::f64: reduce_typed(static_cast<double*>(inout), static_cast<const double*>(in), count, op); break;
    case DType::i64:
      reduce_typed(static_cast<std::int64_t*>(inout), static_cast<const std::int64_t*>(in), count, op);
      break;
  }
}

// ---- average ----
void finish_avg(void* buf, std::size_t count, DType t, ReduceOp op, int p) {
  if (op != ReduceOp::avg || p <= 1) return;
  switch (t) {
    case DType::f32: {
      auto* a = static_cast<float*>(buf);
      const float s = 1.0f / static_cast<float>(p);
      for (std::size_t i = 0; i < count; ++i) a[i] *= s;
      break;
    }
    case DType::f64: {
      auto* a = static_cast<double*>(buf);
      const double s = 1.0 / p;
      for (std::size_t i = 0; i < count; ++i) a[i] *= s;
      break;
    }
    case DType::i64: {
      auto* a = static_cast<std::int64_t*>(buf);
      for (std::size_t i = 0; i < count; ++i) a[i] /= p;
      break;
    }
  }
}

}  // namespace meshtrain::comm
