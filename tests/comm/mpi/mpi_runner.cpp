// The mpirun-launched side of the comm tests (registered by tests/comm/extra.cmake). One
// process per rank; the mode is the first argument:
//   checks      every operation x algorithm (native included) x count against the serial
//               reference of checks.h, on the world and on split sub-groups; exit 0 when all pass.
//   exit        the last rank exits (without MPI_Finalize) before all_reduce #1; the others must
//               report a CommError naming all_reduce, 'world', #1.
//   throw       rank 1 throws before all_reduce #1; the others must report a CommError carrying
//               its reason (the notice, not the 30 s deadline, ends them).
//   never       the last rank never calls all_reduce #1 (it sleeps until the job is aborted); the
//               others must report a timeout naming it.
//   hier        hosts emulated in blocks of 2 ranks (set_hosts), so each host's ranks share an
//               MPI-3 window: hier sliced (MESHTRAIN_COMM_HIER_SLICE_BYTES small, many pieces)
//               equals hier unsliced bit for bit at 2 hosts, the reference exactly on integers,
//               and its cross-host bytes total 2 (H-1) x n.
// Each rank prints one line "RESULT rank=<r> <what>" that the ctest regex checks.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "../checks.h"
#include "meshtrain/comm/world.h"

namespace mc = meshtrain::comm;
using namespace std::chrono_literals;

namespace {
int run_checks() {
  auto w = mc::mpi_world({.timeout = 60s});
  mc::testing::check_everything(*w);
  auto g = w->split(w->rank() % 2, w->rank(), "parity");
  mc::testing::check_all_reduce<float>(*g, 1031, mc::Algorithm::native, mc::ReduceOp::sum, 0, 0);
  mc::testing::check_all_reduce<float>(*g, 4099, mc::Algorithm::ring, mc::ReduceOp::max, 256, 0);
  mc::testing::check_all_gather<float>(*g, 13, mc::Algorithm::ring, true, false);
  w->barrier();
  std::printf("RESULT rank=%d checks passed (world %d)\n", w->rank(), w->size());
  return 0;
}

int run_hier() {
  auto w = mc::mpi_world({.timeout = 60s});
  const int p = w->size(), K = 2, H = p / K;
  if (p % K != 0 || H < 2) {
    std::printf("RESULT rank=%d hier needs an even world of 4 or more\n", w->rank());
    return 1;
  }
  w->set_hosts(mc::hosts_in_blocks(p, K));
  int bad = 0;
  for (std::size_t n : {std::size_t{4097}, std::size_t{65543}, std::size_t{300001}}) {
    std::vector<float> in(n), sliced(n), whole(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = 1.0f / float(1 + (i * 7 + static_cast<std::size_t>(w->rank()) * 13) % 97);
    setenv("MESHTRAIN_COMM_HIER_SLICE_BYTES", "4096", 1);
    w->reset_stats();
    w->all_reduce(in, sliced, {.algorithm = mc::Algorithm::hier});
    std::vector<double> cross{double(w->stats().bytes_sent_cross_host)};
    setenv("MESHTRAIN_COMM_HIER_SLICE_BYTES", "0", 1);
    w->all_reduce(in, whole, {.algorithm = mc::Algorithm::hier});
    w->all_reduce(cross, {.algorithm = mc::Algorithm::ring});
    if (H == 2 && std::memcmp(sliced.data(), whole.data(), n * sizeof(float)) != 0) ++bad;
    if (cross[0] != 2.0 * (H - 1) * double(n) * 4) ++bad;
    // Integers: exact in any order.
    std::vector<std::int64_t> ints(n), ref(n);
    for (std::size_t i = 0; i < n; ++i) ints[i] = static_cast<std::int64_t>((i + static_cast<std::size_t>(w->rank())) % 1000);
    for (std::size_t i = 0; i < n; ++i) {
      ref[i] = 0;
      for (int r = 0; r < p; ++r) ref[i] += static_cast<std::int64_t>((i + static_cast<std::size_t>(r)) % 1000);
    }
    setenv("MESHTRAIN_COMM_HIER_SLICE_BYTES", "4096", 1);
    w->all_reduce(ints, {.algorithm = mc::Algorithm::hier});
    if (ints != ref) ++bad;
  }
  w->barrier();
  if (bad) std::printf("RESULT rank=%d hier sliced FAILED %d checks\n", w->rank(), bad);
  else std::printf("RESULT rank=%d hier sliced equals unsliced (world %d, %d hosts)\n", w->rank(), p, H);
  return bad ? 1 : 0;
}

int run_fault(const std::string& mode) {
  const auto t0 = std::chrono::steady_clock::now();
  // "throw" must end by the thrower's notice, so its deadline is only a hang guard: with a short
  // one, a loaded machine could let the deadline fire first and name no reason. The other modes
  // test the deadline itself.
  auto w = mc::mpi_world({.timeout = mode == "throw" ? mc::Timeout(30s) : mc::Timeout(2000ms)});
  const int last = w->size() - 1;
  std::vector<float> x(1000, 1.0f);
  try {
    mc::run_world(mc::Backend::mpi, 0, [&](mc::Communicator& c) {
      c.all_reduce(x);  // #0
      if (mode == "exit" && c.rank() == last) {
        std::fflush(stdout);
        _exit(3);  // dies without a word
      }
      if (mode == "throw" && c.rank() == 1) throw std::runtime_error("boom in rank 1");
      if (mode == "never" && c.rank() == last) std::this_thread::sleep_for(600s);  // ended by the abort
      c.all_reduce(x);  // #1
    });
  } catch (const std::exception& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("RESULT rank=%d failed after %.2f s: %s\n", w->rank(), s, e.what());
    std::fflush(stdout);
    return 1;  // the exit hook aborts the job
  }
  std::printf("RESULT rank=%d finished without error\n", w->rank());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "checks";
  try {
    if (mode == "checks") return run_checks();
    if (mode == "hier") return run_hier();
    return run_fault(mode);
  } catch (const std::exception& e) {
    std::printf("RESULT rank=? error: %s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
}
