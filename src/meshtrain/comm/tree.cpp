// Binomial-tree broadcast, reduce, and all-reduce (reduce to rank 0, then broadcast).
//
// Cost: broadcast and reduce: ceil(log2 p) (alpha + n beta) (+ n gamma per level for reduce);
// the broadcast is pipelined in segments of chunk_bytes, which brings it towards
// (log2 p + n/s - 1)(alpha + s beta) for segment size s.
// All-reduce: 2 ceil(log2 p)(alpha + n beta) + ceil(log2 p) n gamma: latency-optimal in the
// number of rounds for tiny messages, never bandwidth-optimal.
//
// Tree shape: virtual rank v = (rank - root) mod p; the parent of v clears v's lowest set bit;
// the children of v are v + 2^k for 2^k below that bit (the root's below the next power of two).
#include <cstring>

#include "meshtrain/comm/algorithms.h"
#include "meshtrain/comm/reduce.h"

namespace meshtrain::comm {

namespace {
int lowbit_span(int v, int p) {  // v's lowest set bit, or the power of two >= p for the root
  if (v != 0) return v & -v;
  int m = 1;
  while (m < p) m *= 2;
  return m;
}
}  // namespace

// ---- broadcast ----
void tree_broadcast(OpContext& c, void* buf, std::size_t bytes, int root) {
  const int p = c.size();
  if (p == 1 || bytes == 0) return;
  const int v = (c.rank() - root + p) % p;
  const int span = lowbit_span(v, p);
  auto real = [&](int vr) { return (vr + root) % p; };
  char* base = static_cast<char*>(buf);
  const std::size_t seg = std::max<std::size_t>(1, c.chunk_bytes());
  const std::size_t nseg = (bytes + seg - 1) / seg;

  std::vector<RequestPtr> recvs, sends;
  if (v != 0)
    for (std::size_t j = 0; j < nseg; ++j)
      recvs.push_back(c.irecv(real(v - span), base + j * seg, std::min(seg, bytes - j * seg)));
  for (std::size_t j = 0; j < nseg; ++j) {
    if (v != 0) c.wait(recvs[j]);
    for (int m = span / 2; m >= 1; m /= 2)
      if (v + m < p) sends.push_back(c.isend(real(v + m), base + j * seg, std::min(seg, bytes - j * seg)));
  }
  c.wait_all(sends);
}

// ---- reduce ----
void tree_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op, int root) {
  const int p = c.size();
  if (p == 1 || count == 0) return;
  const int v = (c.rank() - root + p) % p;
  auto real = [&](int vr) { return (vr + root) % p; };
  for (int m = 1; m < p; m *= 2) {
    if (v & m) {
      auto s = c.isend(real(v - m), buf, count * dtype_size(t));
      c.wait(s);
      return;
    }
    if (v + m < p) {
      auto q = c.irecv_reduce(real(v + m), buf, count, t, op);
      c.wait(q);
    }
  }
}

// ---- all-reduce ----
void tree_all_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op) {
  if (c.size() == 1 || count == 0) return;
  tree_reduce(c, buf, count, t, op, 0);
  if (c.rank() == 0) finish_avg(buf, count, t, op, c.size());
  tree_broadcast(c, buf, count * dtype_size(t), 0);
}

}  // namespace meshtrain::comm
