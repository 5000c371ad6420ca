// The output policy of train/outputs.h.
#include "meshtrain/train/outputs.h"

#include <limits.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/io/npy.h"
#include "meshtrain/pipeline/svg.h"
#include "meshtrain/trace/trace.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

// The first `n` bytes of a file ("" when it cannot be read).
std::string head(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  std::string s(n, '\0');
  f.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(std::max<std::streamsize>(0, f.gcount())));
  return s;
}

// The real path of `path`'s directory plus its name; the file's own real path when it exists
// (a symbolic link to an input is then the input).
std::string resolve(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec) return path;
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec) return abs.lexically_normal().string();
  std::string s = r.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// `inner` is `outer` or lies below it.
bool under(const std::string& inner, const std::string& outer) {
  if (inner == outer) return true;
  const std::string o = outer == "/" ? outer : outer + "/";
  return inner.compare(0, o.size(), o) == 0;
}

// The same file: the same resolved path, or the same inode (a hard link).
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa{}, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino && S_ISREG(sa.st_mode);
}

// A name a checkpoint directory `dir` manages: DIR/latest (and its .tmp), or DIR/step_* and
// everything in it.
bool managed_by(const std::string& path, const std::string& dir) {
  if (!under(path, dir) || path == dir) return false;
  const std::string rest = path.substr(dir == "/" ? 1 : dir.size() + 1);
  const std::string first = rest.substr(0, rest.find('/'));
  return first == "latest" || first.rfind("latest.", 0) == 0 || first.rfind("step_", 0) == 0;
}

// A step folder's name: step_ and digits (a save in progress is a hidden .tmp folder beside it).
bool step_name(const std::string& name) {
  return name.size() > 5 && name.rfind("step_", 0) == 0 && name.find_first_not_of("0123456789", 5) == std::string::npos;
}

// A directory meshtrain's checkpoints live in, whatever this command was told: it holds a step
// folder with an index, or a `latest` naming one.
bool checkpoint_dir_on_disk(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  std::ifstream latest(dir / "latest");
  std::string named;
  if (latest >> named && step_name(named)) return true;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (step_name(it->path().filename().string()) && fs::exists(it->path() / "index.json", ec)) return true;
  return false;
}

// Where `resolved` (an absolute path) lies among the files of a checkpoint on disk: "" when it
// does not, else the checkpoint directory or step folder it belongs to. Its managed names
// (latest, latest.*, step_*) and everything inside a step folder belong to it.
std::string inside_checkpoint(const std::string& resolved) {
  const fs::path p(resolved), rel = p.relative_path();
  fs::path walk = p.root_path();
  for (const fs::path& component : rel) {
    const std::string part = component.string();
    const fs::path dir = walk;
    walk /= part;
    std::error_code ec;
    const bool managed_name = part == "latest" || part.rfind("latest.", 0) == 0 || step_name(part);
    if (managed_name && checkpoint_dir_on_disk(dir)) return (fs::is_directory(walk, ec) ? walk : dir).string();
    if (step_name(part) && fs::exists(walk / "index.json", ec) && walk != p) return walk.string();
  }
  return "";
}

std::string kind_name(OutputKind k) {
  switch (k) {
    case OutputKind::metrics: return "a metrics file";
    case OutputKind::trace: return "a trace";
    case OutputKind::svg: return "a swimlane";
    case OutputKind::safetensors: return "a converted checkpoint";
    case OutputKind::machine: return "a machine file";
    case OutputKind::events: return "a launcher's events file";
    case OutputKind::model: return "a model file meshtrain import wrote";
    case OutputKind::npz: return "a NumPy archive meshtrain wrote";
  }
  return "a file";
}

}  // namespace

