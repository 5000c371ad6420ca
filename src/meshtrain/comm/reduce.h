// Element-wise reduction kernels used by every algorithm: inout[i] = op(inout[i], in[i]).
// `avg` reduces as a sum; the algorithm divides once at the end (finish_avg), so every
// algorithm rounds the same way. Loops are written for the compiler to vectorise.
#pragma once

#include <cstddef>

#include "meshtrain/comm/types.h"

namespace meshtrain::comm {

void reduce_into(void* inout, const void* in, std::size_t count, DType t, ReduceOp op);
// For avg: divide by the group size (integer division for int64); no-op for other ops.
void finish_avg(void* buf, std::size_t count, DType t, ReduceOp op, int group_size);

}  // namespace meshtrain::comm
