// Checkpoint directories: the sharded save (tmp folder, every rank's files, index, atomic swap,
// `latest`), the index and its pieces, verification, resume. Layout and guarantees are in
// checkpoint.h; reading pieces is in piece_reader.cpp.
#include "meshtrain/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "meshtrain/checkpoint/stop_deferred.h"
#include "meshtrain/io/json.h"

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "meshtrain-checkpoint";
constexpr int kVersion = 2;
constexpr const char* kModelFile = "model.safetensors";          // version 1
constexpr const char* kOptimizerFile = "optimizer.safetensors";  // version 1
constexpr const char* kPiecesKey = "meshtrain.pieces";           // a rank file's piece table
constexpr const char* kIndexFile = "index.json";
constexpr const char* kLatestFile = "latest";

// "step_00000100" -> 100; anything else (including "step_00000100.tmp") -> nullopt.
std::optional<int64_t> parse_step_folder(const std::string& name) {
  if (name.size() < 6 || name.rfind("step_", 0) != 0 || name.size() > 5 + 18) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

[[noreturn]] void corrupt(const std::string& folder, const std::string& what) {
  throw CheckpointError("checkpoint " + folder + " is corrupt: " + what +
                        "; delete it or resume from an earlier step");
}

[[noreturn]] void incomplete(const std::string& folder, const std::string& what) {
  throw CheckpointError("checkpoint " + folder + " is incomplete: " + what +
                        "; delete it or resume from an earlier step");
}

uint32_t crc_of(const std::string& s) {
  return static_cast<uint32_t>(
      ::crc32(::crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(s.data()),
              static_cast<uInt>(s.size())));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in) throw CheckpointError("cannot read " + path);
  return ss.str();
}

// The name `latest` holds, trailing whitespace dropped. Only its first 4 KiB are read: a step
// folder name is 23 bytes at most, and anything longer is refused anyway.
std::string read_latest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read " + path);
  std::string name(4096, '\0');
  in.read(name.data(), static_cast<std::streamsize>(name.size()));
  name.resize(static_cast<size_t>(in.gcount()));
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  return name;
}

// `text` as it can be quoted in a message: bytes that are not printable ASCII (a NUL would
// end the message where it is printed) as \xNN, and at most 64 bytes of it.
std::string printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 64; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > 64) out += "...";
  return out;
}

// ---- index.json ----

std::string index_text(nlohmann::json j) {
  j["index_crc32"] = crc_of(j.dump());  // "index_crc32" is not yet in j when dumped
  return j.dump(2) + "\n";
}

// ---- pieces as JSON ----

nlohmann::json tp_json(const nn::ShardSpec& s) {
  return {{"dim", s.dim}, {"groups", s.groups}, {"rank", s.rank}, {"size", s.size}, {"padded", s.padded}};
}

// The key of a piece inside its file (checkpoint.h).
std::string piece_key(const PieceSpec& p) {
  if (p.whole()) return p.name;
  std::string k = p.name;
  if (p.tp.is_split()) k += "[tp " + std::to_string(p.tp.rank) + "/" + std::to_string(p.tp.size) + "]";
  return k + "[" + std::to_string(p.begin) + ":" + std::to_string(p.end) + "]";
}

// One entry of a rank file's piece table (and, with "file", of the index).
nlohmann::json piece_json(const PieceSpec& p) {
  nlohmann::json j = {{"name", p.name}, {"shape", p.shape}, {"range", {p.begin, p.end}}};
  if (p.tp.is_split()) j["tp"] = tp_json(p.tp);
  return j;
}

