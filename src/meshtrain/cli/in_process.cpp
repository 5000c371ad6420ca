// The program's subcommands run in this process (cli/in_process.h).
#include "meshtrain/cli/in_process.h"

#include <algorithm>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "meshtrain/onnx/onnx_import.h"

namespace meshtrain::cli {

namespace {

// The program's App with the subcommands a caller in this process uses.
std::unique_ptr<CLI::App> make_app(const InProcessHooks& hooks) {
  onnx_import::register_onnx_reader();  // --model net.onnx, as the program reads it
  auto app = std::make_unique<CLI::App>(kProgramDescription);
  app->require_subcommand(1);
  auto shared = std::make_shared<const InProcessHooks>(hooks);
  add_train_command(*app, shared);
  add_plan_command(*app, shared);
  add_model_command(*app);
  return app;
}

}  // namespace

void run_in_process(const std::vector<std::string>& args, const InProcessHooks& hooks) {
  auto app = make_app(hooks);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses a vector from its back
  try {
    app->parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw UsageError(describe_parse_error(e, *app));
  }
}

std::vector<std::pair<std::string, bool>> command_options(const std::string& command) {
  auto app = make_app({});
  CLI::App* sub = app.get();
  std::istringstream words(command);
  std::string w;
  while (words >> w) {
    try {
      sub = sub->get_subcommand(w);
    } catch (const CLI::OptionNotFound&) {
      throw std::invalid_argument("meshtrain has no subcommand '" + command + "'");
    }
  }
  std::vector<std::pair<std::string, bool>> out;
  for (const CLI::Option* o : sub->get_options()) {
    if (o->get_lnames().empty() || o == sub->get_help_ptr() || o == sub->get_help_all_ptr()) continue;
    out.emplace_back("--" + o->get_lnames().front(), o->get_expected_max() == 0);
  }
  return out;
}

}  // namespace meshtrain::cli
