// Output files whose failures are never silent and never destroy what was there before.
//
// write_file_atomic replaces a file as a whole: the bytes go to a new temporary file beside it
// (a name no other file has: created with O_EXCL), every write is checked, the file is fsynced
// and closed (both checked), then renamed over the target. On any failure the temporary file
// is removed and the target is left as it was (the previous trace or swimlane survives a full
// disk). A target that is a symbolic link is resolved, so the file it points at is replaced,
// as writing through the link did; an existing target keeps its permission bits.
//
// AppendFile grows a file line by line (metrics): each append is written at once (no user-space
// buffer, so a kill loses nothing appended) and checked; a failed append (a full disk) cuts the
// file back to its size before it, so the file only ever holds whole appends. close() fsyncs
// and closes, and reports an error either one returns.
//
// Every failure throws WriteError: "cannot write <what> <path>: <strerror>".
// Limits: the directory fsync after a rename is skipped where the file system does not
// support it (EINVAL); appends are not fsynced one by one (a kill keeps them, a power loss may
// not); a kill between creating the temporary and renaming it leaves it behind, as a hidden
// .NAME.PID.N.tmp beside the target (never taken for the target, never over another file).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace meshtrain::io {

class WriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `what` describes the file in messages ("trace", "swimlane file", "metrics file").
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& what);

// Sets the modification time of an existing file to now (a heartbeat another process watches);
// false when it cannot (no such file, no permission). Never creates the file.
bool touch(const std::string& path);

class AppendFile {
 public:
  // Opens (creating it when absent) `path`; truncate: empty it first. Throws WriteError.
  AppendFile(const std::string& path, bool truncate, std::string what);
  ~AppendFile();  // closes without reporting (call close() to learn of errors)
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  // Writes all of `bytes` at the end, or throws WriteError leaving the file as it was.
  void append(std::string_view bytes);
  // fsync and close; throws WriteError. Idempotent.
  void close();
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(int err) const;
  std::string path_, what_;
  int fd_ = -1;
  int64_t size_ = 0;  // bytes of whole appends
};

}  // namespace meshtrain::io
