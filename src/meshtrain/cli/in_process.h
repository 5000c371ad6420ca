// `meshtrain ARGS...` run inside another program (the Python module, python/): the program's own
// parser, checks and sentences, with InProcessHooks (cli/commands.h) handing back what the
// program only prints or writes (each step's metrics line, the run's result, plan's rows).
//
// Contract: a call that the program would end with exit 2 throws UsageError whose what() is
// exactly the sentence the program prints after "meshtrain: " (the parser's refusals included,
// through describe_parse_error); a failure while running propagates as the program would report
// it with exit 1 (std::runtime_error and kin). Only the subcommands a caller uses are
// registered: train, plan and model. The process-wide stuck-ranks handler is left alone (the
// program's ends the process; a host keeps waiting, threads_backend.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "meshtrain/cli/commands.h"

namespace meshtrain::cli {

// args: the words after the program's name ({"train", "--dp", "2", ...}).
void run_in_process(const std::vector<std::string>& args, const InProcessHooks& hooks = {});

// The options of subcommand `command` ("train", "plan", "model show") as the program parses
// them: each option's long name ("--dp") and whether it is a flag (takes no value). Positional
// arguments and --help are left out. Throws std::invalid_argument for an unknown command.
std::vector<std::pair<std::string, bool>> command_options(const std::string& command);

}  // namespace meshtrain::cli