// Reads and checks index.json of a step folder: parses, its own CRC, format, file list.
nlohmann::json read_index(const std::string& folder) {
  const std::string path = (fs::path(folder) / kIndexFile).string();
  if (!fs::is_regular_file(path)) incomplete(folder, std::string(kIndexFile) + " is missing");
  const std::string raw = read_text(path);
  nlohmann::json j;
  try {
    // Strict (io/json.h): a key given twice is damage even where the CRC matches.
    j = io::parse_json_strict(raw, kIndexFile, "");
  } catch (const io::JsonError& e) {
    corrupt(folder, std::string(kIndexFile) + " " + e.problem());
  }
  if (!j.is_object() || !j.contains("index_crc32") || !j["index_crc32"].is_number_unsigned())
    corrupt(folder, std::string(kIndexFile) + " has no index_crc32");
  // The file is exactly what index_text() wrote, so any changed byte shows up either here
  // (layout) or in the CRC below (content).
  if (raw != j.dump(2) + "\n")
    corrupt(folder, std::string(kIndexFile) + " differs from the form meshtrain writes (edited "
                    "or damaged)");
  const auto recorded = j["index_crc32"].get<uint64_t>();
  j.erase("index_crc32");
  const uint32_t actual = crc_of(j.dump());
  if (actual != recorded)
    corrupt(folder, std::string(kIndexFile) + " has CRC32 " + std::to_string(actual) +
                        " but records " + std::to_string(recorded));
  if (j["format"] != kFormat || !j["version"].is_number_integer())
    corrupt(folder, std::string(kIndexFile) + " is not a meshtrain checkpoint index");
  if (j["version"].get<int>() < 1)
    corrupt(folder, std::string(kIndexFile) + " records format version " + j["version"].dump());
  if (j["version"].get<int>() > kVersion)
    throw CheckpointError("checkpoint " + folder + " has format version " +
                          j["version"].dump() + ", newer than this build reads (" +
                          std::to_string(kVersion) + "); use a newer meshtrain");
  if (!j["step"].is_number_integer() || !j["config"].is_object() || !j["state"].is_object() ||
      !j["files"].is_object())
    corrupt(folder, std::string(kIndexFile) + " lacks step, config, state or files");
  if (j["version"].get<int>() >= 2 && (!j.contains("tensors") || !j["tensors"].is_object()))
    corrupt(folder, std::string(kIndexFile) + " lacks its tensors");
  const auto name_step = parse_step_folder(fs::path(folder).filename().string());
  if (name_step && *name_step != j["step"].get<int64_t>())
    corrupt(folder, std::string(kIndexFile) + " records step " + j["step"].dump() +
                        ", not the folder's step " + std::to_string(*name_step));
  return j;
}

// Checks one file of a step folder against the size and CRC32 recorded in the index.
void verify_file(const std::string& folder, const nlohmann::json& index, const std::string& name) {
  if (!index["files"].contains(name)) corrupt(folder, std::string(kIndexFile) + " does not list " + name);
  const auto& rec = index["files"][name];
  if (!rec.is_object() || !rec.contains("size") || !rec.contains("crc32") ||
      !rec["size"].is_number_unsigned() || !rec["crc32"].is_number_unsigned())
    corrupt(folder, std::string(kIndexFile) + " has no size and crc32 for " + name);
  const std::string path = (fs::path(folder) / name).string();
  if (!fs::is_regular_file(path)) incomplete(folder, name + " is missing");
  const auto want_size = rec["size"].get<uint64_t>();
  const auto size = fs::file_size(path);
  if (size != want_size)
    corrupt(folder, name + " has " + std::to_string(size) + " bytes but " + kIndexFile +
                        " records " + std::to_string(want_size) + " (truncated?)");
  const FileDigest d = file_digest(path);
  if (static_cast<uint64_t>(d.size) != want_size)
    corrupt(folder, name + " changed size while being read");
  if (d.crc32 != rec["crc32"].get<uint64_t>())
    corrupt(folder, name + " has CRC32 " + std::to_string(d.crc32) + " but " + kIndexFile +
                        " records " + rec["crc32"].dump());
}

// A step folder from a checkpoint DIR (via `latest`) or a step folder itself.
std::string resolve_step_folder(const std::string& path) {
  if (!fs::is_directory(path))
    throw CheckpointError("checkpoint " + path +
                          " does not exist or is not a directory; check the path");
  if (fs::exists(fs::path(path) / kIndexFile)) return path;
  if (auto latest = latest_checkpoint(path)) return *latest;
  throw CheckpointError("no checkpoint in " + path + ": it holds neither " + kIndexFile +
                        " (a step folder) nor `latest` (a checkpoint directory)");
}

