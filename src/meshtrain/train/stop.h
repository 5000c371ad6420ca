// A graceful stop on SIGINT, SIGTERM and SIGUSR1 (the signal mpirun passes on to every rank of
// its job, which `meshtrain launch` sends to stop an MPI job). `meshtrain train` installs it:
// the first signal asks the run to stop at the end of the step in flight — every rank agrees on
// that step (a max all-reduce of the flag over the world at each step's end, made only while
// the stop is installed, so library callers and tests see no extra collective), a checkpoint is
// written there when the run has a checkpoint directory, the step's metrics line is written,
// and the run returns with TrainResult::stopped_by set; the program then exits 0. A second
// signal ends the process at once with 128 + the signal (130 for SIGINT, 143 for SIGTERM, 138
// for SIGUSR1): a checkpoint being written is then left unfinished in its temporary folder, and
// `latest` keeps naming the last complete one (checkpoints are committed by a rename,
// checkpoint/checkpoint.h). A commit's last moves (the step folder installed, `latest` rewritten
// through `latest.tmp`) run inside a StopDeferred scope (checkpoint/stop_deferred.h, below
// train/ so that the checkpoint library need not link the trainer): a second signal that comes
// then ends the process as soon as the scope closes, so it never leaves `latest.tmp` behind or an
// installed step folder that `latest` does not name. The signals are received by a thread of their own, never by a thread
// that computes. Under MPI, SIGTERM is left to the MPI backend (the launcher's kill of a job
// whose peer died, reported with what the rank was waiting for): stop an MPI job with SIGUSR1
// (mpirun passes it on) or SIGINT to a rank, or through `meshtrain launch`.
#pragma once

namespace meshtrain::train {

// Installs the stop for SIGINT, SIGUSR1 and (with_sigterm) SIGTERM; idempotent. Call it before
// any other thread starts: the signals are blocked in the calling thread, so in those it starts.
void install_stop_handlers(bool with_sigterm = true);
bool stop_handlers_installed();
// The signal that asked for a stop (0: none yet).
int stop_signal();
// "SIGINT", "SIGTERM", "SIGUSR1" or "a signal".
const char* signal_name(int sig);

}  // namespace meshtrain::train
