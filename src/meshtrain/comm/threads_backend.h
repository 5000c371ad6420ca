// The threads backend (the default, embedded): N ranks as threads of one process exchanging
// through shared memory. A message is never staged: the receiver copies (or reduces) straight
// from the sender's buffer, so a ring all-reduce step costs one pass over the data.
//
// run_threads(world, fn) starts `world` threads, gives each its rank's world communicator,
// joins them all, and rethrows on the caller the earliest exception a rank threw. A rank that
// throws or returns while others still wait on it makes their waits fail at once (peer_failed);
// a rank that never arrives makes them fail at their deadline (timeout). Either way the whole
// fabric is then aborted, so no rank waits out a second deadline.
#pragma once

#include <functional>
#include <string>

#include "meshtrain/comm/communicator.h"

namespace meshtrain::comm {

struct ThreadsOptions {
  Timeout timeout{0};       // per-operation deadline (0: the global default)
  int debug = -1;           // collective signature checks (-1: MESHTRAIN_COMM_DEBUG)
  std::string name = "world";
};

void run_threads(int world, const std::function<void(Communicator&)>& fn, const ThreadsOptions& opts = {});

}  // namespace meshtrain::comm