// Renames `tmp` to `final`, atomically replacing an existing `final` folder.
void install_folder(const std::string& tmp, const std::string& final_path) {
  if (!fs::exists(final_path)) {
    fs::rename(tmp, final_path);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp);  // now holds the replaced checkpoint
    return;
  }
  // File systems without RENAME_EXCHANGE: a short window where the step folder is absent.
  const std::string old = final_path + ".old";
  fs::remove_all(old);
  fs::rename(final_path, old);
  fs::rename(tmp, final_path);
  fs::remove_all(old);
}

void prune(const std::string& dir, int64_t saved_step, int keep_last) {
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto step = parse_step_folder(e.path().filename().string());
    if (step && *step < saved_step && e.is_directory()) older.emplace_back(*step, e.path());
  }
  std::sort(older.begin(), older.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_last - 1); i < older.size(); ++i)
    fs::remove_all(older[i].second);
}

// The files a loader needs verified: version 1's fixed pair, or every file the index lists
// (with model_only, those that do not hold optimizer state).
std::vector<std::string> files_to_verify(const nlohmann::json& index, bool model_only) {
  if (index["version"].get<int>() == 1)
    return model_only ? std::vector<std::string>{kModelFile} : std::vector<std::string>{kModelFile, kOptimizerFile};
  std::vector<std::string> out;
  for (auto it = index["files"].begin(); it != index["files"].end(); ++it)
    if (!model_only || it.key().rfind("optimizer", 0) != 0) out.push_back(it.key());
  return out;
}

void verify_files(const std::string& folder, const nlohmann::json& index, bool model_only) {
  const auto files = files_to_verify(index, model_only);
  if (files.empty()) corrupt(folder, std::string(kIndexFile) + " lists no files");
  for (const std::string& f : files) verify_file(folder, index, f);
}

// ---- the index's pieces ----

StoredPiece parse_piece(const std::string& folder, const std::string& name, const Shape& shape,
                        const nlohmann::json& files, const nlohmann::json& j) {
  const std::string where = std::string(kIndexFile) + ": a piece of " + name;
  if (!j.is_object() || !j.contains("file") || !j["file"].is_string() || !j.contains("key") ||
      !j["key"].is_string() || !j.contains("range") || !j["range"].is_array() || j["range"].size() != 2 ||
      !j["range"][0].is_number_unsigned() || !j["range"][1].is_number_unsigned())
    corrupt(folder, where + " lacks file, key or range");
  StoredPiece p;
  p.file = j["file"].get<std::string>();
  p.key = j["key"].get<std::string>();
  if (!files.contains(p.file)) corrupt(folder, where + " names " + p.file + ", which the index does not list");
  p.spec.name = name;
  p.spec.shape = shape;
  p.spec.begin = j["range"][0].get<int64_t>();
  p.spec.end = j["range"][1].get<int64_t>();
  if (j.contains("tp")) {
    const auto& t = j["tp"];
    for (const char* k : {"dim", "groups", "rank", "size"})
      if (!t.is_object() || !t.contains(k) || !t[k].is_number_integer()) corrupt(folder, where + " has a bad tp spec");
    if (!t.contains("padded") || !t["padded"].is_boolean()) corrupt(folder, where + " has a bad tp spec");
    nn::ShardSpec& s = p.spec.tp;
    s.kind = nn::ShardSpec::Kind::kSplit;
    s.dim = t["dim"].get<int>(), s.groups = t["groups"].get<int>(), s.rank = t["rank"].get<int>();
    s.size = t["size"].get<int>(), s.padded = t["padded"].get<bool>();
    if (s.size < 2 || s.rank < 0 || s.rank >= s.size || s.groups < 1 || s.dim < 0 ||
        s.dim >= static_cast<int>(shape.size()))
      corrupt(folder, where + " has a tp spec that cannot cut " + shape_str(shape) + ": " + t.dump());
  }
  Shape local;
  try {
    local = p.spec.tp.local_shape(shape);
  } catch (const std::invalid_argument& e) {
    corrupt(folder, where + " has a tp spec that cannot cut " + shape_str(shape) + " (" + e.what() + ")");
  }
  if (p.spec.begin > p.spec.end || p.spec.end > shape_numel(local))
    corrupt(folder, where + " has range [" + std::to_string(p.spec.begin) + ", " + std::to_string(p.spec.end) +
                        ") outside its " + std::to_string(shape_numel(local)) + " elements");
  return p;
}

