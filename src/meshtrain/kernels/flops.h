// The arithmetic the matrix products (gemm) and convolutions (forward and backward) have done on
// this thread, counted at each call from its shape: 2 FLOPs a multiply-add, nothing for the
// bias or the element-wise work. What a profiler of those calls reports, so that a model's
// FLOP count (model/graph.h: forward_flops) can be checked against what its layers ran.
#pragma once

namespace meshtrain::kernels {

void count_flops(double flops);
double flops_counted_thread();
void reset_flops_counted_thread();

}  // namespace meshtrain::kernels
