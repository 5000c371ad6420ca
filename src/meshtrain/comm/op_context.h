// OpContext: what a collective algorithm sees while it runs — the group's point-to-point
// transport, the deadline, the pipelining segment, and waits that turn timeouts and dead peers
// into CommErrors carrying the operation, group, sequence number and ranks not heard from.
//
// An OpContext lives for one operation on one thread; algorithms hold no other state.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/error.h"
#include "meshtrain/comm/transport.h"

namespace meshtrain::comm {

// Counters a communicator shares with its running operations (atomics: the progress thread
// and the caller both update them).
struct StatsCounters {
  std::atomic<std::uint64_t> bytes_sent{0}, bytes_received{0}, ops{0};
  std::atomic<std::uint64_t> bytes_sent_cross_host{0};  // sent to a member on another host
  std::atomic<std::uint64_t> wait_ns{0};
};

// ---- OpContext ----
class OpContext {
 public:
  OpContext(Transport& t, const char* op, const std::string& group, std::uint64_t seq,
            Clock::time_point deadline, std::size_t chunk_bytes, StatsCounters& stats,
            const std::vector<int>* hosts = nullptr)
      : t_(t), op_(op), group_(group), seq_(seq), deadline_(deadline), chunk_bytes_(chunk_bytes), stats_(stats),
        hosts_(hosts) {}

  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  std::size_t chunk_bytes() const { return chunk_bytes_; }  // pipelining segment, > 0
  Transport& transport() { return t_; }
  Clock::time_point deadline() const { return deadline_; }
  std::uint64_t seq() const { return seq_; }

  RequestPtr isend(int peer, const void* buf, std::size_t bytes, int tag = kTagCollective);
  RequestPtr irecv(int peer, void* buf, std::size_t bytes, int tag = kTagCollective);
  RequestPtr irecv_reduce(int peer, void* inout, std::size_t count, DType t, ReduceOp op);

  // Shared memory (shm.cpp): SharedMemory::publish and finish for this operation's sequence
  // number, their failures turned into CommErrors as wait()'s are.
  void shm_publish(SharedMemory& m, void* buf) { shm_wait(m, 0, buf, seq_); }
  void shm_finish(SharedMemory& m) { shm_wait(m, 1, nullptr, seq_); }
  // The same for one of several exchanges inside this operation (hier's pipeline steps):
  // `exchange` numbers them, increasing over the group's lifetime and equal on every member;
  // errors still name this operation's sequence number.
  void shm_publish(SharedMemory& m, void* buf, std::uint64_t exchange) { shm_wait(m, 0, buf, exchange); }
  void shm_finish(SharedMemory& m, std::uint64_t exchange) { shm_wait(m, 1, nullptr, exchange); }
  // Counts bytes an algorithm moved without messages (written to and read from other members).
  void count_bytes(std::size_t sent, std::size_t received);

  void wait(RequestPtr& r);                  // throws CommError
  void wait_all(std::vector<RequestPtr>& rs);  // throws CommError; clears rs

  [[noreturn]] void fail(ErrorKind kind, std::vector<int> ranks, const std::string& detail) const;

 private:
  void shm_wait(SharedMemory& m, int phase, void* buf, std::uint64_t exchange);
  Transport& t_;
  const char* op_;
  const std::string& group_;
  std::uint64_t seq_;
  Clock::time_point deadline_;
  std::size_t chunk_bytes_;
  StatsCounters& stats_;
  const std::vector<int>* hosts_;  // host of each member of t_ (nullptr: all on one host)
};

// ---- block layouts ----
// Offsets (in elements) of p blocks; blocks[i] = [offset[i], offset[i+1]).
struct Layout {
  std::vector<std::size_t> offset;  // p + 1 entries
  std::size_t count(int i) const { return offset[i + 1] - offset[i]; }
  std::size_t total() const { return offset.back(); }
};
Layout even_layout(std::size_t count, int p);                // near-equal blocks
Layout counts_layout(const std::vector<std::size_t>& counts);  // given per-rank counts

}  // namespace meshtrain::comm
