// Ring reduce-scatter, all-gather and all-reduce (= reduce-scatter + all-gather), chunked and
// pipelined.
//
// Cost (all-reduce): 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma — bandwidth-optimal,
// latency linear in p. Reduce-scatter and all-gather are each half of it:
// (p-1) alpha + (p-1)/p n beta (+ (p-1)/p n gamma for reduce-scatter).
//
// Worked example, p = 3, blocks A B C (block i ends on rank i):
//   reduce-scatter step s: rank r sends block (r-s-1) to r+1 and reduces block (r-s-2) from r-1.
//     step 0: r0 sends C, gets B (from r2); r1 sends A, gets C; r2 sends B, gets A
//     step 1: r0 sends B (now 2 terms), gets A -> complete; r1 gets B; r2 gets C.
//   all-gather step s: rank r sends block (r-s) and receives block (r-s-1).
// Pipelining: each block travels in segments of chunk_bytes; segment j of the block received at
// step s is forwarded at step s+1 as soon as it arrives, so the ring's steps overlap instead of
// waiting for whole blocks. A block is never written after it was sent, so sends stay in flight
// until the end of the phase.
#include <algorithm>
#include <cstring>

#include "meshtrain/comm/algorithms.h"
#include "meshtrain/comm/reduce.h"

namespace meshtrain::comm {

namespace {

int mod(int a, int p) { return ((a % p) + p) % p; }

// Segments of block b: [first, first + n) elements, n per segment (last one shorter).
struct Segments {
  std::size_t first, count, per;
  std::size_t size() const { return count == 0 ? 0 : (count + per - 1) / per; }
  std::size_t begin(std::size_t j) const { return first + j * per; }
  std::size_t len(std::size_t j) const { return std::min(per, count - j * per); }
};
Segments segments(const Layout& l, int b, std::size_t elem_size, std::size_t chunk_bytes) {
  return {l.offset[b], l.count(b), std::max<std::size_t>(1, chunk_bytes / elem_size)};
}

}  // namespace

// ---- reduce-scatter ----
void ring_reduce_scatter(OpContext& c, void* buf, const Layout& l, DType t, ReduceOp op) {
  const int p = c.size(), r = c.rank();
  if (p == 1) return;
  const std::size_t es = dtype_size(t);
  char* base = static_cast<char*>(buf);
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  std::vector<RequestPtr> sends, recvs;

  auto send_block = [&](int b) {
    Segments s = segments(l, b, es, c.chunk_bytes());
    for (std::size_t j = 0; j < s.size(); ++j) sends.push_back(c.isend(next, base + s.begin(j) * es, s.len(j) * es));
  };
  send_block(mod(r - 1, p));
  for (int step = 0; step < p - 1; ++step) {
    const int b = mod(r - step - 2, p);
    Segments s = segments(l, b, es, c.chunk_bytes());
    recvs.clear();
    for (std::size_t j = 0; j < s.size(); ++j) recvs.push_back(c.irecv_reduce(prev, base + s.begin(j) * es, s.len(j), t, op));
    for (std::size_t j = 0; j < s.size(); ++j) {
      c.wait(recvs[j]);
      if (step < p - 2) sends.push_back(c.isend(next, base + s.begin(j) * es, s.len(j) * es));
    }
  }
  c.wait_all(sends);
}

// ---- all-gather ----
void ring_all_gather(OpContext& c, void* buf, const Layout& l, std::size_t es) {
  const int p = c.size(), r = c.rank();
  if (p == 1) return;
  char* base = static_cast<char*>(buf);
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  std::vector<RequestPtr> sends, recvs;

  Segments first = segments(l, r, es, c.chunk_bytes());
  for (std::size_t j = 0; j < first.size(); ++j)
    sends.push_back(c.isend(next, base + first.begin(j) * es, first.len(j) * es));
  for (int step = 0; step < p - 1; ++step) {
    const int b = mod(r - step - 1, p);
    Segments s = segments(l, b, es, c.chunk_bytes());
    recvs.clear();
    for (std::size_t j = 0; j < s.size(); ++j) recvs.push_back(c.irecv(prev, base + s.begin(j) * es, s.len(j) * es));
    for (std::size_t j = 0; j < s.size(); ++j) {
      c.wait(recvs[j]);
      if (step < p - 2) sends.push_back(c.isend(next, base + s.begin(j) * es, s.len(j) * es));
    }
  }
  c.wait_all(sends);
}

// ---- all-reduce ----
void ring_all_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op) {
  const int p = c.size();
  if (p == 1 || count == 0) return;
  const Layout l = even_layout(count, p);
  ring_reduce_scatter(c, buf, l, t, op);
  const std::size_t es = dtype_size(t);
  finish_avg(static_cast<char*>(buf) + l.offset[c.rank()] * es, l.count(c.rank()), t, op, p);
  ring_all_gather(c, buf, l, es);
}

}  // namespace meshtrain::comm
