// Checkpoint directories: save (tmp folder, fsync, atomic swap, `latest`), verify, load.
// Layout and guarantees are in checkpoint.h.
#include "meshtrain/train/checkpoint.h"

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

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "meshtrain-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
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

// ---- index.json ----

std::string index_text(const CheckpointRefs& data, const FileDigest& model,
                       const FileDigest& optimizer) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = data.step;
  j["config"] = data.config;
  j["state"] = data.state;
  j["files"][kModelFile] = {{"size", model.size}, {"crc32", model.crc32}};
  j["files"][kOptimizerFile] = {{"size", optimizer.size}, {"crc32", optimizer.crc32}};
  j["index_crc32"] = crc_of(j.dump());  // "index_crc32" is not yet in j when dumped
  return j.dump(2) + "\n";
}

// Reads and checks index.json of a step folder: parses, its own CRC, format, file list.
nlohmann::json read_index(const std::string& folder) {
  const std::string path = (fs::path(folder) / kIndexFile).string();
  if (!fs::is_regular_file(path)) incomplete(folder, std::string(kIndexFile) + " is missing");
  const std::string raw = read_text(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(raw);
  } catch (const nlohmann::json::exception& e) {
    corrupt(folder, std::string(kIndexFile) + " is not valid JSON (" + e.what() + ")");
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
  if (j["version"].get<int>() > kVersion)
    throw CheckpointError("checkpoint " + folder + " has format version " +
                          j["version"].dump() + ", newer than this build reads (" +
                          std::to_string(kVersion) + "); use a newer meshtrain");
  if (!j["step"].is_number_integer() || !j["config"].is_object() || !j["state"].is_object() ||
      !j["files"].is_object())
    corrupt(folder, std::string(kIndexFile) + " lacks step, config, state or files");
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

NamedTensors read_checked(const std::string& folder, const std::string& name) {
  return read_safetensors((fs::path(folder) / name).string());
}

}  // namespace

// ---- save ----

std::string step_folder_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string save_checkpoint(const std::string& dir, const CheckpointRefs& data, int keep_last) {
  if (data.step < 0) throw std::invalid_argument("checkpoint step must be >= 0");
  if (!data.config.is_object() || !data.state.is_object())
    throw std::invalid_argument("checkpoint config and state must be JSON objects");
  const std::string name = step_folder_name(data.step);
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string tmp = final_path + ".tmp";
  try {
    fs::create_directories(dir);
    fs::remove_all(tmp);  // left over from an interrupted save of this step
    fs::create_directory(tmp);
    const std::map<std::string, std::string> meta = {{"format", "pt"}};
    const FileDigest model = write_safetensors((fs::path(tmp) / kModelFile).string(), data.model, meta);
    const FileDigest optimizer =
        write_safetensors((fs::path(tmp) / kOptimizerFile).string(), data.optimizer, meta);
    write_file_atomic((fs::path(tmp) / kIndexFile).string(), index_text(data, model, optimizer));
    fsync_directory(tmp);
    install_folder(tmp, final_path);
    fsync_directory(dir);
    write_file_atomic((fs::path(dir) / kLatestFile).string(), name + "\n");
    if (keep_last > 0) prune(dir, data.step, keep_last);
  } catch (const fs::filesystem_error& e) {
    throw CheckpointWriteError("cannot save checkpoint " + final_path + ": " + e.what() +
                               "; check free disk space and permissions");
  } catch (const CheckpointError& e) {  // from the file writers: already names file and cause
    throw CheckpointWriteError("cannot save checkpoint " + final_path + ": " + e.what());
  }
  return final_path;
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
  std::string name = read_text(latest.string());
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  if (!parse_step_folder(name))
    throw CheckpointError("checkpoint directory " + dir + ": `latest` holds '" + name +
                          "', not a step folder name; fix or delete the file");
  const fs::path folder = fs::path(dir) / name;
  if (!fs::is_directory(folder))
    throw CheckpointError("checkpoint directory " + dir + ": `latest` names " + name +
                          ", which does not exist; restore it or point `latest` at another step");
  return folder.string();
}

CheckpointData load_checkpoint_model(const std::string& path) try {
  const std::string folder = resolve_step_folder(path);
  const nlohmann::json index = read_index(folder);
  verify_file(folder, index, kModelFile);
  CheckpointData out;
  out.step = index["step"].get<int64_t>();
  out.config = index["config"];
  out.state = index["state"];
  out.model = read_checked(folder, kModelFile);
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
  const nlohmann::json index = read_index(folder);
  for (const char* f : {kModelFile, kOptimizerFile}) verify_file(folder, index, f);
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
  if (have_latest && fs::is_regular_file(latest_path, ec)) {
    std::string name = read_text(latest_path.string());
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (parse_step_folder(name)) latest = name;
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
    rp.notes.push_back("`latest` in " + dir + " does not name a step folder; resuming from the newest valid one, " +
                       chosen);
  else if (*latest != chosen)
    rp.notes.push_back("`latest` in " + dir + " names " + *latest + " but the newest valid step folder is " +
                       chosen + "; resuming from " + chosen);
  return rp;
}

void check_tensor_set(const std::string& source, const std::vector<std::pair<std::string, Shape>>& expected,
                      const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::map<std::string, const Tensor*> got;
  for (const auto& [n, t] : tensors) got[n] = &t;
  for (const auto& [name, shape] : expected) {
    auto it = got.find(name);
    if (it == got.end())
      throw CheckpointError(source + " lacks tensor " + name + " " + shape_str(shape) +
                            ", which its index config needs; the checkpoint does not match its index");
    if (it->second->shape() != shape)
      throw CheckpointError(source + ": tensor " + name + " has shape " + shape_str(it->second->shape()) +
                            " but its index config needs " + shape_str(shape) +
                            "; the checkpoint does not match its index");
    got.erase(it);
  }
  if (!got.empty())
    throw CheckpointError(source + " holds tensor " + got.begin()->first +
                          ", which its index config has no place for; the checkpoint does not match its index");
}

CheckpointData load_checkpoint(const std::string& path) try {
  const std::string folder = resolve_step_folder(path);
  const nlohmann::json index = read_index(folder);
  for (const char* f : {kModelFile, kOptimizerFile}) verify_file(folder, index, f);
  CheckpointData out;
  out.step = index["step"].get<int64_t>();
  out.config = index["config"];
  out.state = index["state"];
  out.model = read_checked(folder, kModelFile);
  out.optimizer = read_checked(folder, kOptimizerFile);
  return out;
} catch (const fs::filesystem_error& e) {
  throw CheckpointError("cannot load checkpoint " + path + ": " + e.what());
}

std::vector<std::pair<std::string, Tensor>> load_model_weights(const std::string& path) try {
  if (fs::is_regular_file(path)) return read_safetensors(path);
  if (!fs::is_directory(path))
    throw CheckpointError("weights " + path +
                          " do not exist; pass a checkpoint directory, a step folder or a "
                          ".safetensors file");
  const fs::path p(path);
  if (!fs::exists(p / kIndexFile) && !fs::exists(p / kLatestFile)) {
    if (fs::is_regular_file(p / kModelFile)) return read_safetensors((p / kModelFile).string());
    throw CheckpointError("no weights in " + path + ": it holds neither a checkpoint (" +
                          kIndexFile + " or latest) nor " + kModelFile);
  }
  const std::string folder = resolve_step_folder(path);
  const nlohmann::json index = read_index(folder);
  verify_file(folder, index, kModelFile);
  return read_checked(folder, kModelFile);
} catch (const fs::filesystem_error& e) {
  throw CheckpointError("cannot load weights from " + path + ": " + e.what());
}

}  // namespace meshtrain::train