// Whether the pieces of a tensor cover every element of it exactly once.
void check_tiling(const std::string& folder, const std::string& name, const StoredTensor& t) {
  std::vector<std::pair<int64_t, int64_t>> runs;  // (global index, count)
  for (const StoredPiece& p : t.pieces)
    p.spec.tp.for_each_run(t.shape, p.spec.begin, p.spec.end,
                           [&](int64_t, int64_t g, int64_t n) { runs.emplace_back(g, n); });
  std::sort(runs.begin(), runs.end());
  int64_t next = 0;
  for (const auto& [g, n] : runs) {
    if (g < next) corrupt(folder, std::string(kIndexFile) + ": pieces of " + name + " overlap at element " + std::to_string(g));
    if (g > next) break;
    next = g + n;
  }
  if (next != shape_numel(t.shape))
    incomplete(folder, "the pieces of " + name + " " + shape_str(t.shape) + " do not cover element " +
                           std::to_string(next));
}

// Version 2: the "tensors" object. Version 1: each tensor of the two files one whole piece.
void read_tensors(const std::string& folder, const nlohmann::json& index, bool model_only, CheckpointIndex& out) {
  if (out.version == 1) {
    for (const char* f : {kModelFile, kOptimizerFile}) {
      if (model_only && std::string(f) == kOptimizerFile) continue;
      for (const SafetensorsEntry& e : read_safetensors_header((fs::path(folder) / f).string())) {
        StoredTensor t{e.shape, {}};
        t.pieces.push_back({{e.name, e.shape, {}, 0, shape_numel(e.shape)}, f, e.name});
        (std::string(f) == kModelFile ? out.model : out.optimizer)[e.name] = std::move(t);
      }
    }
    return;
  }
  const auto& tensors = index["tensors"];
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const auto& j = *it;
    if (!j.is_object() || !j.contains("shape") || !j["shape"].is_array() || !j.contains("pieces") ||
        !j["pieces"].is_array() || j["pieces"].empty() || !j["pieces"][0].is_object() ||
        !j["pieces"][0].contains("file") || !j["pieces"][0]["file"].is_string())
      corrupt(folder, std::string(kIndexFile) + ": tensor " + it.key() + " lacks shape or pieces");
    // Model or optimizer state: the kind of file its pieces lie in (rank_file_name).
    const bool opt = j["pieces"][0]["file"].get<std::string>().rfind("optimizer", 0) == 0;
    if (opt && model_only) continue;
    StoredTensor t;
    for (const auto& d : j["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        corrupt(folder, std::string(kIndexFile) + ": tensor " + it.key() + " has a bad shape");
      t.shape.push_back(d.get<int64_t>());
    }
    for (const auto& pj : j["pieces"]) t.pieces.push_back(parse_piece(folder, it.key(), t.shape, index["files"], pj));
    for (const StoredPiece& p : t.pieces)
      if ((p.file.rfind("optimizer", 0) == 0) != opt)
        corrupt(folder, std::string(kIndexFile) + ": tensor " + it.key() + " has pieces in model and optimizer files");
    check_tiling(folder, it.key(), t);
    (opt ? out.optimizer : out.model)[it.key()] = std::move(t);
  }
}

