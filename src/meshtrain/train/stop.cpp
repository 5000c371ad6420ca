#include "meshtrain/train/stop.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <thread>

#include "meshtrain/checkpoint/stop_deferred.h"

namespace meshtrain::train {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

// The first signal asks for the stop, a second one ends the process at once, or when the last
// StopDeferred scope closes (checkpoint/stop_deferred.h). Async-signal-safe (it also runs as a
// handler, below).
extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    static const char msg[] =
        "\nmeshtrain: stop requested: finishing this step, then a checkpoint (send the signal again to exit at "
        "once)\n";
    const ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    return;
  }
  exit_when_undeferred(128 + sig);
}

}  // namespace

void install_stop_handlers(bool with_sigterm) {
  if (g_installed.exchange(true)) return;
  // The signals are taken by one thread of their own (sigwait), never by a thread that
  // computes: blocked here, and so in every thread started after (the ranks' threads, the
  // libraries' pools). A handler that interrupts a GEMM kernel's thread has been seen to
  // corrupt the process (under MPI the main thread is a rank's compute thread).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);
  if (with_sigterm) sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A thread started before this call (a library's pool) may still take one: the same stop
  // there, through a handler, rather than the default end of the process.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGUSR1, SIGTERM})
    if (sigismember(&set, sig)) sigaction(sig, &sa, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) on_stop_signal(sig);
    }
  }).detach();
}

bool stop_handlers_installed() { return g_installed.load(); }

int stop_signal() { return g_signal.load(); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace meshtrain::train