bool written_by_meshtrain(const std::string& path, OutputKind kind) {
  std::error_code ec;
  if (!fs::exists(path, ec) || fs::file_size(path, ec) == 0) return true;
  if (ec) return false;
  switch (kind) {
    case OutputKind::metrics: {
      std::string first = head(path, 1 << 16);
      first = first.substr(0, first.find('\n'));
      const nlohmann::json j = nlohmann::json::parse(first, nullptr, /*allow_exceptions=*/false);
      return j.is_object() && j.contains("step") && j.contains("loss");
    }
    case OutputKind::trace:
      return head(path, 256).find(trace::kTraceWriterMark) != std::string::npos;
    case OutputKind::svg:
      return head(path, 4096).find(pipeline::kSvgMark) != std::string::npos;
    case OutputKind::safetensors: {
      const std::string h = head(path, 8);
      if (h.size() != 8) return false;
      uint64_t n = 0;
      std::memcpy(&n, h.data(), 8);
      if (n == 0 || n > (uint64_t{100} << 20)) return false;
      const nlohmann::json j =
          nlohmann::json::parse(head(path, 8 + static_cast<size_t>(n)).substr(8), nullptr, false);
      return j.is_object() && j.contains("__metadata__") && j["__metadata__"].is_object() &&
             j["__metadata__"].value(kSafetensorsWriterKey, "") == kSafetensorsWriter;
    }
    case OutputKind::machine: {
      // A machine file is a few KiB; a larger file is not one.
      const std::string text = head(path, 1 << 20);
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      return j.is_object() && j.contains("kind") && j["kind"].is_string() && j["kind"] == "meshtrain machine";
    }
    case OutputKind::events: {
      std::string first = head(path, 1 << 16);
      first = first.substr(0, first.find('\n'));
      const nlohmann::json j = nlohmann::json::parse(first, nullptr, /*allow_exceptions=*/false);
      return j.is_object() && j.contains("event") && j["event"] == "start";
    }
    case OutputKind::npz: {
      // The end-of-central-directory record is the last 22 bytes before the comment.
      const std::string mark = io::kNpzWriterComment;
      const auto size = fs::file_size(path, ec);
      if (ec || size < 22 + mark.size()) return false;
      std::ifstream f(path, std::ios::binary);
      f.seekg(static_cast<std::streamoff>(size - 22 - mark.size()));
      std::string tail(22 + mark.size(), '\0');
      if (!f.read(tail.data(), static_cast<std::streamsize>(tail.size()))) return false;
      return tail.compare(0, 4, "PK\x05\x06") == 0 && static_cast<unsigned char>(tail[20]) == mark.size() &&
             tail[21] == 0 && tail.compare(22, mark.size(), mark) == 0;
    }
    case OutputKind::model: {
      const nlohmann::json j = nlohmann::json::parse(head(path, 64 << 20), nullptr, /*allow_exceptions=*/false);
      return j.is_object() && j.contains("layers") && j.contains("imported_from") && j["imported_from"].is_string();
    }
  }
  return false;
}

void check_path_usable(const std::string& flag, const std::string& path) {
  if (path.empty()) bad(flag + " is empty; give a path");
  if (path.size() >= PATH_MAX)
    bad(flag + " is " + std::to_string(path.size()) + " bytes long, more than the " + std::to_string(PATH_MAX - 1) +
        " a path may have (PATH_MAX); choose a shorter path");
  for (const auto& part : fs::path(path))
    if (part.string().size() > NAME_MAX)
      bad(flag + " " + path.substr(0, 60) + "...: the name '" + part.string().substr(0, 40) + "...' is " +
          std::to_string(part.string().size()) + " bytes long, more than the " + std::to_string(NAME_MAX) +
          " a file name may have (NAME_MAX); choose a shorter name");
  const std::string abs = resolve(path);
  if (abs.size() >= PATH_MAX)
    bad(flag + " " + path + " resolves to a path of " + std::to_string(abs.size()) + " bytes, more than PATH_MAX (" +
        std::to_string(PATH_MAX - 1) + "); choose a shorter path");
  // A dangling symbolic link anywhere on the way (the last component included).
  std::error_code ec;
  fs::path walk;
  for (const auto& part : fs::absolute(path, ec)) {
    walk /= part;
    if (fs::is_symlink(fs::symlink_status(walk, ec)) && !fs::exists(walk, ec))
      bad(flag + " " + path + ": " + walk.string() + " is a symbolic link to " +
          fs::read_symlink(walk, ec).string() + ", which does not exist; create its target or choose another path");
  }
}