// Whether the files' headers hold every piece where the index says, as meshtrain writes it:
// under its key, float32, in the logical shape when it is the whole tensor, else 1-D of its
// elements. (The CRCs only say the files are those the save wrote; a file written by another
// program with the right CRCs recorded could still disagree with the index.)
void check_piece_headers(const std::string& folder, const CheckpointIndex& index) {
  std::map<std::string, std::map<std::string, SafetensorsEntry>> headers;  // file -> key -> entry
  for (const auto* part : {&index.model, &index.optimizer})
    for (const auto& [name, t] : *part)
      for (const StoredPiece& p : t.pieces) {
        auto [it, added] = headers.try_emplace(p.file);
        if (added)
          for (SafetensorsEntry& e : read_safetensors_header((fs::path(folder) / p.file).string()))
            it->second.emplace(e.name, std::move(e));
        const Shape want = p.spec.whole() ? p.spec.shape : Shape{p.spec.numel()};
        const auto e = it->second.find(p.key);
        if (e == it->second.end())
          corrupt(folder, p.file + " lacks tensor " + p.key + ", which " + kIndexFile + " records as a piece of " +
                              name);
        if (e->second.dtype != "F32" || e->second.shape != want)
          corrupt(folder, p.file + " holds tensor " + p.key + " as " + e->second.dtype + " " +
                              shape_str(e->second.shape) + " but " + kIndexFile + " records it as F32 " +
                              shape_str(want) +
                              (p.spec.whole() ? std::string()
                                              : ", elements [" + std::to_string(p.spec.begin) + ", " +
                                                    std::to_string(p.spec.end) + ") of " + name + " " +
                                                    shape_str(t.shape)));
      }
}

// A save's failures as CheckpointWriteError naming the checkpoint.
template <class F>
auto writing(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const fs::filesystem_error& e) {
    throw CheckpointWriteError("cannot save checkpoint " + what + ": " + e.what() +
                               "; check free disk space and permissions");
  } catch (const CheckpointError& e) {  // from the file writers: already names file and cause
    throw CheckpointWriteError("cannot save checkpoint " + what + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {  // a rank file's piece table
    throw CheckpointWriteError("cannot save checkpoint " + what + ": a piece table does not parse (" + e.what() + ")");
  }
}

}  // namespace

// ---- save ----

std::string step_folder_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file_name(const std::string& kind, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05d.safetensors", rank);
  return kind + buf;
}

std::string begin_save(const std::string& dir, int64_t step) {
  if (step < 0) throw std::invalid_argument("checkpoint step must be >= 0");
  const std::string tmp = (fs::path(dir) / step_folder_name(step)).string() + ".tmp";
  return writing(tmp, [&] {
    fs::create_directories(dir);
    fs::remove_all(tmp);  // left over from an interrupted save of this step
    fs::create_directory(tmp);
    return tmp;
  });
}

RankFiles write_rank_pieces(const std::string& tmp, int rank, const RankPieces& pieces) {
  auto write = [&](const std::string& kind, const std::vector<SavePiece>& list) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    nlohmann::json table = nlohmann::json::object();
    for (const SavePiece& p : list) {
      if (p.data.numel() != p.spec.numel())
        throw std::invalid_argument("piece " + piece_key(p.spec) + " has " + std::to_string(p.data.numel()) +
                                    " elements");
      const std::string key = piece_key(p.spec);
      tensors.emplace_back(key, Tensor::view(p.data, 0, p.spec.whole() ? p.spec.shape : Shape{p.spec.numel()}));
      table[key] = piece_json(p.spec);
    }
    const std::string path = (fs::path(tmp) / rank_file_name(kind, rank)).string();
    return writing(path, [&] { return write_safetensors(path, tensors, {{"format", "pt"}, {kPiecesKey, table.dump()}}); });
  };
  return {write("model", pieces.model), write("optimizer", pieces.optimizer)};
}

