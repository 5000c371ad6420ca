// Checkpoints: crash-safe directories of full logical tensors (DESIGN decision 6), so a run
// saved on one layout resumes on any other.
//
// Layout of a checkpoint directory DIR:
//   DIR/step_00000100/model.safetensors      full tensors per parameter name (GPT-2 names)
//   DIR/step_00000100/optimizer.safetensors  whatever the caller passes (exp_avg.<name>, ...)
//   DIR/step_00000100/index.json             written last, see below
//   DIR/latest                               "step_00000100\n": the most recently saved step
// index.json:
//   {"format": "meshtrain-checkpoint", "version": 1, "step": 100,
//    "config": {...}, "state": {...},                         (caller-given JSON objects)
//    "files": {"model.safetensors": {"size": N, "crc32": C}, "optimizer.safetensors": {...}},
//    "index_crc32": C}   CRC32 of the compact dump of this object without "index_crc32"
//   The file is nlohmann::json::dump(2) plus a newline; loading insists on exactly that form,
//   so a changed byte anywhere (even whitespace) is caught, and the CRC catches changed values.
//   Hand-edited index files are therefore refused.
//
// Crash safety: a save writes everything into step_XXXXXXXX.tmp/ (each file fsynced, the
// folder fsynced), swaps it into place atomically (renameat2 RENAME_EXCHANGE when it replaces
// an existing folder of the same step), then replaces `latest` atomically. `latest` is the
// commit point: at any moment it names a complete checkpoint; leftover *.tmp folders are
// ignored by loading and removed by the next save of that step.
//
// Loading verifies index.json's own CRC, then the size and CRC32 of every file it lists,
// before parsing any tensor; any problem throws CheckpointError naming the checkpoint, the
// file and what to do. Nothing partially loaded is ever returned.
//
// Resume (find_resume_point): the newest step folder that verifies, whatever `latest` says.
// `latest` can be missing or older than the newest folder when a save failed between
// installing the folder and replacing `latest` (a full disk): the complete folder is used.
// Invalid folders are skipped with a note; folders that exist but of which none verifies are
// an error (never a silent restart from step 0).
//
// Limits: one writer per directory (rank 0 saves; callers gather full tensors first);
// the tensors are held in memory while saving and loading.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/tensor/tensor.h"
#include "meshtrain/train/safetensors.h"

namespace meshtrain::train {

// A save that failed (full disk, permissions, I/O error). Not derived from CheckpointError:
// while a run is going it is a failure of the run (the CLI exits 1), not a bad input.
class CheckpointWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- data ----

struct CheckpointData {
  int64_t step = 0;
  nlohmann::json config = nlohmann::json::object();  // model / run configuration
  nlohmann::json state = nlohmann::json::object();   // optimizer step, data position, RNG, ...
  std::vector<std::pair<std::string, Tensor>> model;      // full logical tensors by name
  std::vector<std::pair<std::string, Tensor>> optimizer;  // e.g. exp_avg.<name>
};

// The same, pointing at tensors the caller owns (saves without copying them).
struct CheckpointRefs {
  int64_t step = 0;
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json state = nlohmann::json::object();
  std::vector<std::pair<std::string, const Tensor*>> model;
  std::vector<std::pair<std::string, const Tensor*>> optimizer;
};

// ---- save ----

// "step_00000100"
std::string step_folder_name(int64_t step);

// Saves into DIR/step_XXXXXXXX (replacing one of the same step) and points DIR/latest at it;
// returns the folder's path. Any failure throws CheckpointWriteError; if it happens after the
// folder is installed (writing `latest`), the folder is complete and find_resume_point finds it. keep_last > 0 then deletes older step folders (lower step numbers
// than this one) beyond the newest keep_last - 1 of them; folders with higher steps are kept.
std::string save_checkpoint(const std::string& dir, const CheckpointData& data, int keep_last = 0);
std::string save_checkpoint(const std::string& dir, const CheckpointRefs& data, int keep_last = 0);

// ---- load ----

// The step folder DIR/latest names, or nullopt when DIR has no `latest` (nothing saved yet).
// Throws CheckpointError when `latest` names a folder that does not exist.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Loads a checkpoint; `path` is a checkpoint DIR (uses `latest`) or a step folder.
CheckpointData load_checkpoint(const std::string& path);
// The same without the optimizer state (step, config, state and model; only index.json and
// model.safetensors are verified and read): what sampling needs.
CheckpointData load_checkpoint_model(const std::string& path);

// Complete step folders of DIR (named step_XXXXXXXX; *.tmp folders are not), by step, oldest
// first. Empty when DIR does not exist or is not a directory.
std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir);

// Verifies a step folder without parsing its tensors: index.json (form and CRC) and the size
// and CRC32 of every file it lists. Throws CheckpointError saying what is wrong.
void verify_checkpoint(const std::string& folder);

// Where a run with --resume continues.
struct ResumePoint {
  std::optional<std::string> folder;  // nullopt: DIR holds no step folder (start at step 0)
  int64_t step = 0;
  std::vector<std::string> notes;  // sentences for the user: `latest` missing or stale, folders skipped
};
// The newest step folder of DIR that verifies (see the top of this file). Throws
// CheckpointError when DIR does not exist or is not a directory, when step folders exist but
// none verifies, or when `latest` names a folder while DIR holds none.
ResumePoint find_resume_point(const std::string& dir);

// Checks that `tensors` (from `source`, e.g. "checkpoint runs/x/step_00000100") hold exactly
// the names of `expected` with those shapes: nothing missing, nothing extra, no other shape.
// Throws CheckpointError naming the first offending tensor.
void check_tensor_set(const std::string& source, const std::vector<std::pair<std::string, Shape>>& expected,
                      const std::vector<std::pair<std::string, Tensor>>& tensors);

// Model weights only: from a checkpoint DIR or step folder (verifying index.json and
// model.safetensors), or from a bare safetensors file (e.g. GPT-2 from the Hugging Face hub),
// or from a folder holding model.safetensors but no index.json.
std::vector<std::pair<std::string, Tensor>> load_model_weights(const std::string& path);

}  // namespace meshtrain::train
