// The subcommands of `meshtrain`. Each lives in its own file and registers its options and
// callback on the parent CLI11 app; main.cpp only wires them together.
//
// Exit codes: 0 success, 1 a failure while running, 2 bad input (unknown flag, impossible
// layout, missing file), always with one sentence that says what to change.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/tensor/tensor.h"
#include "meshtrain/train/trainer.h"

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

// What a caller inside this process (the Python module, python/; cli/in_process.h) adds to a
// subcommand: hooks that hand back what the program only prints or writes. Null hooks, or
// empty members: the program's behaviour.
struct InProcessHooks {
  // train: called on world rank 0 after each step's metrics line is written, with that line
  // (train::TrainOptions::on_step).
  std::function<void(const nlohmann::json& line)> on_step;
  // train: called once every flag has passed the command's checks, just before train::train;
  // may add what the caller needs (the Python module's checkpoint directory for state_dict()).
  std::function<void(train::TrainOptions&)> before_train;
  // train: receives the run's result.
  std::function<void(train::TrainResult&&)> on_result;
  // train: SIGINT, SIGTERM and SIGUSR1 stop the run at a step's end (train/stop.h). The
  // program installs them; a host process (Python) keeps its own signals.
  bool install_stop_handlers = true;
  // train: the program that measures the machine quickly for the cost model when no machine
  // file is cached (`PROGRAM calibrate --quick`); empty: none (only a cached file is used).
  std::string calibrate_program = "/proc/self/exe";
  // plan: receives the ranked layouts, one JSON object per layout, its keys in the order of
  // plan's table (cli/plan.cpp lists them).
  std::function<void(std::vector<nlohmann::ordered_json>&&)> on_plan_rows;
};

void add_train_command(CLI::App& app, std::shared_ptr<const InProcessHooks> hooks = nullptr);  // cli/train.cpp
void add_generate_command(CLI::App& app);    // cli/generate.cpp
void add_schedule_command(CLI::App& app);    // cli/schedule.cpp: the ideal pipeline schedule
void add_trace_command(CLI::App& app);       // cli/trace.cpp: `meshtrain trace render`
void add_bench_comm_command(CLI::App& bench);  // cli/bench_comm.cpp: `meshtrain bench comm`
void add_checkpoint_command(CLI::App& app);  // cli/checkpoint.cpp: `meshtrain checkpoint convert`
void add_eval_command(CLI::App& app);        // cli/eval.cpp: `meshtrain eval`, a classifier's test accuracy
void add_calibrate_command(CLI::App& app);   // cli/calibrate.cpp: `meshtrain calibrate`, the machine file
// cli/plan.cpp: `meshtrain plan`, layouts ranked by predicted step time
void add_plan_command(CLI::App& app, std::shared_ptr<const InProcessHooks> hooks = nullptr);
void add_launch_command(CLI::App& app);      // cli/launch.cpp: `meshtrain launch`, a supervised, resuming job
void add_model_command(CLI::App& app);       // cli/model.cpp: `meshtrain model show`, a model's layer table
void add_import_command(CLI::App& app);      // cli/import.cpp: `meshtrain import`, an ONNX file as a model file

// The program's description (its --help's first line).
inline constexpr const char* kProgramDescription = "meshtrain: train neural networks across many workers (DP x TP x PP)";

// The parser's refusal (an unknown flag, a missing or malformed value, a value a check refused)
// as the program's one sentence: what is wrong and what to change (cli/parse_error.cpp).
std::string describe_parse_error(const CLI::ParseError& e, const CLI::App& app);
// The subcommand being parsed when the parser refused ("train", "checkpoint convert"; "" for
// the program itself) and its App.
std::pair<std::string, const CLI::App*> parsed_command(const CLI::App& app);

// The model of a checkpoint as `checkpoint convert --to-single` writes it (cli/checkpoint.cpp):
// every tensor's name and shape in the file's layout — a CNN's parameters and batch-norm
// buffers under their PyTorch state-dict names with linear weights (out, in), a GPT's under
// GPT-2's names — and `read`, which assembles one tensor whole from the pieces the ranks saved.
struct SingleFileModel {
  std::vector<std::pair<std::string, Shape>> tensors;  // in the order the index lists them
  // One tensor in the file's layout. Throws train::CheckpointError (a piece missing or not
  // finite). Holds the index and the files it mapped: one caller at a time.
  std::function<Tensor(const std::string& name)> read;
  std::string model;   // the model's name
  int64_t step = 0;    // the checkpoint's step (steps trained)
  int64_t params = 0;  // values, parameters and buffers
  bool cnn = false;    // an image classifier (PyTorch state-dict names) or a GPT (GPT-2's)
};
// `folder`: one step folder (tool_step_folder finds it). Throws UsageError or
// train::CheckpointError saying what disagrees, as convert refuses.
SingleFileModel single_file_model(const std::string& folder);

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
