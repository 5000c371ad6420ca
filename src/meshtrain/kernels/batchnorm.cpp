// Batch normalisation: on NCHW every pass loops over channels (the OpenMP loop) and, inside,
// over the N contiguous HW rows of that channel; on a blocked layout over groups of channels
// (below). The sums accumulate in double per row and per channel.
#include "meshtrain/kernels/batchnorm.h"
#include "meshtrain/kernels/layout.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace meshtrain::kernels {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements
bool split_channels(int64_t n, int threads) { return threads > 1 && n > kParallelMin; }

// The normalised value (x - mean) rstd weight + bias, with `a` = rstd * weight: one fused
// multiply-add, so that the backward pass of a batch norm with its ReLU recomputes the very
// value the forward pass compared with zero (a contraction chosen per loop by the compiler
// could round the two differently).
inline float bn_value(float x, float m, float a, float b) { return std::fma(x - m, a, b); }

// ---- the blocked layout (nChw{B}c): groups of B channels, one lane per channel ----
// Each pass loops over channel groups (the OpenMP loop), inside over samples and positions, and
// innermost over the B lanes, whose per-lane constants and float64 sums the compiler keeps in
// vector registers. x(cb, n) points at group cb of sample n: HW rows of B values.
namespace blocked {

template <int B>
void local_stats(double* sum, double* sumsq, const float* inp, int64_t N, int64_t C, int64_t HW, int threads) {
  const int64_t CB = C / B;
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t cb = 0; cb < CB; ++cb) {
    double s[B] = {}, q[B] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * CB + cb) * HW * B;
      for (int64_t i = 0; i < HW; ++i)
#pragma omp simd
        for (int j = 0; j < B; ++j) {
          const double v = x[i * B + j];
          s[j] += v;
          q[j] += v * v;
        }
    }
    for (int j = 0; j < B; ++j) sum[cb * B + j] = s[j], sumsq[cb * B + j] = q[j];
  }
}

template <int B>
void normalize(float* out, const float* inp, const float* weight, const float* bias, const float* mean,
               const float* rstd, int64_t N, int64_t C, int64_t HW, int threads, bool relu) {
  const int64_t CB = C / B;
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t cb = 0; cb < CB; ++cb) {
    float m[B], a[B], b[B];
    for (int j = 0; j < B; ++j) {
      const int64_t c = cb * B + j;
      m[j] = mean[c], a[j] = rstd[c] * weight[c], b[j] = bias[c];
    }
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * CB + cb) * HW * B;
      float* y = out + (n * CB + cb) * HW * B;
      for (int64_t i = 0; i < HW; ++i)
#pragma omp simd
        for (int j = 0; j < B; ++j) {
          const float z = bn_value(x[i * B + j], m[j], a[j], b[j]);
          y[i * B + j] = relu ? (z > 0.0f ? z : 0.0f) : z;
        }
    }
  }
}

template <int B>
void backward_sums(double* sdy, double* sdyx, const float* dout, const float* inp, const float* mean,
                   const float* rstd, int64_t N, int64_t C, int64_t HW, int threads, const ReluAfter* relu) {
  const int64_t CB = C / B;
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t cb = 0; cb < CB; ++cb) {
    double md[B], s[B] = {}, sx[B] = {};
    float mf[B], a[B], b[B];
    for (int j = 0; j < B; ++j) {
      const int64_t c = cb * B + j;
      md[j] = mean[c], mf[j] = mean[c];
      a[j] = relu ? rstd[c] * relu->weight[c] : 0.0f, b[j] = relu ? relu->bias[c] : 0.0f;
    }
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * CB + cb) * HW * B;
      const float* d = dout + (n * CB + cb) * HW * B;
      for (int64_t i = 0; i < HW; ++i)
#pragma omp simd
        for (int j = 0; j < B; ++j) {
          const float xv = x[i * B + j];
          const float g = !relu || bn_value(xv, mf[j], a[j], b[j]) > 0.0f ? d[i * B + j] : 0.0f;
          s[j] += g;
          sx[j] += static_cast<double>(g) * (xv - md[j]);
        }
    }
    for (int j = 0; j < B; ++j) sdy[cb * B + j] = s[j], sdyx[cb * B + j] = sx[j] * rstd[cb * B + j];
  }
}

