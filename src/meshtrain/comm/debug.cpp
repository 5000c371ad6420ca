// Debug mode: before a collective runs, every rank sends its signature (operation, element
// type, reduction, root, element count, sequence number) to rank 0 of the group, which
// compares them and answers all ranks with a verdict naming the first rank that differs. A
// mismatched call thus fails everywhere with CommError(mismatch) instead of deadlocking or
// corrupting data. Costs one gather and one scatter of a few bytes per collective.
// Turn on with MESHTRAIN_COMM_DEBUG=1 or Communicator::set_debug(true).
#include <cstring>
#include <sstream>

#include "meshtrain/comm/communicator.h"

namespace meshtrain::comm {

namespace {
struct Signature {
  std::int32_t kind, type, op, root;
  std::uint64_t count, seq, counts_hash;
};
struct Verdict {
  std::int32_t bad_rank;  // -1: all agree
  char text[244];
};

Signature signature_of(const Communicator::Call& c, std::uint64_t seq) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto n : c.counts) h = (h ^ n) * 1099511628211ull;
  const bool reduces = c.kind == OpKind::all_reduce || c.kind == OpKind::reduce_scatter || c.kind == OpKind::reduce;
  const bool rooted = c.kind == OpKind::broadcast || c.kind == OpKind::reduce;
  return {static_cast<std::int32_t>(c.kind), static_cast<std::int32_t>(c.type),
          reduces ? static_cast<std::int32_t>(c.op) : 0, rooted ? c.root : 0, c.count, seq, h};
}

std::string describe(const Signature& s) {
  std::ostringstream o;
  o << to_string(static_cast<OpKind>(s.kind)) << " #" << s.seq << "(count=" << s.count << ", "
    << to_string(static_cast<DType>(s.type));
  if (s.kind == static_cast<int>(OpKind::all_reduce) || s.kind == static_cast<int>(OpKind::reduce_scatter) ||
      s.kind == static_cast<int>(OpKind::reduce))
    o << ", " << to_string(static_cast<ReduceOp>(s.op));
  if (s.kind == static_cast<int>(OpKind::broadcast) || s.kind == static_cast<int>(OpKind::reduce)) o << ", root=" << s.root;
  o << ")";
  return o.str();
}

bool same(const Signature& a, const Signature& b) {
  // all_gather / reduce_scatter counts may differ per rank; their per-rank lists must agree.
  const bool per_rank = a.kind == static_cast<int>(OpKind::all_gather) || a.kind == static_cast<int>(OpKind::reduce_scatter);
  return a.kind == b.kind && a.type == b.type && a.op == b.op && a.root == b.root && a.seq == b.seq &&
         a.counts_hash == b.counts_hash && (per_rank || a.count == b.count);
}
}  // namespace

void check_same_collective(OpContext& ctx, const Communicator::Call& c, std::uint64_t seq) {
  const int p = ctx.size(), r = ctx.rank();
  if (p == 1) return;
  const Signature mine = signature_of(c, seq);
  Verdict v{};
  if (r != 0) {
    auto s = ctx.isend(0, &mine, sizeof mine, kTagDebug);
    auto q = ctx.irecv(0, &v, sizeof v, kTagDebug);
    ctx.wait(s);
    ctx.wait(q);
  } else {
    std::vector<Signature> all(p);
    std::vector<RequestPtr> reqs;
    for (int i = 1; i < p; ++i) reqs.push_back(ctx.irecv(i, &all[i], sizeof(Signature), kTagDebug));
    ctx.wait_all(reqs);
    v.bad_rank = -1;
    for (int i = 1; i < p && v.bad_rank < 0; ++i) {
      if (same(mine, all[i])) continue;
      v.bad_rank = i;
      const std::string t = "rank 0 called " + describe(mine) + " but rank " + std::to_string(i) + " called " + describe(all[i]);
      std::strncpy(v.text, t.c_str(), sizeof v.text - 1);
    }
    for (int i = 1; i < p; ++i) reqs.push_back(ctx.isend(i, &v, sizeof v, kTagDebug));
    ctx.wait_all(reqs);
  }
  if (v.bad_rank >= 0) ctx.fail(ErrorKind::mismatch, {v.bad_rank}, v.text);
}

}  // namespace meshtrain::comm
