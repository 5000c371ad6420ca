// Causal multi-head self-attention over a fused qkv tensor, computed in tiles (FlashAttention
// style): at most one (tile x tile) block of the T x T scores of one head exists at a time, so
// memory is O(B * NH * T) for the saved log-sum-exp instead of O(B * NH * T * T).
//   qkv (B, T, 3C): [q | k | v] along the last dim, head h owns columns h*hs .. (h+1)*hs of
//                   each part (hs = C / NH). A tensor-parallel rank passes its local heads.
//   forward:  out(B, T, C) = softmax(q k^T / sqrt(hs) + causal mask) v; saves lse(B, NH, T)
//   backward: dqkv(B, T, 3C) (written) from dout(B, T, C), recomputing the scores tile by tile.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                       int64_t C, int64_t NH, int threads);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int threads);

}  // namespace meshtrain::kernels
