// meshtrain: the command-line program. main() wires the subcommands (cli/*.cpp) together and
// turns errors into exit codes: 2 for bad input, 1 for failures while running.
#include <cstdio>
#include <exception>

#include "meshtrain/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: train neural networks across many workers (DP x TP x PP)"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  meshtrain::cli::add_train_command(app);
  meshtrain::cli::add_generate_command(app);
  CLI::App* bench = app.add_subcommand("bench", "Measure kernels and communication");
  bench->require_subcommand(1);
  meshtrain::cli::add_bench_comm_command(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Unknown flags, missing values, values of the wrong type: the user must change the call.
    std::fprintf(stderr, "meshtrain: %s\nRun 'meshtrain --help' (or '<subcommand> --help') for the options.\n",
                 e.what());
    return 2;
  } catch (const meshtrain::cli::UsageError& e) {
    std::fprintf(stderr, "meshtrain: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
