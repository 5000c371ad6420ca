// Shared-memory all-reduce, for ranks on one machine (Transport::shared_memory). Every rank
// announces its buffer (on mpi: its shared segment, into which it first copies its data, and
// from which it copies the result at the end); rank r then sums block r of all p buffers and
// writes the sum into block r of every buffer; a second announcement says it is done. So each
// byte is read once and written once (the least an in-place all-reduce can touch), with two
// synchronisations and no message or allocation (on threads no copy either).
//
// Cost: 2 alpha_sync + n/p x p (read) + n/p x p (write) per rank = 2 alpha_sync + 2 n beta_mem
// with every rank working at once: at p = 2 the traffic of copying n bytes, which is what
// `meshtrain bench comm` compares it with. Large blocks are written with non-temporal stores
// (no read-for-ownership of the destination lines; MESHTRAIN_COMM_SHM_STREAM_BYTES, the
// message size from which they are used, default 32 MiB: below, the buffers of two ranks
// may still be in the last-level cache).
//
// Bits: the sum of an element is taken in the binomial tree's order rooted at rank 0 (tree.cpp:
// rank v adds the subtree sums of v+1, v+2, v+4, ... in turn), once, by one rank, and the same
// value is written to every rank: every rank holds the same bits, equal to what
// Algorithm::tree gives (and, at p = 2, to every other algorithm). avg sums, then multiplies
// by 1/p as every algorithm does.
//
// Blocks start on 64-byte boundaries of the buffer (whole cache lines of an aligned buffer), so
// two ranks rarely write one line.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "meshtrain/comm/algorithms.h"
#include "meshtrain/comm/reduce.h"

namespace meshtrain::comm {

namespace {

constexpr std::size_t kChunk = 2048;  // bytes summed at a time (stays in L1)
constexpr int kLevels = 32;           // subtree depth: p < 2^32

std::size_t stream_bytes() {
  static const std::size_t v = [] {
    const char* s = std::getenv("MESHTRAIN_COMM_SHM_STREAM_BYTES");
    return s && *s ? static_cast<std::size_t>(std::strtoull(s, nullptr, 10)) : std::size_t{32} << 20;
  }();
  return v;
}

// ---- stores ----
// dst <- src, bytes; with non-temporal stores for the aligned middle when `stream`.
void put(char* dst, const char* src, std::size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream && bytes >= 256) {
#if defined(__AVX512F__)
    constexpr std::size_t kVec = 64;
#else
    constexpr std::size_t kVec = 16;
#endif
    const std::size_t head = std::min(bytes, (kVec - reinterpret_cast<std::uintptr_t>(dst) % kVec) % kVec);
    std::memcpy(dst, src, head);
    std::size_t i = head;
    for (; i + kVec <= bytes; i += kVec) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
#else
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
#endif
    }
    std::memcpy(dst + i, src + i, bytes - i);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

// ---- two ranks, float32 sum or avg: one fused pass ----
// a[i] = b[i] = (a[i] + b[i]) (x scale): two loads, one add, two stores per element, with no
// staging through L1; the stores stream when `stream` and the two buffers share their
// alignment within 64 bytes (else plain stores). Returns false where it does not apply.
bool fused_pair(float* a, float* b, std::size_t n, ReduceOp op, bool stream) {
#if defined(__AVX512F__)
  if (op != ReduceOp::sum && op != ReduceOp::avg) return false;
  const float scale = op == ReduceOp::avg ? 0.5f : 1.0f;
  const bool nt = stream && (reinterpret_cast<std::uintptr_t>(a) % 64) == (reinterpret_cast<std::uintptr_t>(b) % 64);
  std::size_t i = 0;
  auto one = [&](std::size_t k) {
    float s = a[k] + b[k];
    if (op == ReduceOp::avg) s *= scale;
    a[k] = b[k] = s;
  };
  if (nt)
    for (; i < n && reinterpret_cast<std::uintptr_t>(a + i) % 64 != 0; ++i) one(i);
  const __m512 vs = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    __m512 s = _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    if (op == ReduceOp::avg) s = _mm512_mul_ps(s, vs);
    if (nt) {
      _mm512_stream_ps(a + i, s);
      _mm512_stream_ps(b + i, s);
    } else {
      _mm512_storeu_ps(a + i, s);
      _mm512_storeu_ps(b + i, s);
    }
  }
  for (; i < n; ++i) one(i);
  return true;
#else
  (void)a, (void)b, (void)n, (void)op, (void)stream;
  return false;
#endif
}

// ---- sums in the tree's order ----
struct Sources {
  char* const* buf;  // p buffers
  int p;
  std::size_t off, bytes, count;  // this chunk: byte offset, bytes, elements
  DType t;
  ReduceOp op;
};

// dst <- the sum over the subtree of virtual rank v (ranks v .. v+span-1 below p), as
// tree_reduce adds it: own value, then the subtrees of v+1, v+2, v+4, ...
void subtree(char* dst, int v, int span, const Sources& s, char (*scratch)[kChunk]) {
  std::memcpy(dst, s.buf[v] + s.off, s.bytes);
  for (int m = 1; m < span && v + m < s.p; m *= 2) {
    if (m == 1) {
      reduce_into(dst, s.buf[v + 1] + s.off, s.count, s.t, s.op);
    } else {
      subtree(scratch[0], v + m, m, s, scratch + 1);
      reduce_into(dst, scratch[0], s.count, s.t, s.op);
    }
  }
}

}  // namespace