template <int B>
void backward_data(float* dinp, const float* dout, const float* inp, const float* weight, const float* mean,
                   const float* rstd, const double* sums, double count, int64_t N, int64_t C, int64_t HW,
                   int threads, const ReluAfter* relu) {
  const int64_t CB = C / B;
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t cb = 0; cb < CB; ++cb) {
    float m[B], r[B], a[B], rb[B], mdy[B], mdyx[B];
    for (int j = 0; j < B; ++j) {
      const int64_t c = cb * B + j;
      m[j] = mean[c], r[j] = rstd[c], a[j] = weight[c] * r[j];
      rb[j] = relu ? relu->bias[c] : 0.0f;
      mdy[j] = static_cast<float>(sums[c] / count);
      mdyx[j] = static_cast<float>(sums[C + c] / count);
    }
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * CB + cb) * HW * B;
      const float* d = dout + (n * CB + cb) * HW * B;
      float* dx = dinp + (n * CB + cb) * HW * B;
      for (int64_t i = 0; i < HW; ++i)
#pragma omp simd
        for (int j = 0; j < B; ++j) {
          const float xv = x[i * B + j];
          const float g = !relu || bn_value(xv, m[j], a[j], rb[j]) > 0.0f ? d[i * B + j] : 0.0f;
          dx[i * B + j] = a[j] * (g - mdy[j] - (xv - m[j]) * r[j] * mdyx[j]);
        }
    }
  }
}

}  // namespace blocked
}  // namespace

// ---- forward ----
void batchnorm_local_stats(double* stats, const float* inp, int64_t N, int64_t C, int64_t HW, int threads,
                           int block) {
  stats[0] = static_cast<double>(N * HW);
  double* sum = stats + 1;      // (C)
  double* sumsq = stats + 1 + C;  // (C)
  if (block)
    return with_block(block, C, "batchnorm",
                      [&]<int B>() { blocked::local_stats<B>(sum, sumsq, inp, N, C, HW, threads); });
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0, q = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * C + c) * HW;  // (HW)
#pragma omp simd reduction(+ : s, q)
      for (int64_t i = 0; i < HW; ++i) {
        const double v = x[i];
        s += v;
        q += v * v;
      }
    }
    sum[c] = s;
    sumsq[c] = q;
  }
}

void batchnorm_stats(float* mean, float* rstd, double* var, const double* stats, int64_t C, float eps) {
  const double n = stats[0];
  if (!(n > 0)) throw std::invalid_argument("batchnorm: no elements to take statistics over (count 0)");
  for (int64_t c = 0; c < C; ++c) {
    const double m = stats[1 + c] / n;
    const double v = std::max(0.0, stats[1 + C + c] / n - m * m);
    mean[c] = static_cast<float>(m);
    rstd[c] = static_cast<float>(1.0 / std::sqrt(v + static_cast<double>(eps)));
    if (var) var[c] = v;
  }
}

void batchnorm_update_running(float* running_mean, float* running_var, const double* stats, int64_t C,
                              float momentum) {
  const double n = stats[0];
  if (n < 2)
    throw std::invalid_argument("batchnorm: training needs more than one value per channel (count " +
                                std::to_string(static_cast<int64_t>(n)) + ")");
  const double mo = momentum;
  for (int64_t c = 0; c < C; ++c) {
    const double m = stats[1 + c] / n;
    const double v = std::max(0.0, stats[1 + C + c] / n - m * m) * n / (n - 1);
    running_mean[c] = static_cast<float>((1 - mo) * running_mean[c] + mo * m);
    running_var[c] = static_cast<float>((1 - mo) * running_var[c] + mo * v);
  }
}

void batchnorm_eval_rstd(float* rstd, const float* running_var, int64_t C, float eps) {
  for (int64_t c = 0; c < C; ++c)
    rstd[c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(running_var[c]) + static_cast<double>(eps)));
}

