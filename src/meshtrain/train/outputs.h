// The output policy every subcommand follows: nothing a user owns is overwritten.
//
// Before anything runs, a command lists every path it reads and writes in a PathPlan; check()
// resolves each one (the real path of its directory plus its name, and the file itself when
// it exists, so a symbolic link or a hard link to an input is seen through) and refuses, with
// a sentence naming both flags and paths:
//   - an output that is an input (the same file), or lies inside a directory being read (a
//     checkpoint that convert, generate or --resume reads);
//   - an output that is another output (--metrics equal to --trace or to the trace's .svg);
//   - an input or output that is a name a checkpoint directory being written manages
//     (DIR/latest, DIR/step_*: a save replaces them and --keep-checkpoints deletes them);
//   - an existing, non-empty file the program did not write (it carries no mark of
//     meshtrain's: see written_by_meshtrain) unless the command was given --overwrite;
//   - a path that cannot be written at all: a name component over NAME_MAX bytes, a path
//     over PATH_MAX, a dangling symbolic link, a directory where a file is wanted, a missing
//     or read-only directory.
// Every refusal throws std::invalid_argument (the CLI exits 2) before any file is opened.
//
// Limits: paths are compared as this process sees them; two hosts writing through different
// mounts of one network file system are not recognised as the same file.
#pragma once

#include <string>
#include <vector>

namespace meshtrain::train {

// What an output file holds, which says how the program recognises a file it wrote itself.
enum class OutputKind {
  metrics,      // JSON lines whose first line is an object with "step" (train --metrics)
  trace,        // Chrome-trace JSON with meshtrain's writer event (train --trace)
  svg,          // an SVG carrying pipeline::kSvgMark (swimlanes)
  safetensors,  // a safetensors file whose metadata has "writer": "meshtrain"
  machine,      // a JSON object whose "kind" is "meshtrain machine" (meshtrain calibrate)
  events,       // JSON lines whose first line is an object with "event": "start" (launch --events)
  model,        // a layer graph with "imported_from" (meshtrain import)
  npz,          // a zip whose comment is io::kNpzWriterComment (checkpoint convert to .npz)
};

// True when `path` is empty or carries the mark of a file meshtrain writes as `kind`.
bool written_by_meshtrain(const std::string& path, OutputKind kind);

// The name of the metadata key and value meshtrain writes into safetensors files it creates.
inline constexpr const char* kSafetensorsWriterKey = "writer";
inline constexpr const char* kSafetensorsWriter = "meshtrain";

class PathPlan {
 public:
  // `overwrite`: existing files not written by meshtrain may be replaced (the --overwrite flag).
  explicit PathPlan(bool overwrite = false) : overwrite_(overwrite) {}

  // A file the command reads (`flag` names it in messages: "--data", "the trace").
  void input_file(const std::string& flag, const std::string& path);
  // A directory the command reads from, all of it (a checkpoint directory or step folder).
  void input_tree(const std::string& flag, const std::string& dir);
  // A file the command writes. `replace_own`: a file meshtrain wrote (see OutputKind) may be
  // replaced without --overwrite; false for files that must never be replaced.
  void output_file(const std::string& flag, const std::string& path, OutputKind kind, bool replace_own = true);
  // A file the command may write beside another (PATH.old of a trimmed metrics file): refused
  // when it is an input or another output, replaced freely otherwise.
  void side_file(const std::string& flag, const std::string& path);
  // A checkpoint directory the command writes: it manages DIR/latest and DIR/step_*.
  void output_checkpoint_dir(const std::string& flag, const std::string& dir);

  // Throws std::invalid_argument with a sentence for the first conflict found.
  void check() const;

 private:
  enum class Role { input_file, input_tree, output_file, side_file, checkpoint_dir };
  struct Entry {
    Role role;
    std::string flag, path, resolved;
    OutputKind kind = OutputKind::metrics;
    bool replace_own = true;
  };
  void add(Role role, const std::string& flag, const std::string& path, OutputKind kind, bool replace_own);
  bool overwrite_;
  std::vector<Entry> entries_;
};

// A path that `flag` writes: no component longer than NAME_MAX, not over PATH_MAX, not a
// dangling symbolic link. Throws std::invalid_argument.
void check_path_usable(const std::string& flag, const std::string& path);

}  // namespace meshtrain::train