namespace {
void sum_blocks(char* const* all, int p, int span, std::size_t lo, std::size_t hi, std::size_t es, DType t,
                ReduceOp op, bool stream);
}  // namespace

// ---- all-reduce ----
void shm_all_reduce(OpContext& c, SharedMemory& m, void* buf, std::size_t count, DType t, ReduceOp op) {
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) return;
  const std::size_t es = dtype_size(t);
  char* const stage = static_cast<char*>(m.stage());  // mpi: the shared segment; threads: none
  if (count * es > m.limit())
    c.fail(ErrorKind::usage, {}, "algorithm 'shm' exchanges at most " + std::to_string(m.limit()) + " bytes here, not " +
                                     std::to_string(count * es));
  if (stage) std::memcpy(stage, buf, count * es);
  c.shm_publish(m, stage ? stage : buf);
  char* bufs[64];
  char** all = bufs;
  std::unique_ptr<char*[]> many;  // only for groups of more than 64 ranks
  if (p > 64) many.reset(all = new char*[static_cast<std::size_t>(p)]);
  for (int q = 0; q < p; ++q) all[q] = static_cast<char*>(m.buffer(q));

  // Block r: whole 64-byte units of the buffer, split evenly.
  const std::size_t unit = std::max<std::size_t>(1, 64 / es);
  const std::size_t units = (count + unit - 1) / unit;
  const std::size_t lo = std::min(count, units * static_cast<std::size_t>(r) / static_cast<std::size_t>(p) * unit);
  const std::size_t hi = std::min(count, units * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(p) * unit);
  const bool stream = count * es >= stream_bytes();
  int span = 1;
  while (span < p) span *= 2;

  if (p == 2 && t == DType::f32 && hi > lo &&
      fused_pair(reinterpret_cast<float*>(all[0]) + lo, reinterpret_cast<float*>(all[1]) + lo, hi - lo, op, stream)) {
    // (a + b) x 0.5 is what finish_avg gives: the same bits as the general path.
  } else {
    sum_blocks(all, p, span, lo, hi, es, t, op, stream);
  }
#if defined(__SSE2__)
  if (stream) _mm_sfence();  // the streamed lines are visible before finish() announces it
#endif
  // Bytes between ranks, as messages would count them: the others read the rest of this rank's
  // buffer (its blocks they sum) and this rank writes its block into the p - 1 others; received
  // likewise. At even blocks 2(p-1)/p n each way, what ring sends.
  const std::size_t mine = (hi - lo) * es, moved = count * es - mine + mine * static_cast<std::size_t>(p - 1);
  c.count_bytes(moved, moved);
  c.shm_finish(m);
  if (stage) std::memcpy(buf, stage, count * es);
}

namespace {
// The general path: chunks of kChunk bytes summed in L1 in the tree's order, then written to
// every buffer.
void sum_blocks(char* const* all, int p, int span, std::size_t lo, std::size_t hi, std::size_t es, DType t,
                ReduceOp op, bool stream) {
  alignas(64) char sum[kChunk];
  alignas(64) char scratch[kLevels][kChunk];
  const std::size_t per = kChunk / es;
  for (std::size_t i = lo; i < hi; i += per) {
    const std::size_t n = std::min(per, hi - i);
    const Sources s{all, p, i * es, n * es, n, t, op};
    subtree(sum, 0, span, s, scratch);
    finish_avg(sum, n, t, op, p);
    for (int q = 0; q < p; ++q) put(all[q] + s.off, sum, s.bytes, stream);
  }
}
}  // namespace

}  // namespace meshtrain::comm
