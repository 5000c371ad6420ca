// Recursive halving / doubling all-reduce (Rabenseifner): a reduce-scatter by recursive
// halving followed by an all-gather by recursive doubling, over the largest power of two
// p' <= p ranks.
//
// Cost: 2 log2(p') alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma, plus, when p is not a power
// of two, the standard fix-up: 2 alpha + 2 n beta + n gamma (the r = p - p' extra ranks fold
// their vector into a partner before, and get the result back after).
// Latency logarithmic in p and bandwidth-optimal (for powers of two): the choice for small and
// medium messages on larger groups.
//
// Fix-up (as in MPICH): among the first 2r ranks, even ranks send their whole vector to the odd
// neighbour and sit out; odd ranks take part as new rank r/2; ranks >= 2r take part as r - rem.
#include <cstring>

#include "meshtrain/comm/algorithms.h"
#include "meshtrain/comm/reduce.h"

namespace meshtrain::comm {

void rhd_all_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op) {
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) return;
  const std::size_t es = dtype_size(t);
  char* base = static_cast<char*>(buf);
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  const int rem = p - pof2;

  // ---- fold the extra ranks in ----
  int newrank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      auto s = c.isend(r + 1, base, count * es);
      c.wait(s);
      newrank = -1;
    } else {
      auto q = c.irecv_reduce(r - 1, base, count, t, op);
      c.wait(q);
      newrank = r / 2;
    }
  } else {
    newrank = r - rem;
  }
  auto real = [rem](int nr) { return nr < rem ? nr * 2 + 1 : nr + rem; };

  if (newrank >= 0) {
    const Layout l = even_layout(count, pof2);
    // ---- reduce-scatter by recursive halving: keep the half holding block `newrank` ----
    int lo = 0, hi = pof2;  // blocks [lo, hi) still owned
    for (int mask = pof2 / 2; mask >= 1; mask /= 2) {
      const int partner = real(newrank ^ mask);
      const int mid = lo + (hi - lo) / 2;
      int keep_lo = lo, keep_hi = mid, send_lo = mid, send_hi = hi;
      if (newrank & mask) std::swap(keep_lo, send_lo), std::swap(keep_hi, send_hi);
      const std::size_t so = l.offset[send_lo], sn = l.offset[send_hi] - so;
      const std::size_t ko = l.offset[keep_lo], kn = l.offset[keep_hi] - ko;
      RequestPtr s = sn ? c.isend(partner, base + so * es, sn * es) : nullptr;
      RequestPtr q = kn ? c.irecv_reduce(partner, base + ko * es, kn, t, op) : nullptr;
      c.wait(q);
      c.wait(s);
      lo = keep_lo, hi = keep_hi;
    }
    finish_avg(base + l.offset[newrank] * es, l.count(newrank), t, op, p);
    // ---- all-gather by recursive doubling: exchange the owned aligned group of blocks ----
    for (int mask = 1; mask < pof2; mask *= 2) {
      const int partner_new = newrank ^ mask;
      const int mine = newrank & ~(mask - 1), theirs = partner_new & ~(mask - 1);
      const std::size_t mo = l.offset[mine], mn = l.offset[mine + mask] - mo;
      const std::size_t to = l.offset[theirs], tn = l.offset[theirs + mask] - to;
      RequestPtr s = mn ? c.isend(real(partner_new), base + mo * es, mn * es) : nullptr;
      RequestPtr q = tn ? c.irecv(real(partner_new), base + to * es, tn * es) : nullptr;
      c.wait(q);
      c.wait(s);
    }
  }

  // ---- hand the result back to the ranks that sat out ----
  if (r < 2 * rem) {
    if (r % 2 == 1) {
      auto s = c.isend(r - 1, base, count * es);
      c.wait(s);
    } else {
      auto q = c.irecv(r + 1, base, count * es);
      c.wait(q);
    }
  }
}

}  // namespace meshtrain::comm