std::string commit_save(const std::string& dir, int64_t step, const nlohmann::json& config,
                        const nlohmann::json& state, const std::vector<RankFiles>& files, int keep_last) {
  if (!config.is_object() || !state.is_object())
    throw std::invalid_argument("checkpoint config and state must be JSON objects");
  const std::string name = step_folder_name(step);
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string tmp = final_path + ".tmp";
  return writing(final_path, [&] {
    nlohmann::json j;
    j["format"] = kFormat;
    j["version"] = kVersion;
    j["step"] = step;
    j["config"] = config;
    j["state"] = state;
    j["files"] = nlohmann::json::object();
    j["tensors"] = nlohmann::json::object();
    for (size_t r = 0; r < files.size(); ++r) {
      for (const auto& [kind, digest] : {std::pair{"model", files[r].model}, std::pair{"optimizer", files[r].optimizer}}) {
        const std::string f = rank_file_name(kind, static_cast<int>(r));
        j["files"][f] = {{"size", digest.size}, {"crc32", digest.crc32}};
        // The rank's piece table, from its file's header (what it wrote, not what we expect).
        const auto meta = read_safetensors_metadata((fs::path(tmp) / f).string());
        const auto it = meta.find(kPiecesKey);
        if (it == meta.end()) throw CheckpointError(f + " has no piece table");
        nlohmann::json table;
        try {
          table = io::parse_json_strict(it->second, f, "");
        } catch (const io::JsonError& e) {
          throw CheckpointError(f + "'s piece table " + e.problem());
        }
        for (auto p = table.begin(); p != table.end(); ++p) {
          auto& t = j["tensors"][(*p)["name"].get<std::string>()];
          t["shape"] = (*p)["shape"];
          nlohmann::json piece = {{"file", f}, {"key", p.key()}, {"range", (*p)["range"]}};
          if (p->contains("tp")) piece["tp"] = (*p)["tp"];
          t["pieces"].push_back(piece);
        }
      }
    }
    write_file_atomic((fs::path(tmp) / kIndexFile).string(), index_text(j));
    fsync_directory(tmp);
    {
      // A second stop signal (train/stop.h, stop_deferred.h) waits for these: without that it
      // could end the process with `latest.tmp` left and `latest` not naming the folder just
      // installed.
      const StopDeferred deferred;
      install_folder(tmp, final_path);
      fsync_directory(dir);
      write_file_atomic((fs::path(dir) / kLatestFile).string(), name + "\n");
    }
    if (keep_last > 0) prune(dir, step, keep_last);
    return final_path;
  });
}

std::string save_checkpoint(const std::string& dir, const CheckpointRefs& data, int keep_last) {
  if (!data.config.is_object() || !data.state.is_object())
    throw std::invalid_argument("checkpoint config and state must be JSON objects");
  RankPieces pieces;
  auto add = [](std::vector<SavePiece>& out, const std::string& name, const Tensor* t) {
    if (t == nullptr) throw std::invalid_argument("tensor '" + name + "' is null");
    out.push_back({{name, t->shape(), {}, 0, t->numel()}, *t});
  };
  for (const auto& [n, t] : data.model) add(pieces.model, n, t);
  for (const auto& [n, t] : data.optimizer) add(pieces.optimizer, n, t);
  const std::string tmp = begin_save(dir, data.step);
  const RankFiles files = write_rank_pieces(tmp, 0, pieces);
  return commit_save(dir, data.step, data.config, data.state, {files}, keep_last);
}

std::string save_checkpoint(const std::string& dir, const CheckpointData& data, int keep_last) {
  CheckpointRefs refs{data.step, data.config, data.state, {}, {}};
  for (const auto& [n, t] : data.model) refs.model.emplace_back(n, &t);
  for (const auto& [n, t] : data.optimizer) refs.optimizer.emplace_back(n, &t);
  return save_checkpoint(dir, refs, keep_last);
}

// ---- load ----

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  const fs::path latest = fs::path(dir) / kLatestFile;
  if (!fs::is_regular_file(latest)) return std::nullopt;
  const std::string name = read_latest(latest.string());
  if (!parse_step_folder(name))
    throw CheckpointError("checkpoint directory " + dir + ": `latest` holds '" + printable(name) +
                          "', not a step folder name; fix or delete the file");
  const fs::path folder = fs::path(dir) / name;
  if (!fs::is_directory(folder))
    throw CheckpointError("checkpoint directory " + dir + ": `latest` names " + name +
                          ", which does not exist; restore it or point `latest` at another step");
  return folder.string();
}

