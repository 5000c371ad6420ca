// Causal self-attention, FlashAttention style, on the CPU.
// Work is split over (b, h) pairs: every pair costs the same, and one thread owns all of a
// head's outputs and gradients, so no two threads write the same element.
// Per (b, h) the head's operands are staged once in thread-local buffers: K and V as rows,
// Q transposed (and for the backward also Q and dout as rows, dout transposed, and the dq,
// dk, dv accumulators), with the head size padded to hp (a multiple of 16 floats, one
// AVX-512 vector) and T to the tile, padding zeroed, so the micro-kernels run over whole
// vectors; they are compiled for hp = 16, 32, 48, 64, 128 (others take a run-time path).
// Queries go in blocks of kBr = 16 rows (one row per vector lane) against key tiles of
// kBc = 16 keys:
//   forward:  s = q k^T * scale (kBr x kBc), online softmax (running max m, sum l, rescaled
//             accumulator), out = acc / l, lse = m + log l.
//   backward: recompute p = exp(s - lse) per tile; D_i = dout_i . out_i;
//             dv += p^T dout, dp = dout v^T, ds = p (dp - D) scale, dq += ds k, dk += ds^T q.
// Memory: O(T * hs) per thread; no (T x T) array exists. Limits: NH must divide C.
#include "meshtrain/kernels/attention.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "meshtrain/kernels/vecmath.h"

