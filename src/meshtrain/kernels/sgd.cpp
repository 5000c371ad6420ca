// SGD update: one pass over (param, grad, momentum buffer).
#include "meshtrain/kernels/sgd.h"

#include "meshtrain/kernels/bf16.h"

namespace meshtrain::kernels {

namespace {

constexpr int64_t kParallelMin = 1 << 15;

// kMomentum: with a momentum buffer; kNesterov: the look-ahead direction; kCopy: also the bf16
// copy. One body, so every variant is the same arithmetic.
template <bool kMomentum, bool kNesterov, bool kCopy>
void sgd_pass(float* param, const float* grad, float* buf, int64_t n, const SGDParams& p, int threads,
              uint16_t* bf16_out) {
  const float lr = p.lr, mu = p.momentum, wd = p.weight_decay, gs = p.grad_scale;
#pragma omp parallel for simd num_threads(threads) if (parallel : threads > 1 && n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * gs + wd * param[i];
    float d = g;
    if constexpr (kMomentum) {
      const float b = mu * buf[i] + g;
      buf[i] = b;
      d = kNesterov ? g + mu * b : b;
    }
    const float w = param[i] - lr * d;
    param[i] = w;
    if constexpr (kCopy) bf16_out[i] = to_bf16(w);
  }
}

template <bool kMomentum, bool kNesterov>
void sgd_copy_or_not(float* param, const float* grad, float* buf, int64_t n, const SGDParams& p, int threads,
                     uint16_t* bf16_out) {
  if (bf16_out)
    sgd_pass<kMomentum, kNesterov, true>(param, grad, buf, n, p, threads, bf16_out);
  else
    sgd_pass<kMomentum, kNesterov, false>(param, grad, buf, n, p, threads, nullptr);
}

}  // namespace

void sgd_update(float* param, const float* grad, float* buf, int64_t n, const SGDParams& p, int threads,
                uint16_t* bf16_out) {
  if (p.momentum == 0.0f)
    sgd_copy_or_not<false, false>(param, grad, nullptr, n, p, threads, bf16_out);
  else if (p.nesterov)
    sgd_copy_or_not<true, true>(param, grad, buf, n, p, threads, bf16_out);
  else
    sgd_copy_or_not<true, false>(param, grad, buf, n, p, threads, bf16_out);
}

}  // namespace meshtrain::kernels
