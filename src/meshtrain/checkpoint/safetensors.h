// Safetensors files (the Hugging Face format) and the durable-file helpers checkpoints use.
//
// Layout: 8-byte little-endian header length N, then N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}            (metadata values are strings)
// then the data buffer; offsets are relative to its start. We write F32 only, tensors in name
// order packed back to back, the header padded with spaces to a multiple of 8 (as the reference
// implementation does). We read F32, F16, BF16 and F64 and return float32 tensors.
//
// Reading validates everything and throws CheckpointError (file name plus what is wrong) for:
// a header length past the end of the file, JSON that does not parse or has the wrong types,
// an unknown dtype, offsets outside the buffer or not matching shape x dtype size, overlapping
// tensors, duplicate names, non-string metadata. The file is mapped (mmap) and each tensor is
// copied or converted once, so a 500 MB file costs one pass.
//
// Writing is atomic: to `path + ".tmp"`, fsync, rename over `path`, fsync the directory.
// Limits: little-endian hosts only; integer and bool dtypes are refused (not float data).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::train {

// A checkpoint or safetensors file that cannot be used; the message names the file, says what
// is wrong and what to do.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- durable files ----

// Size and CRC32 (zlib) of a file's bytes.
struct FileDigest {
  int64_t size = 0;
  uint32_t crc32 = 0;
};

// Writes `bytes` to path + ".tmp", fsyncs, renames over `path`, fsyncs the directory.
FileDigest write_file_atomic(const std::string& path, const std::string& bytes);
// fsync on a directory, so renames inside it survive a crash.
void fsync_directory(const std::string& dir);
// Reads the file in chunks and returns its size and CRC32. Throws CheckpointError if unreadable.
FileDigest file_digest(const std::string& path);

// ---- safetensors ----

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes the tensors (as F32) and string metadata atomically; returns the file's digest.
// Throws std::invalid_argument for duplicate names, a null tensor or the reserved name
// "__metadata__", CheckpointError for I/O failures.
FileDigest write_safetensors(const std::string& path,
                             const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                             const std::map<std::string, std::string>& metadata = {});
// Same, for tensors held by value.
FileDigest write_safetensors(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata = {});
// Same, for tensors made one at a time: the header comes from `entries` (name, shape), then
// produce(name) is called for each in name order and its result (of that shape) written and
// dropped, so only one tensor is held at a time (a checkpoint's model as one file).
FileDigest write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Shape>>& entries,
                             const std::function<Tensor(const std::string& name)>& produce,
                             const std::map<std::string, std::string>& metadata = {});

// All tensors of the file as float32, sorted by name.
NamedTensors read_safetensors(const std::string& path);
// The "__metadata__" object (empty when absent).
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

// One tensor as the header describes it (no data read).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "F64"
  Shape shape;
  int64_t begin = 0, end = 0;  // byte offsets in the data buffer
};
// The validated header, entries sorted by name.
std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path);

// A file mapped for reading parts of its tensors (checkpoint pieces): the header is validated
// once on opening, copy() converts any range of one tensor's elements to float32; only the
// pages of what is copied are read from disk.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::string& path() const;
  const std::vector<SafetensorsEntry>& entries() const;  // sorted by name
  const std::map<std::string, std::string>& metadata() const;
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
  // Elements [first, first + n) of e (flat, row-major) as float32 into dst.
  void copy(const SafetensorsEntry& e, int64_t first, int64_t n, float* dst) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain::train