namespace meshtrain::kernels {

namespace {

constexpr int64_t kBr = 16;  // query rows per block: one AVX-512 vector, a row per lane
constexpr int64_t kBc = 16;  // keys per tile
constexpr int64_t kV = 16;   // floats per vector chunk of the head dimension
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Score tiles are kept transposed, st(kBc, kBr): st[c][r] is query row r against key c, so
// the softmax statistics of the kBr rows (max, sum, rescale factors) are lane-wise vector
// operations over the kBc keys, with no horizontal reductions.

// ---- micro-kernels ----
// Each keeps a block of 16 vectors of accumulators in registers.

// st(kBc, kBr) = keys(kBc, hp) @ xt(hp, ldx)[:, 0:kBr]
template <int64_t HP>
inline void mk_scores(float* __restrict st, const float* __restrict keys,
                      const float* __restrict xt, int64_t ldx, int64_t hp_rt) {
  const int64_t hp = HP ? HP : hp_rt;
  float acc[kBc][kBr] = {};
  for (int64_t d = 0; d < hp; ++d) {
    const float* x = xt + d * ldx;
#pragma GCC unroll 16
    for (int64_t c = 0; c < kBc; ++c) {
      const float kc = keys[c * hp + d];
#pragma omp simd
      for (int64_t r = 0; r < kBr; ++r) acc[c][r] += kc * x[r];
    }
  }
  for (int64_t c = 0; c < kBc; ++c)
#pragma omp simd
    for (int64_t r = 0; r < kBr; ++r) st[c * kBr + r] = acc[c][r];
}

// acc(kBr, hp) += pt(kBc, kBr)[0:cend]^T @ x(cend, hp)
template <int64_t HP>
inline void mk_acc_rows(float* __restrict acc, const float* __restrict pt,
                        const float* __restrict x, int64_t cend, int64_t hp_rt) {
  const int64_t hp = HP ? HP : hp_rt;
  for (int64_t v0 = 0; v0 < hp; v0 += kV) {
    float a[kBr][kV];
    for (int64_t r = 0; r < kBr; ++r)
#pragma omp simd
      for (int64_t v = 0; v < kV; ++v) a[r][v] = acc[r * hp + v0 + v];
    for (int64_t c = 0; c < cend; ++c) {
      const float* xc = x + c * hp + v0;
#pragma GCC unroll 16
      for (int64_t r = 0; r < kBr; ++r) {
        const float p = pt[c * kBr + r];
#pragma omp simd
        for (int64_t v = 0; v < kV; ++v) a[r][v] += p * xc[v];
      }
    }
    for (int64_t r = 0; r < kBr; ++r)
#pragma omp simd
      for (int64_t v = 0; v < kV; ++v) acc[r * hp + v0 + v] = a[r][v];
  }
}

// dst(cend, hp) += pt(kBc, kBr)[0:cend] @ y(kBr, hp)
template <int64_t HP>
inline void mk_acc_keys(float* __restrict dst, const float* __restrict pt,
                        const float* __restrict y, int64_t cend, int64_t hp_rt) {
  const int64_t hp = HP ? HP : hp_rt;
  for (int64_t v0 = 0; v0 < hp; v0 += kV) {
    float yr[kBr][kV];
    for (int64_t r = 0; r < kBr; ++r)
#pragma omp simd
      for (int64_t v = 0; v < kV; ++v) yr[r][v] = y[r * hp + v0 + v];
    for (int64_t c = 0; c < cend; ++c) {
      // Four independent accumulation chains: one chain of 16 dependent FMAs would wait on
      // FMA latency at every step.
      float a[4][kV] = {};
#pragma GCC unroll 16
      for (int64_t r = 0; r < kBr; ++r) {
        const float p = pt[c * kBr + r];
#pragma omp simd
        for (int64_t v = 0; v < kV; ++v) a[r % 4][v] += p * yr[r][v];
      }
#pragma omp simd
      for (int64_t v = 0; v < kV; ++v)
        dst[c * hp + v0 + v] += (a[0][v] + a[1][v]) + (a[2][v] + a[3][v]);
    }
  }
}

// ---- staging ----
struct Dims {
  int64_t T, C, hs, hp, Tp, ldt;  // hp: hs padded to kV; Tp: T padded to kBr and kBc;
                                 // ldt: row length of transposed (hp, Tp) buffers
};

Dims dims(int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const int64_t tile = kBc > kBr ? kBc : kBr;
  const int64_t Tp = (T + tile - 1) / tile * tile;
  // A power-of-two row length would map a column's hp lines onto a few L1 sets; pad it.
  return {T, C, hs, (hs + kV - 1) / kV * kV, Tp, Tp + kV};
}

// rows(Tp, hp) = rows of a (T, ld) head slice, zero-padded.
void stage_rows(float* rows, const float* src, int64_t ld, const Dims& g) {
  for (int64_t j = 0; j < g.Tp; ++j) {
    float* __restrict dst = rows + j * g.hp;
    const float* __restrict s = src + j * ld;
    const int64_t n = j < g.T ? g.hs : 0;
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) dst[d] = s[d];
    for (int64_t d = n; d < g.hp; ++d) dst[d] = 0.0f;
  }
}

// cols(hp, ldt) = (rows of a (T, ld) head slice)^T * mul, zero-padded.
// Goes in blocks of 16 rows so each store fills whole lines of cols while the 16 source rows
// stay in L1 (a row-by-row transpose scattered every store to its own line).
void stage_cols(float* cols, const float* src, int64_t ld, const Dims& g, float mul) {
  for (int64_t x = 0; x < g.hp * g.ldt; ++x) cols[x] = 0.0f;
  for (int64_t j0 = 0; j0 < g.T; j0 += 16) {
    const int64_t n = j0 + 16 <= g.T ? 16 : g.T - j0;
    for (int64_t d = 0; d < g.hs; ++d) {
      float* __restrict c = cols + d * g.ldt + j0;
      const float* __restrict s = src + j0 * ld + d;
      for (int64_t r = 0; r < n; ++r) c[r] = s[r * ld] * mul;
    }
  }
}

// Lane r of the causal mask for key j: row i0 + r sees key j when j <= i0 + r (and the row
// exists). Returned as the last row index visible per lane, compared with j in the loops.
inline void row_index(float* last, int64_t i0, const Dims& g) {
  for (int64_t r = 0; r < kBr; ++r) last[r] = i0 + r < g.T ? float(i0 + r) : -1.0f;
}

// ---- online softmax of one tile ----
// st(kBc, kBr) scores in, probabilities p = exp(s - m_new) out (0 where masked); updates the
// running max m and sum l of each row, and alpha = exp(m_old - m_new), the factor the row's
// accumulator must be scaled by. Returns whether any row's max moved (alpha != 1 somewhere).
template <bool kMasked>
inline bool softmax_tile(float* __restrict st, float* __restrict m, float* __restrict l,
                         float* __restrict alpha, const float* __restrict last, int64_t j0) {
  alignas(64) float mt[kBr];
  for (int64_t r = 0; r < kBr; ++r) mt[r] = kNegInf;
  for (int64_t c = 0; c < kBc; ++c) {
    const float j = float(j0 + c);
#pragma omp simd
    for (int64_t r = 0; r < kBr; ++r) {
      const float x = !kMasked || j <= last[r] ? st[c * kBr + r] : kNegInf;
      mt[r] = x > mt[r] ? x : mt[r];
    }
  }
  bool rescale = false;
#pragma omp simd reduction(|| : rescale)
  for (int64_t r = 0; r < kBr; ++r) {
    const float mn = mt[r] > m[r] ? mt[r] : m[r];
    // Rows with nothing seen yet (mn = -inf) keep l = acc = 0: alpha = 0, p = 0 below.
    alpha[r] = mn == kNegInf ? 0.0f : detail::exp_approx(m[r] - mn);
    rescale = rescale || mt[r] > m[r];
    m[r] = mn;
    l[r] *= alpha[r];
  }
  for (int64_t c = 0; c < kBc; ++c) {
    const float j = float(j0 + c);
#pragma omp simd
    for (int64_t r = 0; r < kBr; ++r) {
      const float p =
          !kMasked || j <= last[r] ? detail::exp_approx(st[c * kBr + r] - m[r]) : 0.0f;
      st[c * kBr + r] = p;
      l[r] += p;
    }
  }
  return rescale;
}

// ---- forward of one head ----
template <int64_t HP>
void head_forward(float* out, float* lse, const float* qkv, const Dims& g, int64_t h,
                  float scale, std::vector<float>& buf) {
  const int64_t hp = HP ? HP : g.hp, Tp = g.Tp;
  buf.resize(static_cast<size_t>(2 * Tp * hp + g.ldt * hp + kBr * hp + kBc * kBr));
  float* k = buf.data();       // (Tp, hp)
  float* v = k + Tp * hp;      // (Tp, hp)
  float* qt = v + Tp * hp;     // (hp, ldt), pre-scaled
  float* acc = qt + g.ldt * hp;  // (kBr, hp)
  float* st = acc + kBr * hp;  // (kBc, kBr)
  stage_rows(k, qkv + g.C + h * g.hs, 3 * g.C, g);
  stage_rows(v, qkv + 2 * g.C + h * g.hs, 3 * g.C, g);
  stage_cols(qt, qkv + h * g.hs, 3 * g.C, g, scale);

  for (int64_t i0 = 0; i0 < g.T; i0 += kBr) {
    for (int64_t x = 0; x < kBr * hp; ++x) acc[x] = 0.0f;
    alignas(64) float m[kBr], l[kBr], last[kBr], alpha[kBr];
    row_index(last, i0, g);
    for (int64_t r = 0; r < kBr; ++r) m[r] = kNegInf, l[r] = 0.0f;
    const int64_t ilast = (i0 + kBr < g.T ? i0 + kBr : g.T) - 1;  // last real row
    for (int64_t j0 = 0; j0 <= ilast; j0 += kBc) {
      mk_scores<HP>(st, k + j0 * hp, qt + i0, g.ldt, hp);
      // Tiles left of the diagonal block with all rows present need no mask.
      const bool full = j0 + kBc - 1 <= i0 && i0 + kBr <= g.T;
      const bool rescale = full ? softmax_tile<false>(st, m, l, alpha, last, j0)
                                : softmax_tile<true>(st, m, l, alpha, last, j0);
      if (rescale)
        for (int64_t r = 0; r < kBr; ++r) {
          const float a = alpha[r];
#pragma omp simd
          for (int64_t d = 0; d < hp; ++d) acc[r * hp + d] *= a;
        }
      const int64_t cend = ilast - j0 + 1 < kBc ? ilast - j0 + 1 : kBc;
      mk_acc_rows<HP>(acc, st, v + j0 * hp, cend, hp);
    }
    for (int64_t i = i0; i <= ilast; ++i) {
      const int64_t r = i - i0;
      const float inv = 1.0f / l[r];
      float* o = out + i * g.C + h * g.hs;
      for (int64_t d = 0; d < g.hs; ++d) o[d] = acc[r * hp + d] * inv;
      lse[i] = m[r] + std::log(l[r]);
    }
  }
}

// ---- probabilities and score gradients of one tile (backward) ----
// pt: scores q.k in, p = exp(s scale - lse) out; dst: dp in, ds = p (dp - D) scale out.
template <bool kMasked>
inline void probs_and_dscores(float* __restrict pt, float* __restrict dst,
                              const float* __restrict L, const float* __restrict D,
                              const float* __restrict last, int64_t j0, float scale) {
  for (int64_t c = 0; c < kBc; ++c) {
    const float j = float(j0 + c);
#pragma omp simd
    for (int64_t r = 0; r < kBr; ++r) {
      const float p =
          !kMasked || j <= last[r] ? detail::exp_approx(pt[c * kBr + r] * scale - L[r]) : 0.0f;
      pt[c * kBr + r] = p;
      dst[c * kBr + r] = p * (dst[c * kBr + r] - D[r]) * scale;
    }
  }
}

// ---- backward of one head ----
template <int64_t HP>
void head_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                   const float* lse, const Dims& g, int64_t h, float scale,
                   std::vector<float>& buf) {
  const int64_t hp = HP ? HP : g.hp, Tp = g.Tp;
  buf.resize(static_cast<size_t>(7 * Tp * hp + 2 * g.ldt * hp + kBr * hp + 2 * kBc * kBr));
  float* k = buf.data();        // (Tp, hp)
  float* v = k + Tp * hp;       // (Tp, hp)
  float* q = v + Tp * hp;       // (Tp, hp)
  float* dor = q + Tp * hp;     // (Tp, hp): dout rows
  float* qt = dor + Tp * hp;    // (hp, ldt)
  float* dot = qt + g.ldt * hp;  // (hp, ldt)
  float* dk = dot + g.ldt * hp;  // (Tp, hp)
  float* dv = dk + Tp * hp;     // (Tp, hp)
  float* dq = dv + Tp * hp;     // (Tp, hp)
  float* dqb = dq + Tp * hp;    // (kBr, hp)
  float* pt = dqb + kBr * hp;   // (kBc, kBr): p
  float* dst = pt + kBc * kBr;  // (kBc, kBr): dp, then ds in place
  stage_rows(k, qkv + g.C + h * g.hs, 3 * g.C, g);
  stage_rows(v, qkv + 2 * g.C + h * g.hs, 3 * g.C, g);
  stage_rows(q, qkv + h * g.hs, 3 * g.C, g);
  stage_rows(dor, dout + h * g.hs, g.C, g);
  stage_cols(qt, qkv + h * g.hs, 3 * g.C, g, 1.0f);
  stage_cols(dot, dout + h * g.hs, g.C, g, 1.0f);
  for (int64_t x = 0; x < 3 * Tp * hp; ++x) dk[x] = 0.0f;  // dk, dv, dq are contiguous

  for (int64_t i0 = 0; i0 < g.T; i0 += kBr) {
    const float* qb = q + i0 * hp;     // (kBr, hp)
    const float* dob = dor + i0 * hp;  // (kBr, hp)
    for (int64_t x = 0; x < kBr * hp; ++x) dqb[x] = 0.0f;
    alignas(64) float D[kBr], L[kBr], last[kBr];
    row_index(last, i0, g);
    for (int64_t r = 0; r < kBr; ++r) {
      const int64_t i = i0 + r;
      float di = 0.0f;
      if (i < g.T) {
        const float* o = out + i * g.C + h * g.hs;
#pragma omp simd reduction(+ : di)
        for (int64_t d = 0; d < g.hs; ++d) di += dob[r * hp + d] * o[d];
      }
      D[r] = di;
      L[r] = i < g.T ? lse[i] : 0.0f;
    }
    const int64_t ilast = (i0 + kBr < g.T ? i0 + kBr : g.T) - 1;
    for (int64_t j0 = 0; j0 <= ilast; j0 += kBc) {
      mk_scores<HP>(pt, k + j0 * hp, qt + i0, g.ldt, hp);
      mk_scores<HP>(dst, v + j0 * hp, dot + i0, g.ldt, hp);
      const bool full = j0 + kBc - 1 <= i0 && i0 + kBr <= g.T;
      if (full)
        probs_and_dscores<false>(pt, dst, L, D, last, j0, scale);
      else
        probs_and_dscores<true>(pt, dst, L, D, last, j0, scale);
      const int64_t cend = ilast - j0 + 1 < kBc ? ilast - j0 + 1 : kBc;
      mk_acc_keys<HP>(dv + j0 * hp, pt, dob, cend, hp);
      mk_acc_keys<HP>(dk + j0 * hp, dst, qb, cend, hp);
      mk_acc_rows<HP>(dqb, dst, k + j0 * hp, cend, hp);
    }
    for (int64_t x = 0; x < kBr * hp; ++x) dq[i0 * hp + x] = dqb[x];
  }
  for (int64_t j = 0; j < g.T; ++j) {
    float* __restrict o = dqkv + j * 3 * g.C + h * g.hs;
    const float* __restrict a = dq + j * hp;
    const float* __restrict b = dk + j * hp;
    const float* __restrict c = dv + j * hp;
#pragma omp simd
    for (int64_t d = 0; d < g.hs; ++d) o[d] = a[d];
#pragma omp simd
    for (int64_t d = 0; d < g.hs; ++d) o[g.C + d] = b[d];
#pragma omp simd
    for (int64_t d = 0; d < g.hs; ++d) o[2 * g.C + d] = c[d];
  }
}

