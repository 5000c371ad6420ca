// Input shapes that shape-only layers (pooling, flatten, concatenation) keep for backward, as
// int32 values in Context::ints (nn/context.h). Internal to nn/.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/nn/context.h"

namespace meshtrain::nn::detail {

// Appends the rank and the dimensions of `shape` to `out`.
inline void push_shape(std::vector<int32_t>& out, const Shape& shape) {
  out.push_back(static_cast<int32_t>(shape.size()));
  for (int64_t d : shape) {
    if (d > std::numeric_limits<int32_t>::max())
      throw std::invalid_argument("dimension " + std::to_string(d) + " of " + shape_str(shape) + " is too large");
    out.push_back(static_cast<int32_t>(d));
  }
}

// The shape stored at `at` (advanced past it).
inline Shape read_shape(const std::vector<int32_t>& in, size_t& at) {
  if (at >= in.size())
    throw std::logic_error("backward of a module whose forward saved nothing in this context "
                           "(forward in evaluation mode, or backward called twice)");
  Shape s(static_cast<size_t>(in[at++]));
  for (auto& d : s) d = in.at(at++);
  return s;
}

// Forward of a training pass: `key`'s input shape, the one thing its backward needs.
inline void save_input_shape(Context& ctx, const void* key, const Shape& shape) {
  if (!ctx.training) return;
  ctx.ints(key).clear();
  push_shape(ctx.ints(key), shape);
}

// Backward: the shape save_input_shape kept, taken out of the context.
inline Shape take_input_shape(Context& ctx, const void* key) {
  std::vector<int32_t> saved = std::move(ctx.ints(key));
  ctx.release(key);
  size_t at = 0;
  return read_shape(saved, at);
}

}  // namespace meshtrain::nn::detail
