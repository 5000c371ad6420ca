// SGD with momentum (optionally Nesterov) on a flat span of one parameter, PyTorch's
// torch.optim.SGD with dampening 0:
//   g = grad_scale * grad + weight_decay * p          (L2: the decay is added to the gradient)
//   b = momentum * b + g                               (b starts at 0, so the first b is g)
//   d = nesterov ? g + momentum * b : b                (momentum 0: d = g, b is not touched)
//   p -= lr * d
// `grad_scale` multiplies the gradient first (global-norm clipping passes min(1, clip / norm)).
// Bias and norm parameters pass weight_decay = 0 (the optimizer decides, see train/).
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

struct SGDParams {
  float lr = 1e-2f;
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
};

// buf may be null when momentum is 0. bf16_out, if set, receives to_bf16 of each updated
// parameter (the next step's bf16 weight copy, as adamw_update writes it).
void sgd_update(float* param, const float* grad, float* buf, int64_t n, const SGDParams& p, int threads,
                uint16_t* bf16_out = nullptr);

}  // namespace meshtrain::kernels
