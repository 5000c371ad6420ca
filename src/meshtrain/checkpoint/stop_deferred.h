// Deferring a stop's exit while a checkpoint commits (checkpoint.h: the step folder installed,
// `latest` rewritten through `latest.tmp`). train/stop.h's second signal ends the process
// through exit_when_undeferred: at once when no StopDeferred scope is open, else as soon as the
// last one closes, so a commit is never cut between its renames. It lives here, below train/,
// because the checkpoint library opens the scopes and must not link the trainer; the signal
// handling that calls exit_when_undeferred stays in train/stop.cpp.
#pragma once

namespace meshtrain::train {

// While one lives (on any thread), a second signal's exit waits for its end; nests. Keep the
// scope short: a few renames and fsyncs.
class StopDeferred {
 public:
  StopDeferred();
  ~StopDeferred();
  StopDeferred(const StopDeferred&) = delete;
  StopDeferred& operator=(const StopDeferred&) = delete;
};

// Ends the process with `code` (::_exit) now when no StopDeferred scope is open, else when the
// last one closes. Async-signal-safe: it touches lock-free atomics only (train/stop.cpp calls it
// from its signal thread and, for threads started before the stop was installed, a handler).
void exit_when_undeferred(int code);

}  // namespace meshtrain::train
