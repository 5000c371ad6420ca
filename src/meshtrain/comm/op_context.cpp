// OpContext waits and block layouts (see op_context.h).
#include "meshtrain/comm/op_context.h"

#include <sstream>

namespace meshtrain::comm {

// ---- messages ----
RequestPtr OpContext::isend(int peer, const void* buf, std::size_t bytes, int tag) {
  stats_.bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
  if (hosts_ && (*hosts_)[peer] != (*hosts_)[t_.rank()])
    stats_.bytes_sent_cross_host.fetch_add(bytes, std::memory_order_relaxed);
  return t_.isend(peer, tag, buf, bytes);
}
RequestPtr OpContext::irecv(int peer, void* buf, std::size_t bytes, int tag) {
  stats_.bytes_received.fetch_add(bytes, std::memory_order_relaxed);
  return t_.irecv(peer, tag, buf, bytes, /*collective_mode=*/true);
}
RequestPtr OpContext::irecv_reduce(int peer, void* inout, std::size_t count, DType t, ReduceOp op) {
  stats_.bytes_received.fetch_add(count * dtype_size(t), std::memory_order_relaxed);
  return t_.irecv_reduce(peer, kTagCollective, inout, count, t, op);
}

// ---- waits ----
void OpContext::fail(ErrorKind kind, std::vector<int> ranks, const std::string& detail) const {
  throw CommError(kind, op_, group_, seq_, std::move(ranks), detail);
}

void OpContext::wait(RequestPtr& r) {
  if (!r) return;
  const int peer = r->peer();
  bool done = false;
  t_.waiting(op_, group_, seq_, peer);
  struct Clear {
    Transport& t;
    ~Clear() { t.waiting(nullptr, {}, 0, -1); }
  } clear{t_};
  try {
    done = r->wait_until(deadline_);
  } catch (const PeerFailure& e) {
    // Name the ranks known to have failed; else those that never entered this operation.
    // Say what this rank itself was waiting for: when two ranks wait on a third that left, the
    // one whose deadline fires first blames its neighbour, and only this line names the third.
    std::vector<int> missing = e.ranks.empty() ? t_.not_arrived(seq_) : e.ranks;
    fail(ErrorKind::peer_failed, std::move(missing),
         std::string(e.what()) + "; this rank was waiting for rank " + std::to_string(peer));
  }
  if (!done) {
    std::vector<int> missing = t_.not_arrived(seq_);
    std::ostringstream why;
    why << "deadline passed while waiting for rank " << peer;
    if (missing.empty()) {
      missing = t_.late_ranks(peer);
      if (missing != std::vector<int>{peer})
        why << "; rank " << peer << " was itself waiting for " << format_ranks(missing)
            << ", which did not post its side (busy outside communication)";
    }
    t_.note_silent(missing);
    CommError e(ErrorKind::timeout, op_, group_, seq_, std::move(missing), why.str());
    t_.abort(std::string("rank ") + std::to_string(t_.rank()) + " of '" + group_ + "': " + e.what());
    throw e;
  }
  r.reset();
}

// ---- shared memory ----
void OpContext::count_bytes(std::size_t sent, std::size_t received) {
  stats_.bytes_sent.fetch_add(sent, std::memory_order_relaxed);
  stats_.bytes_received.fetch_add(received, std::memory_order_relaxed);
}

void OpContext::shm_wait(SharedMemory& m, int phase, void* buf, std::uint64_t exchange) {
  bool done = false;
  t_.waiting(op_, group_, seq_, (t_.rank() + 1) % t_.size());  // mpi: what a SIGTERM handler prints
  struct Clear {
    Transport& t;
    ~Clear() { t.waiting(nullptr, {}, 0, -1); }
  } clear{t_};
  try {
    done = phase == 0 ? m.publish(exchange, buf, deadline_) : m.finish(exchange, deadline_);
  } catch (const PeerFailure& e) {
    fail(ErrorKind::peer_failed, e.ranks.empty() ? m.missing(exchange, phase) : e.ranks, e.what());
  }
  if (done) return;
  std::vector<int> missing = m.missing(exchange, phase);
  std::ostringstream why;
  why << "deadline passed while waiting for rank " << (missing.empty() ? -1 : missing.front())
      << (phase == 0 ? " to enter the shared-memory exchange" : " to finish the shared-memory exchange");
  t_.note_silent(missing);
  CommError e(ErrorKind::timeout, op_, group_, seq_, std::move(missing), why.str());
  t_.abort(std::string("rank ") + std::to_string(t_.rank()) + " of '" + group_ + "': " + e.what());
  throw e;
}

void OpContext::wait_all(std::vector<RequestPtr>& rs) {
  for (auto& r : rs) wait(r);
  rs.clear();
}

// ---- layouts ----
Layout even_layout(std::size_t count, int p) {
  Layout l;
  l.offset.resize(p + 1);
  const std::size_t base = count / p, extra = count % p;
  l.offset[0] = 0;
  for (int i = 0; i < p; ++i) l.offset[i + 1] = l.offset[i] + base + (static_cast<std::size_t>(i) < extra ? 1 : 0);
  return l;
}

Layout counts_layout(const std::vector<std::size_t>& counts) {
  Layout l;
  l.offset.resize(counts.size() + 1);
  l.offset[0] = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) l.offset[i + 1] = l.offset[i] + counts[i];
  return l;
}

}  // namespace meshtrain::comm
