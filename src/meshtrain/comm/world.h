// Getting the world communicator: which backend, and how ranks start.
// - threads: run_threads(world, fn) (threads_backend.h) runs fn once per rank in this process.
// - mpi: ranks are processes started by `mpirun`; mpi_world() initialises MPI on first use and
//   returns this process's world communicator (one per process: MPI forces that global).
// run_world(backend, world, fn) hides the difference for `meshtrain train` and `bench comm`.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/threads_backend.h"

namespace meshtrain::comm {

enum class Backend { threads, mpi };
const char* to_string(Backend b);

// True when this process was started by mpirun/mpiexec (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK set).
bool launched_by_mpirun();
// The backend to use when the user did not say: mpi under mpirun, threads otherwise.
Backend default_backend();
// Whether this build has the mpi backend (OpenMPI found at configure time).
bool have_mpi();

// The MPI world communicator of this process (throws std::runtime_error without MPI).
// MPI is finalised at exit; if any operation failed, MPI_Abort is called instead so the other
// processes of the job end too rather than wait.
std::shared_ptr<Communicator> mpi_world(const Communicator::Config& cfg = {});
// Marks this process failed and tells the other processes why (their pending waits end now
// with a CommError carrying `reason`); at exit the job is then aborted instead of finalised.
// run_world calls it when fn throws under mpi.
void mpi_report_failure(const std::string& reason);
// Ends the whole MPI job now (after a rank reported an error it cannot recover from).
[[noreturn]] void mpi_abort(int code);

// Emulated hosts: `ranks_per_host` consecutive ranks to a host (ranks [0, K) host 0, [K, 2K)
// host 1, ...), for Communicator::set_hosts. ranks_per_host must be at least 1.
std::vector<int> hosts_in_blocks(int ranks, int ranks_per_host);

// Runs fn on every rank of the world: `world` threads for threads; for mpi, fn runs once in
// this process on mpi_world() (world must be 0 or the mpirun size).
void run_world(Backend b, int world, const std::function<void(Communicator&)>& fn, const ThreadsOptions& opts = {});

}  // namespace meshtrain::comm
