#include "meshtrain/checkpoint/stop_deferred.h"

#include <unistd.h>

#include <atomic>

namespace meshtrain::train {

namespace {

std::atomic<int> g_deferred{0};   // StopDeferred scopes open
std::atomic<int> g_exit_code{0};  // a second signal's exit code, waiting for them to close
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

}  // namespace

// The exit code is published before the scopes are counted, and a scope's end counts before it
// reads the code (both sequentially consistent), so one of the two sees the other and exits.
void exit_when_undeferred(int code) {
  g_exit_code.store(code);
  if (g_deferred.load() == 0) ::_exit(code);
}

StopDeferred::StopDeferred() { g_deferred.fetch_add(1); }

StopDeferred::~StopDeferred() {
  if (g_deferred.fetch_sub(1) == 1)
    if (const int code = g_exit_code.load()) ::_exit(code);
}

}  // namespace meshtrain::train
