// Checkpoints: crash-safe directories that resume at any layout (DESIGN decision 6), written by
// every rank in parallel: each rank saves the parts of the logical tensors it holds, and a JSON
// index says where every part ("piece") lies, as PyTorch's distributed checkpoint does. No rank
// gathers the model: a save holds nothing beyond what the ranks hold already, and a load reads
// only the pieces that overlap what a rank needs.
//
// Layout of a checkpoint directory DIR:
//   DIR/step_00000100/model-00003.safetensors      rank 3's pieces of the model's tensors
//   DIR/step_00000100/optimizer-00003.safetensors  rank 3's pieces of the optimizer state
//                                                  (exp_avg.<name>, exp_avg_sq.<name>)
//   ...                                            one pair per rank of the saving run
//   DIR/step_00000100/index.json                   written last, see below
//   DIR/latest                                     "step_00000100\n": the most recently saved step
// A piece is a part of one logical tensor (GPT-2 names and (in, out) shapes): elements
// [begin, end) (flat, row-major) of the tp-local tensor that a shard spec (nn/param.h: dim,
// groups, rank, size, padded) cuts out of it. ShardSpec::for_each_run maps those elements into
// the logical tensor, the fused qkv weight's three groups included; a ZeRO segment is such a
// range, and a replicated tensor has no spec (the tp-local tensor is the logical one). Inside a
// file a piece is stored as its own tensor: under the logical name and shape when it is the
// whole tensor (so a single-rank checkpoint's model-00000.safetensors is an ordinary GPT-2
// file), else 1-D under "<name>[tp r/p][begin:end]" ("<name>[begin:end]" for replicated ones).
// Every file also carries its piece table in its metadata ("meshtrain.pieces"), from which
// rank 0 builds the index.
// index.json (version 2):
//   {"format": "meshtrain-checkpoint", "version": 2, "step": 100,
//    "config": {...}, "state": {...},                         (caller-given JSON objects;
//                        training's state: "updates", "data_position" and "metrics", the
//                        step's metrics line without its save timings, see train/trainer.h)
//    "files": {"model-00000.safetensors": {"size": N, "crc32": C}, ...},   every rank's files
//    "tensors": {"wte.weight": {"shape": [50257, 768], "pieces": [
//        {"file": "model-00000.safetensors", "key": "wte.weight[tp 0/2][0:9649536]",
//         "tp": {"dim": 0, "groups": 1, "rank": 0, "size": 2, "padded": true},
//         "range": [0, 9649536]}, ...]}, ...},               ("tp" absent: replicated)
//    "index_crc32": C}   CRC32 of the compact dump of this object without "index_crc32"
//   The file is nlohmann::json::dump(2) plus a newline; loading insists on exactly that form,
//   so a changed byte anywhere (even whitespace) is caught, and the CRC catches changed values.
//   Hand-edited index files are therefore refused. Opening also checks that the pieces of every
//   tensor tile it: each element once, none missing.
// Version 1 (full logical tensors in model.safetensors and optimizer.safetensors, no "tensors")
// still loads: each of its tensors is one whole piece.
//
// Saving (train/rank_checkpoints.cpp runs the steps with the world's collectives between them):
// rank 0 empties step_XXXXXXXX.tmp/ (begin_save); every rank writes its two files into it
// (write_rank_pieces: each file written to a .tmp name, fsynced, renamed, the folder fsynced);
// after a barrier rank 0 reads the files' headers, writes index.json with the size and CRC32
// every rank reported for its files (commit_save), fsyncs the folder, swaps it into place
// atomically (renameat2 RENAME_EXCHANGE when it replaces an existing folder of the same step),
// then replaces `latest` atomically. `latest` is the commit point: at any moment it names a
// complete checkpoint; leftover *.tmp folders are ignored by loading and removed by the next
// save of that step. The ranks must share the checkpoint directory's file system (one machine,
// or a network file system across hosts).
//
// Loading verifies index.json's own CRC, then the size and CRC32 of every file it lists, then
// that each file's header holds every piece the index places in it (its key, float32, the
// logical shape for a whole piece, else 1-D of its elements), before parsing any tensor; any
// problem throws CheckpointError naming the checkpoint, the file and what to do. Every element
// copied out of a piece must be finite: the trainer never saves a diverged step, so a NaN or
// infinity (behind valid CRCs) is refused, naming the file and tensor. Nothing partially loaded is ever returned. PieceReader then copies out
// of the (mapped) files only the elements a caller asks for: a rank resuming at another layout
// reads its stage's tensors, its tp slice and its ZeRO range, directly into what it holds,
// whatever tp the checkpoint was saved at (the runs of both layouts are intersected).
//
// Resume (find_resume_point): the newest step folder that verifies, whatever `latest` says.
// `latest` can be missing or older than the newest folder when a save failed between
// installing the folder and replacing `latest` (a full disk): the complete folder is used.
// Invalid folders are skipped with a note; folders that exist but of which none verifies are
// an error (never a silent restart from step 0).
//
// Limits: verification reads every file once per process (CRCs), so a rank reads more bytes
// than its pieces while checking; the full-tensor readers (load_checkpoint, generate, checkpoint
// convert) assemble one logical tensor at a time from its pieces.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/nn/param.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::train {