CheckpointIndex open_checkpoint(const std::string& path, bool model_only) try {
  CheckpointIndex out;
  out.folder = resolve_step_folder(path);
  const nlohmann::json index = read_index(out.folder);
  verify_files(out.folder, index, model_only);
  out.version = index["version"].get<int>();
  out.step = index["step"].get<int64_t>();
  out.config = index["config"];
  out.state = index["state"];
  read_tensors(out.folder, index, model_only, out);
  if (out.version >= 2) check_piece_headers(out.folder, out);
  return out;
} catch (const fs::filesystem_error& e) {
  throw CheckpointError("cannot load checkpoint " + path + ": " + e.what());
}

std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto step = parse_step_folder(e.path().filename().string());
    if (step && e.is_directory(ec)) out.emplace_back(*step, e.path().string());
  }
  if (ec) throw CheckpointError("cannot list checkpoint directory " + dir + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void verify_checkpoint(const std::string& folder) try {
  verify_files(folder, read_index(folder), false);
} catch (const fs::filesystem_error& e) {
  throw CheckpointError("cannot read checkpoint " + folder + ": " + e.what());
}
nlohmann::json read_checkpoint_state(const std::string& folder) try {
  return read_index(folder)["state"];
} catch (const fs::filesystem_error& e) {
  throw CheckpointError("cannot read checkpoint " + folder + ": " + e.what());
}

ResumePoint find_resume_point(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw CheckpointError("--checkpoint-dir " + dir + " does not exist, so there is nothing to resume; "
                          "check the path (a run without --resume creates the directory)");
  if (!fs::is_directory(dir, ec))
    throw CheckpointError("--checkpoint-dir " + dir + " is not a directory; give the directory the run saved its "
                          "checkpoints in");
  // What `latest` says (a hint only: the folders decide).
  const fs::path latest_path = fs::path(dir) / kLatestFile;
  const bool have_latest = fs::exists(latest_path, ec);
  std::optional<std::string> latest;
  std::string latest_text;  // what `latest` holds when it names no step folder
  if (have_latest && fs::is_regular_file(latest_path, ec)) {
    std::string name = read_latest(latest_path.string());
    if (parse_step_folder(name)) latest = name;
    else latest_text = name;
  }
  const auto folders = step_folders(dir);
  ResumePoint rp;
  if (folders.empty()) {
    if (latest)
      throw CheckpointError("checkpoint directory " + dir + ": `latest` names " + *latest +
                            " but no step folder is there; restore the checkpoints, or delete `latest` to start "
                            "from step 0");
    rp.notes.push_back("no checkpoint in " + dir + " yet; starting from step 0");
    return rp;
  }
  std::string first_problem;
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    const std::string name = fs::path(it->second).filename().string();
    try {
      verify_checkpoint(it->second);
    } catch (const CheckpointError& e) {
      if (first_problem.empty()) first_problem = e.what();
      rp.notes.push_back("skipping " + name + ", which is not a valid checkpoint (" + e.what() + ")");
      continue;
    }
    rp.folder = it->second;
    rp.step = it->first;
    break;
  }
  if (!rp.folder)
    throw CheckpointError("none of the " + std::to_string(folders.size()) + " step folder(s) in " + dir +
                          " is a valid checkpoint (newest: " + first_problem +
                          "); repair or remove them, or use another --checkpoint-dir");
  const std::string chosen = fs::path(*rp.folder).filename().string();
  if (!have_latest)
    rp.notes.push_back("`latest` is missing in " + dir + "; resuming from the newest valid step folder, " + chosen);
  else if (!latest)
    rp.notes.push_back("`latest` in " + dir + " holds '" + printable(latest_text) +
                       "', not a step folder name; resuming from the newest valid one, " + chosen);
  else if (*latest != chosen)
    rp.notes.push_back("`latest` in " + dir + " names " + *latest + " but the newest valid step folder is " +
                       chosen + "; resuming from " + chosen);
  return rp;
}

}  // namespace meshtrain::train
