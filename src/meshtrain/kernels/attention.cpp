// Causal self-attention, FlashAttention style, on the CPU.
// Work is split over (b, h) pairs: every pair costs the same, and one thread owns all of a
// head's outputs and gradients, so no two threads write the same element.
// Per (b, h), K is copied transposed (hs, Tp) and V as (Tp, hs) into thread-local buffers
// (Tp = T rounded up to the key tile, padding zeroed), so the inner loops run over
// contiguous memory. Queries go in blocks of kBr rows against key tiles of kBc columns:
//   forward:  s = q k^T * scale (kBr x kBc), online softmax (running max m, sum l, rescaled
//             accumulator), out = acc / l, lse = m + log l.
//   backward: recompute p = exp(s - lse) per tile; D_i = dout_i . out_i;
//             dv += p^T dout, dp = dout v^T, ds = p (dp - D), dq += ds k scale, dk += ds^T q scale.
// Memory: O(T * hs) per thread; no (T x T) array exists. Limits: hs = C / NH must divide C.
#include "meshtrain/kernels/attention.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/kernels/vecmath.h"

namespace meshtrain::kernels {

namespace {

constexpr int64_t kBr = 4;   // query rows per block
constexpr int64_t kBc = 32;  // keys per tile (two AVX-512 vectors of scores)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- per-head staging ----
// Copies head h of batch b: kt(hs, Tp) = K^T, v(Tp, hs) (and optionally vt(hs, Tp) = V^T).
void stage_kv(float* kt, float* v, float* vt, const float* qkv, int64_t T, int64_t Tp, int64_t C,
              int64_t hs, int64_t h) {
  for (int64_t j = 0; j < Tp; ++j) {
    const float* krow = qkv + j * 3 * C + C + h * hs;
    const float* vrow = krow + C;
    for (int64_t d = 0; d < hs; ++d) {
      const float kv = j < T ? krow[d] : 0.0f;
      const float vv = j < T ? vrow[d] : 0.0f;
      kt[d * Tp + j] = kv;
      v[j * hs + d] = vv;
      if (vt) vt[d * Tp + j] = vv;
    }
  }
}

// s(rows, kBc) = q(rows, hs) @ kt(hs, Tp)[:, j0 : j0 + kBc]
inline void scores_tile(float* s, const float* q, const float* kt, int64_t rows, int64_t hs,
                        int64_t Tp, int64_t j0) {
  for (int64_t r = 0; r < rows; ++r) {
    float acc[kBc] = {};
    const float* qr = q + r * hs;
    for (int64_t d = 0; d < hs; ++d) {
      const float qd = qr[d];
      const float* k = kt + d * Tp + j0;
#pragma omp simd
      for (int64_t c = 0; c < kBc; ++c) acc[c] += qd * k[c];
    }
#pragma omp simd
    for (int64_t c = 0; c < kBc; ++c) s[r * kBc + c] = acc[c];
  }
}

// ---- forward of one head ----
void head_forward(float* out, float* lse, const float* qkv, int64_t T, int64_t C, int64_t hs,
                  int64_t h, float scale, std::vector<float>& buf) {
  const int64_t Tp = (T + kBc - 1) / kBc * kBc;
  buf.resize(static_cast<size_t>(2 * Tp * hs + 2 * kBr * hs + kBr * kBc));
  float* kt = buf.data();           // (hs, Tp)
  float* v = kt + Tp * hs;          // (Tp, hs)
  float* q = v + Tp * hs;           // (kBr, hs), pre-scaled
  float* acc = q + kBr * hs;        // (kBr, hs)
  float* s = acc + kBr * hs;        // (kBr, kBc)
  stage_kv(kt, v, nullptr, qkv, T, Tp, C, hs, h);

  for (int64_t i0 = 0; i0 < T; i0 += kBr) {
    const int64_t rows = i0 + kBr <= T ? kBr : T - i0;
    float m[kBr], l[kBr];
    for (int64_t r = 0; r < rows; ++r) {
      const float* qs = qkv + (i0 + r) * 3 * C + h * hs;
      for (int64_t d = 0; d < hs; ++d) q[r * hs + d] = qs[d] * scale;
      for (int64_t d = 0; d < hs; ++d) acc[r * hs + d] = 0.0f;
      m[r] = kNegInf;
      l[r] = 0.0f;
    }
    const int64_t jend = i0 + rows;  // keys 0 .. jend-1 are visible to some row of the block
    for (int64_t j0 = 0; j0 < jend; j0 += kBc) {
      scores_tile(s, q, kt, rows, hs, Tp, j0);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        float* sr = s + r * kBc;
        float mt = kNegInf;
#pragma omp simd reduction(max : mt)
        for (int64_t c = 0; c < kBc; ++c) {
          const float x = j0 + c <= i ? sr[c] : kNegInf;
          mt = x > mt ? x : mt;
        }
        if (mt == kNegInf) continue;  // whole tile masked for this row
        const float mnew = mt > m[r] ? mt : m[r];
        const float alpha = m[r] == kNegInf ? 0.0f : std::exp(m[r] - mnew);
        float ls = 0.0f;
#pragma omp simd reduction(+ : ls)
        for (int64_t c = 0; c < kBc; ++c) {
          const float p = j0 + c <= i ? detail::exp_approx(sr[c] - mnew) : 0.0f;
          sr[c] = p;
          ls += p;
        }
        l[r] = l[r] * alpha + ls;
        m[r] = mnew;
        float* ar = acc + r * hs;
#pragma omp simd
        for (int64_t d = 0; d < hs; ++d) ar[d] *= alpha;
        const int64_t cend = i - j0 + 1 < kBc ? i - j0 + 1 : kBc;
        for (int64_t c = 0; c < cend; ++c) {
          const float p = sr[c];
          const float* vr = v + (j0 + c) * hs;
#pragma omp simd
          for (int64_t d = 0; d < hs; ++d) ar[d] += p * vr[d];
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      const float inv = 1.0f / l[r];
      float* o = out + i * C + h * hs;
      for (int64_t d = 0; d < hs; ++d) o[d] = acc[r * hs + d] * inv;
      lse[i] = m[r] + std::log(l[r]);
    }
  }
}

// ---- backward of one head ----
void head_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                   const float* lse, int64_t T, int64_t C, int64_t hs, int64_t h, float scale,
                   std::vector<float>& buf) {
  const int64_t Tp = (T + kBc - 1) / kBc * kBc;
  buf.resize(static_cast<size_t>(6 * Tp * hs + 2 * kBc));
  float* kt = buf.data();       // (hs, Tp)
  float* v = kt + Tp * hs;      // (Tp, hs)
  float* vt = v + Tp * hs;      // (hs, Tp)
  float* dq = vt + Tp * hs;     // (Tp, hs)
  float* dk = dq + Tp * hs;     // (Tp, hs)
  float* dv = dk + Tp * hs;     // (Tp, hs)
  float* p = dv + Tp * hs;      // (kBc)
  float* ds = p + kBc;          // (kBc)
  stage_kv(kt, v, vt, qkv, T, Tp, C, hs, h);
  for (int64_t x = 0; x < 3 * Tp * hs; ++x) dq[x] = 0.0f;  // dq, dk, dv are contiguous

  for (int64_t i = 0; i < T; ++i) {
    const float* qi = qkv + i * 3 * C + h * hs;  // (hs)
    const float* doi = dout + i * C + h * hs;    // (hs)
    const float* oi = out + i * C + h * hs;      // (hs)
    float Di = 0.0f;
#pragma omp simd reduction(+ : Di)
    for (int64_t d = 0; d < hs; ++d) Di += doi[d] * oi[d];
    const float li = lse[i];
    float* dqi = dq + i * hs;
    for (int64_t j0 = 0; j0 <= i; j0 += kBc) {
      // p = exp(q.k scale - lse), dp = dout . v (over the tile's keys)
      float sacc[kBc] = {}, dpacc[kBc] = {};
      for (int64_t d = 0; d < hs; ++d) {
        const float qd = qi[d] * scale, dd = doi[d];
        const float* k = kt + d * Tp + j0;
        const float* vv = vt + d * Tp + j0;
#pragma omp simd
        for (int64_t c = 0; c < kBc; ++c) {
          sacc[c] += qd * k[c];
          dpacc[c] += dd * vv[c];
        }
      }
#pragma omp simd
      for (int64_t c = 0; c < kBc; ++c) {
        const float pc = j0 + c <= i ? detail::exp_approx(sacc[c] - li) : 0.0f;
        p[c] = pc;
        ds[c] = pc * (dpacc[c] - Di) * scale;
      }
      const int64_t cend = i - j0 + 1 < kBc ? i - j0 + 1 : kBc;
      for (int64_t c = 0; c < cend; ++c) {
        const int64_t j = j0 + c;
        const float pc = p[c], dsc = ds[c];
        float* dvj = dv + j * hs;
        float* dkj = dk + j * hs;
        const float* kr = qkv + j * 3 * C + C + h * hs;
#pragma omp simd
        for (int64_t d = 0; d < hs; ++d) {
          dvj[d] += pc * doi[d];
          dkj[d] += dsc * qi[d];
          dqi[d] += dsc * kr[d];
        }
      }
    }
  }
  for (int64_t j = 0; j < T; ++j) {
    float* dst = dqkv + j * 3 * C + h * hs;
    for (int64_t d = 0; d < hs; ++d) {
      dst[d] = dq[j * hs + d];
      dst[C + d] = dk[j * hs + d];
      dst[2 * C + d] = dv[j * hs + d];
    }
  }
}

void check_heads(int64_t C, int64_t NH) {
  if (NH <= 0 || C % NH != 0)
    throw std::invalid_argument("attention: C=" + std::to_string(C) +
                                " is not divisible by NH=" + std::to_string(NH));
}

}  // namespace

// ---- forward ----
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                       int64_t C, int64_t NH, int threads) {
  check_heads(C, NH);
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel num_threads(threads) if (threads > 1 && B * NH > 1)
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      head_forward(out + b * T * C, lse + bh * T, qkv + b * T * 3 * C, T, C, hs, h, scale, buf);
    }
  }
}

// ---- backward ----
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int threads) {
  check_heads(C, NH);
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel num_threads(threads) if (threads > 1 && B * NH > 1)
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      head_backward(dqkv + b * T * 3 * C, dout + b * T * C, qkv + b * T * 3 * C,
                    out + b * T * C, lse + bh * T, T, C, hs, h, scale, buf);
    }
  }
}

}  // namespace meshtrain::kernels
