#include "meshtrain/train/stop.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace meshtrain::train {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

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
  ::_exit(128 + sig);  // the second signal
}

}  // namespace

void install_stop_handlers() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_handlers_installed() { return g_installed.load(); }

int stop_signal() { return g_signal.load(); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace meshtrain::train