// ---- dispatch on the padded head size ----
// Compile-time head sizes give the micro-kernels constant row offsets (no address registers
// spilled); other sizes take the run-time path.
template <class F>
void with_hp(int64_t hp, F&& f) {
  switch (hp) {
    case 16: return f(std::integral_constant<int64_t, 16>{});
    case 32: return f(std::integral_constant<int64_t, 32>{});
    case 48: return f(std::integral_constant<int64_t, 48>{});
    case 64: return f(std::integral_constant<int64_t, 64>{});
    case 128: return f(std::integral_constant<int64_t, 128>{});
    default: return f(std::integral_constant<int64_t, 0>{});
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
  const Dims g = dims(T, C, NH);
  const float scale = 1.0f / std::sqrt(float(g.hs));
#pragma omp parallel num_threads(threads) if (parallel : threads > 1 && B * NH > 1)
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      with_hp(g.hp, [&](auto HP) {
        head_forward<HP()>(out + b * T * C, lse + bh * T, qkv + b * T * 3 * C, g, h, scale, buf);
      });
    }
  }
}

// ---- backward ----
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int threads) {
  check_heads(C, NH);
  const Dims g = dims(T, C, NH);
  const float scale = 1.0f / std::sqrt(float(g.hs));
#pragma omp parallel num_threads(threads) if (parallel : threads > 1 && B * NH > 1)
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      with_hp(g.hp, [&](auto HP) {
        head_backward<HP()>(dqkv + b * T * 3 * C, dout + b * T * C, qkv + b * T * 3 * C,
                            out + b * T * C, lse + bh * T, g, h, scale, buf);
      });
    }
  }
}

}  // namespace meshtrain::kernels
