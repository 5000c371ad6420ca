// The threads backend (the default, embedded): N ranks as threads of one process exchanging
// through shared memory. A message is never staged: the receiver copies (or reduces) straight
// from the sender's buffer, so a ring all-reduce step costs one pass over the data.
//
// run_threads(world, fn) starts `world` threads, gives each its rank's world communicator,
// joins them all, and rethrows on the caller the earliest exception a rank threw. A rank that
// throws or returns while others still wait on it makes their waits fail at once (peer_failed);
// a rank that never arrives makes them fail at their deadline (timeout). Either way the whole
// fabric is then aborted, so no rank waits out a second deadline.
//
// Limits and failure modes:
// - A thread that cannot be started (std::thread throws: the process reached its limit on
//   threads or memory) aborts the ranks already started, joins them and throws ThreadStartError.
// - A rank busy outside communication (in compute) sees an abort only at its next operation.
//   When ranks are still running `stuck_grace` after the first failure, the stuck-ranks
//   handler (ThreadsOptions::on_stuck, else the process-wide one) is called on the caller's
//   thread with the first error and those ranks; it may end the process (meshtrain's CLI prints
//   the error and exits 1). Without a handler, or if it returns, run_threads keeps waiting.
#pragma once

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/communicator.h"

namespace meshtrain::comm {

// Gets the first failure of the run and the world ranks still running.
using StuckRanksHandler = std::function<void(std::exception_ptr first, const std::vector<int>& stuck)>;

struct ThreadsOptions {
  Timeout timeout{0};       // per-operation deadline (0: the global default)
  int debug = -1;           // collective signature checks (-1: MESHTRAIN_COMM_DEBUG)
  std::string name = "world";
  StuckRanksHandler on_stuck{};  // empty: the process-wide handler (set_stuck_ranks_handler)
  Timeout stuck_grace{0};      // 0: the process-wide grace (3 s unless set)
  // Kernel threads each rank computes with (0: not known). With 1, ranks that outnumber the
  // cores are bound to them (core_binding below).
  int threads_per_rank = 0;
  // Test hook: starts one rank's thread (empty: std::thread). May throw as std::thread does.
  std::function<std::thread(int rank, std::function<void()> body)> start_thread{};
};

// A rank's thread could not be started; the ranks already started were stopped and joined.
class ThreadStartError : public std::runtime_error {
 public:
  ThreadStartError(int rank, int world, const std::string& reason);
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  int rank_, world_;
};

// The handler used when ThreadsOptions::on_stuck is empty, and its grace (> 0). Process-wide
// (like Communicator::set_default_timeout): ending a process is the program's decision.
void set_stuck_ranks_handler(StuckRanksHandler h, Timeout grace = std::chrono::seconds(3));

// The CPUs this process may run on: its main thread's affinity mask (rank threads may be bound),
// in order; empty when the system does not say.
std::vector<int> allowed_cpus();

// The core each rank's thread is bound to, or empty when the ranks are left to the scheduler.
// Bound only when ranks of one kernel thread outnumber the cores this process may use (its
// affinity mask) and fill them evenly: rank r on the (r mod n)-th of those n cores. The mesh's
// rank formula makes the tensor-parallel peers adjacent ranks and the data-parallel ones the
// next axis, so the ranks that compute in step land on different cores, and the pipeline stages
// that take turns share one. Unbound, the scheduler at times puts two tp peers on one core,
// where every all-reduce waits for a switch: gpt-tiny at tp 2 x pp 2 on 2 cores ran steps of
// 21.2-30.0 ms unbound against 21.1-22.7 bound (docs/benchmarks.md). MESHTRAIN_COMM_PIN=0
// turns it off.
std::vector<int> core_binding(int world, int threads_per_rank);

void run_threads(int world, const std::function<void(Communicator&)>& fn, const ThreadsOptions& opts = {});

}  // namespace meshtrain::comm
