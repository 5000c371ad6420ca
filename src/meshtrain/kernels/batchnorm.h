// Batch normalisation over (N, spatial) per channel, on inp viewed as (N, C, HW) (NCHW with
// HW = H*W; HW = 1 for (N, C) inputs), as PyTorch's BatchNorm2d computes it:
//   y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps)
// Training uses the batch's mean and biased variance; evaluation the running statistics.
//
// Synchronised batch norm. Training-mode statistics come in two steps so that a caller can sum
// the per-channel sums over a group of ranks in between (an all-reduce), which normalises every
// rank's slice with the statistics of the group's whole batch:
//   forward:  batchnorm_local_stats -> [sum over the group] -> batchnorm_stats
//             -> batchnorm_normalize (and batchnorm_update_running)
//   backward: batchnorm_backward_sums -> [local sums into dweight, dbias; sum over the group]
//             -> batchnorm_backward_data
// The sums are float64 (statistics are accumulated in double: a channel of a large batch has
// millions of elements) and plain sums, so any reduction order and any split of the batch gives
// the same statistics up to double round-off. Layouts of the sums (C = channels):
//   stats (1 + 2C):  [count, sum_c x (C), sum_c x^2 (C)]
//   grad sums (2C):  [sum_c dy (C), sum_c dy * xhat (C)],  xhat = (x - mean) * rstd
// With count and sums the variance is sum x^2 / n - mean^2, in double: its cancellation costs
// about 1e-16 * mean^2 / var relative, negligible unless |mean| / std passes ~1e5.
//
// Gradient rule (nn/module.h): dinp is written (=); dweight and dbias accumulate (+=), and get
// the LOCAL sums: under data parallelism each rank's parameter gradient is its own share, which
// the gradient all-reduce adds up, while dinp needs the group's sums (the batch statistics
// couple every rank's inputs).
// Channels are split over the `threads` budget, one channel per thread in a fixed order, so
// results do not depend on the budget.
//
// Layouts. `block` is the activations' memory layout (kernels/layout.h): 0 NCHW (inp viewed as
// (N, C, HW)), B > 0 oneDNN's nChw{B}c (C divisible by B; B at most 16), in which the passes run
// over groups of B channels with one vector lane per channel. Both orders sum each channel's
// values sample by sample, position by position; the float64 sums of the two layouts can differ
// in their last bits (vector partial sums), the float32 results then by one rounding at most.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

// ---- forward ----
// stats (1 + 2C) = this slice's count (N * HW), per-channel sums and sums of squares (written).
void batchnorm_local_stats(double* stats, const float* inp, int64_t N, int64_t C, int64_t HW, int threads,
                           int block = 0);
// mean (C), rstd (C) from (possibly group-summed) stats; var (C), if not null, gets the biased
// variance. Throws std::invalid_argument if the count is not positive.
void batchnorm_stats(float* mean, float* rstd, double* var, const double* stats, int64_t C, float eps);
// running = (1 - momentum) running + momentum batch, with the unbiased variance
// var * n / (n - 1) for running_var (as PyTorch); throws if n < 2 (as PyTorch refuses a
// single value per channel in training).
void batchnorm_update_running(float* running_mean, float* running_var, const double* stats, int64_t C,
                              float momentum);
// rstd (C) = 1 / sqrt(running_var + eps), for evaluation through batchnorm_normalize.
void batchnorm_eval_rstd(float* rstd, const float* running_var, int64_t C, float eps);
// out (N, C, HW) = (inp - mean[c]) * rstd[c] * weight[c] + bias[c] (one fused multiply-add of
// (inp - mean) and rstd * weight), then max(0, .) when `relu` (a batch norm followed by a ReLU in
// one pass; NaN gives 0 as kernels/relu.h does).
void batchnorm_normalize(float* out, const float* inp, const float* weight, const float* bias,
                         const float* mean, const float* rstd, int64_t N, int64_t C, int64_t HW, int threads,
                         bool relu = false, int block = 0);

// The backward of a batch norm fused with the ReLU after it: the forward's weight and bias, from
// which the two kernels below recompute each normalised value and pass dout on only where it was
// positive (the ReLU's gradient), so that neither the ReLU's output nor its mask is kept.
struct ReluAfter {
  const float* weight;
  const float* bias;
};

// ---- backward ----
// sums (2C) = this slice's per-channel sums of dout and dout * xhat (written).
// With `relu`, dout is the gradient of the ReLU's output (see ReluAfter).
void batchnorm_backward_sums(double* sums, const float* dout, const float* inp, const float* mean,
                             const float* rstd, int64_t N, int64_t C, int64_t HW, int threads,
                             const ReluAfter* relu = nullptr, int block = 0);
// dweight (C) += sums of dout * xhat, dbias (C) += sums of dout (either may be null).
void batchnorm_backward_params(float* dweight, float* dbias, const double* sums, int64_t C);
// dinp (=) = weight rstd (dout - sum dout / count - xhat sum(dout xhat) / count), with the
// group's sums and count (the count of the stats the forward pass normalised with).
void batchnorm_backward_data(float* dinp, const float* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, const double* sums, double count, int64_t N,
                             int64_t C, int64_t HW, int threads, const ReluAfter* relu = nullptr, int block = 0);

}  // namespace meshtrain::kernels
