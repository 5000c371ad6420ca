// meshtrain: the command-line program. main() wires the subcommands (cli/*.cpp) together and
// turns errors into exit codes: 2 for bad input, 1 for failures while running.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/cli/commands.h"
#include "meshtrain/comm/error.h"
#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/onnx/onnx_import.h"

namespace {

// The error line of a failure while running; a refused rank thread also says what to lower.
// `command`: the subcommand that ran ("train"), so that advice names only flags it has.
std::string describe(const std::exception& e, const std::string& command = "train") {
  std::string m = e.what();
  if (dynamic_cast<const std::bad_alloc*>(&e)) {
    if (command != "train" && command != "launch")
      return "out of memory (an allocation was refused: " + m + "); give `meshtrain " + command +
             "` smaller sizes (see its --help)";
    return "out of memory (an allocation was refused: " + m +
           "); the start-up estimate counts the main buffers only, so lower --batch, --seq or the model size, "
           "or add --microbatches or --zero";
  }
  if (dynamic_cast<const meshtrain::comm::ThreadStartError*>(&e))
    m += "; lower the number of ranks (--dp x --tp x --pp plus --ps-servers, or --world of bench comm) or raise "
         "the limit on threads (ulimit -u) and memory";
  return m;
}

// Threads backend: a rank failed (e.g. a missed deadline) while other ranks are still busy
// outside communication (a slow or stuck computation) 3 s later. Waiting for them could take
// minutes, so report the failure now and end the process; _Exit skips the destructors that
// the running ranks may still use. Output is flushed line by line (metrics, progress) or
// written atomically (checkpoints), so nothing written is lost.
void end_with_stuck_ranks(std::exception_ptr first, const std::vector<int>& stuck) {
  std::string what = "a rank failed";
  int code = 1;
  try {
    if (first) std::rethrow_exception(first);
  } catch (const std::invalid_argument& e) {
    what = e.what(), code = 2;  // bad input found by a rank (the subcommands map it to exit 2)
  } catch (const std::exception& e) {
    what = describe(e);
  } catch (...) {
  }
  std::fflush(stdout);
  std::fprintf(stderr, "meshtrain: %s%s (ending the process: rank(s) %s still busy outside communication)\n",
               code == 1 ? "error: " : "", what.c_str(), meshtrain::comm::format_ranks(stuck).c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  meshtrain::comm::set_stuck_ranks_handler(end_with_stuck_ranks);
  CLI::App app{meshtrain::cli::kProgramDescription};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  meshtrain::cli::add_train_command(app);
  meshtrain::cli::add_generate_command(app);
  meshtrain::cli::add_schedule_command(app);
  meshtrain::cli::add_trace_command(app);
  meshtrain::cli::add_checkpoint_command(app);
  meshtrain::cli::add_eval_command(app);
  meshtrain::cli::add_calibrate_command(app);
  meshtrain::cli::add_plan_command(app);
  meshtrain::cli::add_launch_command(app);
  meshtrain::cli::add_model_command(app);
  meshtrain::cli::add_import_command(app);
  meshtrain::onnx_import::register_onnx_reader();
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
    std::fprintf(stderr, "meshtrain: %s\n", meshtrain::cli::describe_parse_error(e, app).c_str());
    return 2;
  } catch (const meshtrain::cli::LaunchExit& e) {
    return e.code;
  } catch (const meshtrain::cli::UsageError& e) {
    std::fprintf(stderr, "meshtrain: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Includes a refused rank thread: a limit of this machine met while running (exit 1).
    std::fprintf(stderr, "meshtrain: error: %s\n", describe(e, meshtrain::cli::parsed_command(app).first).c_str());
    return 1;
  }
  return 0;
}
