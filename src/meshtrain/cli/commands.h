// The subcommands of `meshtrain`. Each lives in its own file and registers its options and
// callback on the parent CLI11 app; main.cpp only wires them together.
//
// Exit codes: 0 success, 1 a failure while running, 2 bad input (unknown flag, impossible
// layout, missing file), always with one sentence that says what to change.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/spec.h"

namespace meshtrain::cli {

// Thrown by a subcommand for bad input; main prints the message and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown by a subcommand that ends with a given exit code and has said why already
// (`meshtrain launch` passes on its job's code); main exits with it and prints nothing.
struct LaunchExit : std::runtime_error {
  explicit LaunchExit(int c) : std::runtime_error("exit " + std::to_string(c)), code(c) {}
  int code;
};

void add_train_command(CLI::App& app);       // cli/train.cpp
void add_generate_command(CLI::App& app);    // cli/generate.cpp
void add_schedule_command(CLI::App& app);    // cli/schedule.cpp: the ideal pipeline schedule
void add_trace_command(CLI::App& app);       // cli/trace.cpp: `meshtrain trace render`
void add_bench_comm_command(CLI::App& bench);  // cli/bench_comm.cpp: `meshtrain bench comm`
void add_checkpoint_command(CLI::App& app);  // cli/checkpoint.cpp: `meshtrain checkpoint convert`
void add_eval_command(CLI::App& app);        // cli/eval.cpp: `meshtrain eval`, a classifier's test accuracy
void add_calibrate_command(CLI::App& app);   // cli/calibrate.cpp: `meshtrain calibrate`, the machine file
void add_plan_command(CLI::App& app);        // cli/plan.cpp: `meshtrain plan`, layouts ranked by predicted step time
void add_launch_command(CLI::App& app);      // cli/launch.cpp: `meshtrain launch`, a supervised, resuming job
void add_model_command(CLI::App& app);       // cli/model.cpp: `meshtrain model show`, a model's layer table
void add_import_command(CLI::App& app);      // cli/import.cpp: `meshtrain import`, an ONNX file as a model file

// A checkpoint's model (its index: names, shapes, where the pieces lie) with the config of its
// index, checked against each other (every name and shape; cli/generate.cpp) before any tensor
// is read. Throws train::CheckpointError saying what disagrees.
struct CheckedCheckpoint {
  model::GPTConfig config;
  train::CheckpointIndex index;  // step, config, state and the model's pieces (no optimizer state)
};
CheckedCheckpoint checked_model_checkpoint(const std::string& path);

// The CNN a checkpoint's index names (its "model" object), with its tensor set — every
// parameter and batch-norm buffer of that model — checked against the index
// (cli/checkpoint.cpp). Throws UsageError or train::CheckpointError saying what disagrees.
std::shared_ptr<const model::ModelSpec> checked_cnn_checkpoint(const std::string& folder,
                                                               const train::CheckpointIndex& index);

// The step folder a tool reads (generate, checkpoint convert; cli/generate.cpp): `path` itself
// when it holds index.json, else the newest step folder of the checkpoint directory `path`
// that verifies, as --resume picks it (train::find_resume_point: a missing or stale `latest`
// is passed over), its notes printed as "meshtrain: note: ..." on stderr. `purpose` ends the
// refusal of a directory without step folders ("nothing to convert"). Throws
// train::CheckpointError saying what is wrong.
std::string tool_step_folder(const std::string& path, const std::string& purpose);

}  // namespace meshtrain::cli
