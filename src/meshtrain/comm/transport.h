// The backend interface: point-to-point messages among the members of one group. Every
// collective algorithm (ring, rhd, tree, direct) is written once over this interface, as in
// Gloo, so the threads and mpi backends run the same algorithm code.
//
// Contract:
// - Messages between one (source, destination, tag) triple are matched in posting order.
// - A Request's buffer must stay valid until the request completes or is destroyed; the
//   destructor of a pending request cancels it (a peer never writes into a dead buffer).
// - irecv_reduce receives `count` elements and reduces them into `inout` (inout op= message);
//   a shared-memory backend reads the sender's buffer directly, so it costs no extra copy.
// - Requests are completed by test()/wait_until() of the thread that owns them (and, on the
//   threads backend, by the peer when it arrives second). Waits spin briefly, then block.
// - A transport is used by one thread at a time per communicator (the communicator serialises
//   its operations); distinct communicators may be used from distinct threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/types.h"

namespace meshtrain::comm {

// Internal tags live above the user range [0, kMaxUserTag].
inline constexpr int kTagCollective = kMaxUserTag + 1;
inline constexpr int kTagDebug = kMaxUserTag + 2;

// ---- Request ----
class Request {
 public:
  virtual ~Request() = default;
  // True once complete. Throws PeerFailure when the peer is known to be gone.
  virtual bool test() = 0;
  // Blocks until complete (true) or the deadline passes (false). Throws PeerFailure.
  virtual bool wait_until(Clock::time_point deadline) = 0;
  virtual int peer() const = 0;
};
using RequestPtr = std::unique_ptr<Request>;

// ---- native collectives (mpi backend) ----
enum class OpKind : std::uint8_t {
  all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, barrier
};
const char* to_string(OpKind k);

// One collective as described to a backend's own implementation (Algorithm::native).
// in/out follow the Communicator conventions; counts is per rank for reduce_scatter and
// all_gather (equal counts are spelled out too).
struct NativeCall {
  OpKind kind;
  DType dtype;
  ReduceOp op;
  int root;
  const void* in;
  void* out;
  std::size_t count;
  const std::vector<std::size_t>* counts;
};

// ---- shared memory ----
// The members of a group on one machine can read and write each other's data while all of
// them are inside the same collective, which lets an all-reduce touch each byte the minimum
// number of times (shm.cpp). On threads (one address space) the data are the callers' own
// buffers; on mpi each process has a segment of memory shared with the others, stage(), of
// limit() bytes, into which the caller copies its data first and from which it copies the
// result. The protocol, per collective `seq` (the communicator's sequence number, equal on
// every member):
// - publish(seq, buf): announce this member's buffer (its stage() where it has one), wait until
//   every member announced its own; buffer(q) is then member q's buffer for this collective;
// - finish(seq): announce that this member is done with the others' buffers, wait until every
//   member said the same (after which each may use its own buffer again).
// Waits spin, then yield, then sleep on a doorbell, and return false at the deadline; they
// throw PeerFailure when a member returned or threw, or the job was aborted. Neither call
// allocates, and while the members answer within the spin neither makes a system call.
class SharedMemory {
 public:
  virtual ~SharedMemory() = default;
  virtual void* stage() { return nullptr; }  // nullptr: the callers' buffers are shared as they are
  virtual std::size_t limit() const { return SIZE_MAX; }  // the most bytes one collective can exchange
  virtual bool publish(std::uint64_t seq, void* buf, Clock::time_point deadline) = 0;
  virtual void* buffer(int member) const = 0;
  virtual bool finish(std::uint64_t seq, Clock::time_point deadline) = 0;
  // Diagnostics: the members that have not yet published (phase 0) or finished (phase 1) `seq`.
  virtual std::vector<int> missing(std::uint64_t seq, int phase) const = 0;
};

// ---- Transport ----
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "threads" or "mpi"

  virtual RequestPtr isend(int peer, int tag, const void* buf, std::size_t bytes) = 0;
  // collective_mode: the receiver does the data movement in its own wait (balances the work
  // of ring steps); otherwise whoever arrives second copies, so user messages progress
  // without either side waiting.
  virtual RequestPtr irecv(int peer, int tag, void* buf, std::size_t bytes, bool collective_mode) = 0;
  virtual RequestPtr irecv_reduce(int peer, int tag, void* inout, std::size_t count, DType t, ReduceOp op) = 0;

  // A transport over `members` (ranks of this group, in the new rank order); every member
  // calls it with the same arguments. `split_id` is the same on all members of the parent.
  virtual std::unique_ptr<Transport> split(const std::vector<int>& members, int color,
                                           std::uint64_t split_id) = 0;
  // split() for a group that will exchange through its shared memory (hier's ranks of one
  // host): where the backend stages data in a shared segment (mpi), the new group's segment
  // holds at least `stage_bytes` per member. Elsewhere the same as split().
  virtual std::unique_ptr<Transport> split_shared(const std::vector<int>& members, int color,
                                                  std::uint64_t split_id, std::size_t stage_bytes) {
    (void)stage_bytes;
    return split(members, color, split_id);
  }

  // Diagnostics: record that this rank entered collective `seq`; list the members that have
  // not entered it yet (empty when the backend cannot tell).
  virtual void note_entered(std::uint64_t seq) { (void)seq; }
  virtual std::vector<int> not_arrived(std::uint64_t seq) const { (void)seq; return {}; }

  // Diagnostics: a wait on `peer` missed its deadline; the members to blame. A backend that can
  // see who waits for whom (threads) names the ranks holding `peer` up when `peer` was itself
  // waiting; otherwise (and by default) {peer}. Never empty.
  virtual std::vector<int> late_ranks(int peer) const { return {peer}; }

  // Diagnostics: the operation about to block (the mpi backend prints it if the launcher
  // terminates the process while it waits, e.g. because a peer process died). op == nullptr:
  // the wait is over.
  virtual void waiting(const char* op, const std::string& group, std::uint64_t seq, int peer) {
    (void)op; (void)group; (void)seq; (void)peer;
  }

  // Make every member's pending and future waits fail (after a timeout or a failed rank).
  virtual void abort(const std::string& reason) = 0;
  // The members that did not answer by a deadline (called before abort). A backend that gives
  // the others time to report before it ends the job (mpi) need not wait for these.
  virtual void note_silent(const std::vector<int>& ranks) { (void)ranks; }

  // The group's shared memory, where the members share an address space (nullptr otherwise).
  virtual SharedMemory* shared_memory() { return nullptr; }

  // The backend's own collective (Algorithm::native); `unsupported` where it has none.
  enum class NativeResult { done, timeout, unsupported };
  virtual NativeResult native(const NativeCall& call, Clock::time_point deadline) {
    (void)call; (void)deadline;
    return NativeResult::unsupported;
  }
};

}  // namespace meshtrain::comm
