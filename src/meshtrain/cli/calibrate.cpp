// `meshtrain calibrate [--quick] [-o FILE.json] [--threads N] [--rounds N] [--overwrite]`:
// measures this machine (GEMM rates, element-wise bandwidth, attention rate, communication links;
// see plan/machine.h) and writes the machine file the planner reads (docs/planner.md).
//
// The output path is checked first by the output policy (train/outputs.h): it must be
// writable and must not replace a file meshtrain did not write unless --overwrite is given.
// One progress line per measurement goes to stderr; the summary table to stdout. Under
// mpirun every rank measures the MPI link and rank 0 alone measures the rest and writes.
#include <cstdio>
#include <memory>
#include <string>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/comm/world.h"
#include "meshtrain/plan/machine.h"
#include "meshtrain/train/outputs.h"

namespace meshtrain::cli {

namespace {
struct CalibrateArgs {
  std::string out = "machine.json";
  bool quick = false, overwrite = false;
  int threads = 0, rounds = plan::CalibrateOptions{}.rounds;
};

void run_calibrate(const CalibrateArgs& a) {
  plan::CalibrateOptions o{.quick = a.quick, .threads = a.threads, .rounds = a.rounds};
  try {
    train::PathPlan paths(a.overwrite);
    paths.output_file("--out", a.out, train::OutputKind::machine);
    paths.check();
    if (a.threads > plan::usable_cores())
      throw std::invalid_argument("--threads " + std::to_string(a.threads) + " is more than the " +
                                  std::to_string(plan::usable_cores()) + " cores this process may use; give at most " +
                                  std::to_string(plan::usable_cores()) + " (or leave it out for every core)");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const bool lead = !(comm::have_mpi() && comm::launched_by_mpirun()) || comm::mpi_world()->rank() == 0;
  if (lead)
    std::fprintf(stderr, "meshtrain calibrate: measuring this machine (%s mode; %s)\n", a.quick ? "quick" : "full",
                 a.quick ? "a few seconds" : a.rounds <= 3 ? "under two minutes" : "a few minutes");
  const plan::MachineProfile p = plan::calibrate(o, [lead](int done, int total, const std::string& line) {
    if (!lead) return;
    std::fprintf(stderr, "calibrate [%d/%d] %s\n", done, total, line.c_str());
    std::fflush(stderr);
  });
  if (!lead) return;
  plan::write_machine_file(p, a.out);
  std::fputs(plan::summary_table(p).c_str(), stdout);
  std::printf("machine file: %s\n", a.out.c_str());
}
}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = app.add_subcommand("calibrate", "Measure this machine and write the planner's machine file (JSON)");
  cmd->add_flag("--quick", args->quick, "A few seconds: fewer shapes, thread counts, sizes and repetitions");
  cmd->add_option("-o,--out", args->out, "The machine file to write (default: machine.json)")->check(non_empty_path());
  cmd->add_option("--threads", args->threads, "The most threads measured (default: every core)")->check(integer<int>(1));
  cmd->add_option("--rounds", args->rounds,
                  "Measure every kernel and layer row this many times, interleaved over the run, and keep each "
                  "row's median (default 3, about 70 s on 2 cores; each more round adds about 17 s there; quick "
                  "mode: 1). More rounds spread the measurement over more of a shared machine's slower and faster "
                  "states")
      ->check(integer<int>(1));
  cmd->add_flag("--overwrite", args->overwrite, "Let --out replace an existing file meshtrain did not write");
  cmd->callback([args] { run_calibrate(*args); });
}

}  // namespace meshtrain::cli
