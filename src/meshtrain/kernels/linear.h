// Linear layer kernels (GPT-2 Conv1D layout: weight stored (in, out)).
//   forward:  out(N, OC) = inp(N, C) @ weight(C, OC) + bias(OC)
//   backward: dinp(N, C) (=), dweight(C, OC) (+=), dbias(OC) (+=)
// Gradient rule (nn/module.h): parameter gradients accumulate, activation gradients are written.
// `opt` carries the thread budget and the precision of the three products (kernels/gemm.h); its
// b16, if set, is the weight's bf16 copy (used by forward and the input gradient). The bias and
// its gradient are float32 always.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/gemm.h"

namespace meshtrain::kernels {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t N, int64_t C, int64_t OC, const GemmOptions& opt);
// dinp may be null (no input gradient needed), dweight null (the weight gradient is deferred:
// split backward), dbias null (no bias, or deferred).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC,
                     const GemmOptions& opt);

}  // namespace meshtrain::kernels
