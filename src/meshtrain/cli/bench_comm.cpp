// `meshtrain bench comm`: placeholder until the communication layer lands.
#include "meshtrain/cli/commands.h"

namespace meshtrain::cli {
void add_bench_comm_command(CLI::App& bench) {
  bench.add_subcommand("comm", "Collective bandwidth and latency (not built yet)");
}
}  // namespace meshtrain::cli