// ---- pieces ----

// Where a piece sits in its logical tensor.
struct PieceSpec {
  std::string name;    // logical tensor, e.g. "h.0.attn.c_attn.weight" or "exp_avg.wte.weight"
  Shape shape;         // its (global) shape
  nn::ShardSpec tp;    // cuts the tp-local tensor out of it; replicated: the tensor itself
  int64_t begin = 0, end = 0;  // flat element range of the tp-local tensor
  int64_t numel() const { return end - begin; }
  bool whole() const { return !tp.is_split() && begin == 0 && end == shape_numel(shape); }
};

// A piece to save: `data` holds its end - begin elements (a view of what the rank holds).
struct SavePiece {
  PieceSpec spec;
  Tensor data;
};
struct RankPieces {
  std::vector<SavePiece> model, optimizer;
};

// ---- save ----

// A save that failed (full disk, permissions, I/O error). Not derived from CheckpointError:
// while a run is going it is a failure of the run (the CLI exits 1), not a bad input.
class CheckpointWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "step_00000100"
std::string step_folder_name(int64_t step);
// "model-00003.safetensors", "optimizer-00003.safetensors"
std::string rank_file_name(const std::string& kind, int rank);

// The digests of one rank's two files.
struct RankFiles {
  FileDigest model, optimizer;
};

// 1. Rank 0: DIR/step_XXXXXXXX.tmp, created empty (a leftover of an interrupted save of this
//    step is removed); returns its path.
std::string begin_save(const std::string& dir, int64_t step);
// 2. Every rank, after 1: writes its pieces as rank_file_name("model"/"optimizer", rank) into
//    the tmp folder (durably) and returns their digests.
RankFiles write_rank_pieces(const std::string& tmp, int rank, const RankPieces& pieces);
// 3. Rank 0, after every rank's 2: index.json from the files' headers and the digests
//    (files[r]: rank r's), then the atomic install and `latest` (see the top of this file);
//    returns the step folder's path. keep_last > 0 then deletes older step folders (lower
//    step numbers than this one) beyond the newest keep_last - 1 of them; folders with higher
//    steps are kept. If `latest` fails after the folder is installed, the folder is complete
//    and find_resume_point finds it.
std::string commit_save(const std::string& dir, int64_t step, const nlohmann::json& config,
                        const nlohmann::json& state, const std::vector<RankFiles>& files, int keep_last = 0);
// Every failure of the three throws CheckpointWriteError naming the checkpoint and the cause.

// Full logical tensors by name, as one process holds them (tests, tools, single-rank saves).
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
// The three steps in one process, as rank 0 of a world of one: every tensor one whole piece.
std::string save_checkpoint(const std::string& dir, const CheckpointData& data, int keep_last = 0);
std::string save_checkpoint(const std::string& dir, const CheckpointRefs& data, int keep_last = 0);

// ---- load ----

