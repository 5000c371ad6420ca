// `meshtrain train`: placeholder until the trainer lands.
#include "meshtrain/cli/commands.h"

namespace meshtrain::cli {
void add_train_command(CLI::App& app) {
  app.add_subcommand("train", "Train a model (not built yet)");
}
}  // namespace meshtrain::cli