void batchnorm_normalize(float* out, const float* inp, const float* weight, const float* bias,
                         const float* mean, const float* rstd, int64_t N, int64_t C, int64_t HW, int threads,
                         bool relu, int block) {
  if (block)
    return with_block(block, C, "batchnorm", [&]<int B>() {
      blocked::normalize<B>(out, inp, weight, bias, mean, rstd, N, C, HW, threads, relu);
    });
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t c = 0; c < C; ++c) {
    const float m = mean[c], a = rstd[c] * weight[c], b = bias[c];
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * C + c) * HW;
      float* y = out + (n * C + c) * HW;
      if (relu) {
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) {
          const float z = bn_value(x[i], m, a, b);
          y[i] = z > 0.0f ? z : 0.0f;
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) y[i] = bn_value(x[i], m, a, b);
      }
    }
  }
}

// ---- backward ----
void batchnorm_backward_sums(double* sums, const float* dout, const float* inp, const float* mean,
                             const float* rstd, int64_t N, int64_t C, int64_t HW, int threads, const ReluAfter* relu,
                             int block) {
  double* sdy = sums;       // (C)
  double* sdyx = sums + C;  // (C)
  if (block)
    return with_block(block, C, "batchnorm", [&]<int B>() {
      blocked::backward_sums<B>(sdy, sdyx, dout, inp, mean, rstd, N, C, HW, threads, relu);
    });
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t c = 0; c < C; ++c) {
    const double m = mean[c];
    const float mf = mean[c], a = relu ? rstd[c] * relu->weight[c] : 0.0f, b = relu ? relu->bias[c] : 0.0f;
    double s = 0.0, sx = 0.0;  // sx: sum dy (x - mean); times rstd below
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * C + c) * HW;
      const float* d = dout + (n * C + c) * HW;
      if (relu) {
#pragma omp simd reduction(+ : s, sx)
        for (int64_t i = 0; i < HW; ++i) {
          const float g = bn_value(x[i], mf, a, b) > 0.0f ? d[i] : 0.0f;
          s += g;
          sx += static_cast<double>(g) * (x[i] - m);
        }
      } else {
#pragma omp simd reduction(+ : s, sx)
        for (int64_t i = 0; i < HW; ++i) {
          s += d[i];
          sx += static_cast<double>(d[i]) * (x[i] - m);
        }
      }
    }
    sdy[c] = s;
    sdyx[c] = sx * rstd[c];
  }
}

void batchnorm_backward_params(float* dweight, float* dbias, const double* sums, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    if (dweight) dweight[c] += static_cast<float>(sums[C + c]);
    if (dbias) dbias[c] += static_cast<float>(sums[c]);
  }
}

void batchnorm_backward_data(float* dinp, const float* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, const double* sums, double count, int64_t N,
                             int64_t C, int64_t HW, int threads, const ReluAfter* relu, int block) {
  if (!(count > 0)) throw std::invalid_argument("batchnorm: backward with count 0");
  if (block)
    return with_block(block, C, "batchnorm", [&]<int B>() {
      blocked::backward_data<B>(dinp, dout, inp, weight, mean, rstd, sums, count, N, C, HW, threads, relu);
    });
#pragma omp parallel for num_threads(threads) if (parallel : split_channels(N * C * HW, threads))
  for (int64_t c = 0; c < C; ++c) {
    // dx = weight rstd (dy - mean(dy) - xhat mean(dy xhat)), means over the group's count.
    const float m = mean[c], r = rstd[c], a = weight[c] * r;
    const float rb = relu ? relu->bias[c] : 0.0f;  // relu->weight is `weight`: `a` is the forward's scale
    const float mdy = static_cast<float>(sums[c] / count);
    const float mdyx = static_cast<float>(sums[C + c] / count);
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * C + c) * HW;
      const float* d = dout + (n * C + c) * HW;
      float* dx = dinp + (n * C + c) * HW;
      if (relu) {
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) {
          const float g = bn_value(x[i], m, a, rb) > 0.0f ? d[i] : 0.0f;
          dx[i] = a * (g - mdy - (x[i] - m) * r * mdyx);
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) dx[i] = a * (d[i] - mdy - (x[i] - m) * r * mdyx);
      }
    }
  }
}

}  // namespace meshtrain::kernels
