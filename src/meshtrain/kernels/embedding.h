// Token + position embedding (GPT-2 "encoder").
//   forward:  out(B, T, C) = wte[tokens[b, t]] + wpe[t]
//   backward: dwte(V, C) +=, dwpe(T_max, C) += (parameter gradients accumulate)
// vocab_start/vocab_size let a vocabulary-parallel rank own rows [vocab_start, vocab_start +
// vocab_size) of the table: tokens outside contribute zero (forward) and nothing (backward).
// A full table passes vocab_start = 0, vocab_size = V. wpe = nullptr skips the position table
// (forward), dwpe = nullptr skips its gradient (backward); a vocabulary-parallel group passes
// wpe on one rank only, so the all-reduce of the partial outputs adds it once.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t vocab_start, int64_t vocab_size,
                       int threads);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t vocab_start, int64_t vocab_size,
                        int threads);

}  // namespace meshtrain::kernels