void PathPlan::add(Role role, const std::string& flag, const std::string& path, OutputKind kind, bool replace_own) {
  if (path.empty()) return;
  entries_.push_back({role, flag, path, resolve(path), kind, replace_own});
}

void PathPlan::input_file(const std::string& flag, const std::string& path) {
  add(Role::input_file, flag, path, OutputKind::metrics, false);
}
void PathPlan::input_tree(const std::string& flag, const std::string& dir) {
  add(Role::input_tree, flag, dir, OutputKind::metrics, false);
}
void PathPlan::output_file(const std::string& flag, const std::string& path, OutputKind kind, bool replace_own) {
  add(Role::output_file, flag, path, kind, replace_own);
}
void PathPlan::side_file(const std::string& flag, const std::string& path) {
  add(Role::side_file, flag, path, OutputKind::metrics, true);
}
void PathPlan::output_checkpoint_dir(const std::string& flag, const std::string& dir) {
  add(Role::checkpoint_dir, flag, dir, OutputKind::metrics, false);
}

void PathPlan::check() const {
  auto is_output = [](Role r) { return r == Role::output_file || r == Role::side_file; };
  auto named = [](const Entry& e) { return e.flag + " " + e.path; };
  for (const Entry& e : entries_) {
    if (is_output(e.role)) {
      check_path_usable(e.flag, e.path);
      check_output_file(e.flag, e.path);
      std::error_code ec;
      const fs::file_status st = fs::status(e.path, ec);
      if (fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st))
        bad(e.flag + " " + e.path + " is not a regular file (a device, pipe or socket); give the path of a file "
            "to write");
    } else if (e.role == Role::checkpoint_dir) {
      check_path_usable(e.flag, e.path);
      check_output_dir(e.flag, e.path);
    }
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& out = entries_[i];
    for (size_t j = 0; j < entries_.size(); ++j) {
      if (i == j) continue;
      const Entry& other = entries_[j];
      if (is_output(out.role)) {
        if (other.role == Role::input_file && same_file(out.resolved, other.resolved))
          bad(named(out) + " is the same file as " + named(other) + ", which this command reads; writing it would " +
              "destroy the input: choose another path for " + out.flag);
        if (other.role == Role::input_tree && under(out.resolved, other.resolved))
          bad(named(out) + " lies inside " + named(other) + ", which this command reads; writing it would change " +
              "the checkpoint being read: choose a path outside it for " + out.flag);
        if (is_output(other.role) && j < i && same_file(out.resolved, other.resolved))
          bad(named(out) + " is the same file as " + named(other) + "; both would be written and one lost: give " +
              out.flag + " another path");
      }
      if (other.role == Role::checkpoint_dir && (is_output(out.role) || out.role == Role::input_file) &&
          managed_by(out.resolved, other.resolved))
        bad(named(out) + " lies among the files " + named(other) + " manages (`latest` and the step_* folders, " +
            "which every save replaces and --keep-checkpoints deletes): choose a path outside them for " + out.flag);
    }
    // Never into a checkpoint on disk, whatever the flags (--overwrite included): a save
    // replaces these names and a resume trusts them. (The checks above name the flags when the
    // checkpoint is one this command reads or writes.)
    if (is_output(out.role) || out.role == Role::checkpoint_dir) {
      const std::string ck = inside_checkpoint(out.resolved);
      if (!ck.empty())
        bad(named(out) + " lies among the files of the checkpoint " + ck + " (a checkpoint directory's `latest`, " +
            "its step_* folders and everything in them are meshtrain's, and no flag lets another output replace " +
            "them): choose a path outside it for " + out.flag);
    }
    if (out.role == Role::output_file && !overwrite_) {
      const bool ours = written_by_meshtrain(out.path, out.kind);
      std::error_code ec;
      const bool present = fs::exists(out.path, ec) && fs::file_size(out.path, ec) > 0;
      if (present && (!ours || !out.replace_own))
        bad(named(out) + " already exists and " +
            (ours ? std::string("would be replaced") : "was not written by meshtrain (it is not " + kind_name(out.kind) + ")") +
            "; choose another path, or add --overwrite to replace it");
    }
  }
}

}  // namespace meshtrain::train
