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

// The subcommand being parsed when the parser refused ("train", "checkpoint convert"; "" for
// the program itself) and its App.
std::pair<std::string, const CLI::App*> parsed_command(const CLI::App& app) {
  const CLI::App* cur = &app;
  std::string path;
  while (!cur->get_subcommands().empty()) {
    cur = cur->get_subcommands().front();
    path += (path.empty() ? "" : " ") + cur->get_name();
  }
  return {path, cur};
}

// The words after "...: " in a parser message, split at spaces.
std::vector<std::string> listed(const std::string& m) {
  std::vector<std::string> out;
  const auto colon = m.find(": ");
  if (colon == std::string::npos) return out;
  std::string rest = m.substr(colon + 2), w;
  for (char c : rest + " ") {
    if (c == ' ') {
      if (!w.empty()) out.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  return out;
}

// The parser's refusal as the project's one sentence: what is wrong and what to change.
std::string describe_parse_error(const CLI::ParseError& e, const CLI::App& app) {
  const auto [cmd, sub] = parsed_command(app);
  const std::string full = cmd.empty() ? "meshtrain" : "meshtrain " + cmd;
  const std::string help = "see `" + full + " --help`";
  const std::string m = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    // The words that look like flags are what to name; values left over (CLI11 lists them too,
    // in no fixed order) only when there is no flag among them.
    std::vector<std::string> flags, words;
    for (const std::string& x : listed(m)) (x.rfind("-", 0) == 0 ? flags : words).push_back(x);
    std::string list;
    for (const std::string& x : flags) list += (list.empty() ? "" : ", ") + x;
    if (cmd == "launch" && !flags.empty())
      return "launch reads its own options, then the job after `--`: give `meshtrain launch [options] -- train "
             "ARGS...` (" + list + (flags.size() == 1 ? " is not an option" : " are not options") + " of launch)";
    if (flags.empty())
      return "`" + full + "` takes no argument '" + (words.empty() ? std::string() : words.front()) + "' there; " + help;
    return list + (flags.size() == 1 ? " is not an option" : " are not options") + " of `" + full + "`; " + help +
           " for the ones it takes";
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    const std::string flag = m.substr(0, m.find(':'));
    const auto got = m.find("required but received ");
    if (got != std::string::npos)
      return flag + " is given " + m.substr(got + 22) + " times; give it once";
    return flag + " needs a value; give one or leave the flag out (" + help + ")";
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e)) {
    // "Could not convert: --lr = abc"
    const auto colon = m.find(": "), eq = m.find(" = ");
    if (colon != std::string::npos && eq != std::string::npos && eq > colon) {
      const std::string flag = m.substr(colon + 2, eq - colon - 2), value = m.substr(eq + 3);
      std::string want = "a value it takes";
      if (const CLI::Option* o = sub->get_option_no_throw(flag)) {
        const std::string type = o->get_type_name();
        if (type == "FLOAT") want = "a number";
        else if (type == "INT" || type == "UINT") want = "a whole number";
      }
      return flag + ": '" + value + "' is not " + want + "; " + help;
    }
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e)) {
    if (m.find("subcommand is required") != std::string::npos) {
      std::string names;
      for (const CLI::App* s : sub->get_subcommands([](const CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + s->get_name();
      return "`" + full + "` needs a subcommand: one of " + names + "; " + help;
    }
    const auto is = m.find(" is required");
    if (is != std::string::npos)
      return "`" + full + "` needs " + m.substr(0, is) + "; " + help;
  }
  // A value a check refused: the check's own sentence says what to give.
  if (dynamic_cast<const CLI::ValidationError*>(&e)) return m;
  std::string out = m;
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out + "; " + help;
}

}  // namespace

int main(int argc, char** argv) {
  meshtrain::comm::set_stuck_ranks_handler(end_with_stuck_ranks);
  CLI::App app{"meshtrain: train neural networks across many workers (DP x TP x PP)"};
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
    std::fprintf(stderr, "meshtrain: %s\n", describe_parse_error(e, app).c_str());
    return 2;
  } catch (const meshtrain::cli::LaunchExit& e) {
    return e.code;
  } catch (const meshtrain::cli::UsageError& e) {
    std::fprintf(stderr, "meshtrain: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Includes a refused rank thread: a limit of this machine met while running (exit 1).
    std::fprintf(stderr, "meshtrain: error: %s\n", describe(e, parsed_command(app).first).c_str());
    return 1;
  }
  return 0;
}
