// Softmax fused with cross-entropy over logits (N, V), and plain softmax.
//   crossentropy_forward: losses(N) = logsumexp(logits[i]) - logits[i][target[i]];
//                         saves lse(N). Rows whose target is negative are ignored (loss 0).
//   crossentropy_backward: in place, logits(N, V) becomes dlogits = (softmax - onehot) * dloss[i]
//                          (written), so the (N, V) probabilities are never stored twice.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int64_t N, int64_t V, int threads);
void crossentropy_backward_inplace(float* logits, const float* lse, const int32_t* targets,
                                   const float* dloss, int64_t N, int64_t V, int threads);

// probs(N, V) = softmax(logits / temperature) row by row.
void softmax_forward(float* probs, const float* logits, int64_t N, int64_t V, float temperature,
                     int threads);

}  // namespace meshtrain::kernels