// The step folder DIR/latest names, or nullopt when DIR has no `latest` (nothing saved yet).
// Throws CheckpointError when `latest` names a folder that does not exist.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// A checkpoint's index: where the pieces of every logical tensor lie.
struct StoredPiece {
  PieceSpec spec;
  std::string file, key;  // the file in the step folder and the tensor's key inside it
};
struct StoredTensor {
  Shape shape;
  std::vector<StoredPiece> pieces;
};
struct CheckpointIndex {
  std::string folder;  // the step folder
  int version = 0;
  int64_t step = 0;
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json state = nlohmann::json::object();
  std::map<std::string, StoredTensor> model;      // by name
  std::map<std::string, StoredTensor> optimizer;  // exp_avg.<name>, exp_avg_sq.<name>
  const StoredTensor* find(const std::string& name) const;
  std::vector<std::pair<std::string, Shape>> shapes(const std::map<std::string, StoredTensor>& part) const;
};
// Opens a checkpoint (`path`: a checkpoint DIR, through `latest`, or a step folder): index.json
// checked (form, CRC, pieces tiling every tensor, each piece in its file's header as recorded)
// and the size and CRC32 of its files verified
// — all of them, or with model_only only the model's (what sampling needs; the optimizer
// part of the index is then left empty). Throws CheckpointError saying what is wrong.
CheckpointIndex open_checkpoint(const std::string& path, bool model_only = false);

// Copies elements out of a checkpoint's pieces. One per thread (it keeps the files it mapped).
class PieceReader {
 public:
  explicit PieceReader(const CheckpointIndex& index) : index_(index) {}
  // dst[0, end - begin) = elements [begin, end) of the tp-local tensor that `tp` cuts out of
  // logical tensor `name` (padding elements 0). Reads only the pieces that overlap them.
  // Throws CheckpointError when the checkpoint lacks the tensor, holds it in another shape
  // than `shape`, a piece is not where the index says, or an element read is not finite.
  void read(const std::string& name, const Shape& shape, const nn::ShardSpec& tp, int64_t begin, int64_t end,
            float* dst);
  // The whole logical tensor `name`.
  Tensor full(const std::string& name);
  // Bytes copied out of the files so far (piece data only, not headers or verification).
  int64_t bytes_read() const { return bytes_read_; }

 private:
  const SafetensorsFile& file(const std::string& name);
  const CheckpointIndex& index_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  int64_t bytes_read_ = 0;
};

// Loads a checkpoint's full tensors; `path` is a checkpoint DIR (uses `latest`) or a step folder.
CheckpointData load_checkpoint(const std::string& path);
// The same without the optimizer state (step, config, state and model; only index.json and
// the model's files are verified and read): what sampling needs.
CheckpointData load_checkpoint_model(const std::string& path);

// Complete step folders of DIR (named step_XXXXXXXX; *.tmp folders are not), by step, oldest
// first. Empty when DIR does not exist or is not a directory.
std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir);

// The "state" object of a step folder's index.json, checking the index alone (its form and
// CRC; the tensor files are not read): what a resume needs of older step folders (the metrics
// line a training run records there, train/trainer.h). Throws CheckpointError.
nlohmann::json read_checkpoint_state(const std::string& folder);

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

// Checks that `saved` (names and shapes, from `source`, e.g. "checkpoint runs/x/step_00000100")
// hold exactly the names of `expected` with those shapes: nothing missing, nothing extra, no
// other shape. Throws CheckpointError naming the first offending tensor.
void check_tensor_set(const std::string& source, const std::vector<std::pair<std::string, Shape>>& expected,
                      const std::vector<std::pair<std::string, Shape>>& saved);
void check_tensor_set(const std::string& source, const std::vector<std::pair<std::string, Shape>>& expected,
                      const std::vector<std::pair<std::string, Tensor>>& tensors);

// Model weights only: from a checkpoint DIR or step folder (verifying index.json and the
// model's files, assembled one tensor at a time), or from a bare safetensors file (e.g. GPT-2 from the Hugging Face hub),
// or from a folder holding model.safetensors but no index.json.
std::vector<std::pair<std::string, Tensor>> load_model_weights(const std::string& path);

}  // namespace meshtrain::train
