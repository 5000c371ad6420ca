// A graceful stop on SIGINT and SIGTERM. `meshtrain train` installs the handlers: the first
// signal asks the run to stop at the end of the step in flight — every rank agrees on that step
// (a max all-reduce of the flag over the world at each step's end, made only while the handlers
// are installed, so library callers and tests see no extra collective), a checkpoint is written
// there when the run has a checkpoint directory, the step's metrics line is written, and the
// run returns with TrainResult::stopped_by set; the program then exits 0. A second signal ends
// the process at once with 128 + the signal (130 for SIGINT, 143 for SIGTERM): a checkpoint
// being written is then left unfinished in its temporary folder, and `latest` keeps naming the
// last complete one (checkpoints are committed by a rename, train/checkpoint.h).
#pragma once

namespace meshtrain::train {

// Installs the handlers for SIGINT and SIGTERM (idempotent).
void install_stop_handlers();
bool stop_handlers_installed();
// The signal that asked for a stop (0: none yet).
int stop_signal();
// "SIGINT", "SIGTERM" or "signal N".
const char* signal_name(int sig);

}  // namespace meshtrain::train
