// `meshtrain generate`: placeholder until the model lands.
#include "meshtrain/cli/commands.h"

namespace meshtrain::cli {
void add_generate_command(CLI::App& app) {
  app.add_subcommand("generate", "Sample text from a checkpoint (not built yet)");
}
}  // namespace meshtrain::cli
