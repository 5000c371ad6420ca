// Backend choice and the run_world helper (see world.h). The MPI parts live in mpi/; without
// MPI the stubs here report that the build lacks it.
#include "meshtrain/comm/world.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace meshtrain::comm {

const char* to_string(Backend b) { return b == Backend::mpi ? "mpi" : "threads"; }

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::vector<int> hosts_in_blocks(int ranks, int ranks_per_host) {
  std::vector<int> h(static_cast<std::size_t>(std::max(0, ranks)));
  for (int r = 0; r < ranks; ++r) h[static_cast<std::size_t>(r)] = r / std::max(1, ranks_per_host);
  return h;
}

Backend default_backend() { return launched_by_mpirun() && have_mpi() ? Backend::mpi : Backend::threads; }

#ifndef MESHTRAIN_HAVE_MPI
bool have_mpi() { return false; }
std::shared_ptr<Communicator> mpi_world(const Communicator::Config&) {
  throw std::runtime_error("this meshtrain was built without MPI (install libopenmpi-dev and reconfigure)");
}
void mpi_abort(int code) { std::exit(code); }
void mpi_report_failure(const std::string&) {}
#endif

void run_world(Backend b, int world, const std::function<void(Communicator&)>& fn, const ThreadsOptions& opts) {
  if (b == Backend::threads) {
    run_threads(world, fn, opts);
    return;
  }
  auto comm = mpi_world({opts.timeout, opts.debug});
  if (world != 0 && world != comm->size())
    throw std::invalid_argument("--world " + std::to_string(world) + " differs from the " + std::to_string(comm->size()) +
                                " processes mpirun started");
  try {
    fn(*comm);
  } catch (const std::exception& e) {
    mpi_report_failure("rank " + std::to_string(comm->rank()) + " failed: " + e.what());
    throw;
  }
}

}  // namespace meshtrain::comm
