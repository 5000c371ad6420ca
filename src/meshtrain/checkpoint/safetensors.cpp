// Safetensors reading and writing, plus the durable-file helpers (atomic write, fsync, CRC32).
// Format and guarantees are in safetensors.h.
#include "meshtrain/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/io/json.h"

namespace meshtrain::train {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping here");

namespace {

constexpr int64_t kMaxHeaderBytes = 100 << 20;  // the reference implementation's limit
constexpr size_t kChunk = size_t{1} << 22;       // 4 MiB per read/write/CRC call

std::string errno_text() { return std::strerror(errno); }

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw CheckpointError("safetensors file " + path + " is invalid: " + what +
                        "; re-export or re-download it");
}

uint32_t crc_update(uint32_t crc, const void* p, size_t n) {
  const auto* bytes = static_cast<const Bytef*>(p);
  while (n > 0) {
    const size_t k = std::min(n, kChunk);
    crc = static_cast<uint32_t>(::crc32(crc, bytes, static_cast<uInt>(k)));
    bytes += k;
    n -= k;
  }
  return crc;
}

// ---- a file being written: write-all, CRC as we go, fsync, atomic rename ----

class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw CheckpointError("cannot create " + tmp_ + ": " + errno_text() +
                            "; check that the directory exists and is writable");
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  ~AtomicWriter() {
    if (fd_ >= 0) {  // not committed: an exception is unwinding
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }

  void write(const void* p, size_t n) {
    digest_.crc32 = crc_update(digest_.crc32, p, n);
    digest_.size += static_cast<int64_t>(n);
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t k = ::write(fd_, c, std::min(n, kChunk));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)  // 0: no error set (a regular file never writes nothing otherwise); report EIO
        throw CheckpointError("cannot write " + tmp_ + ": " + (k < 0 ? errno_text() : std::strerror(EIO)) +
                              "; check free disk space");
      c += k;
      n -= static_cast<size_t>(k);
    }
  }

  FileDigest commit() {
    if (::fsync(fd_) != 0) throw CheckpointError("cannot fsync " + tmp_ + ": " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      ::unlink(tmp_.c_str());
      throw CheckpointError("cannot close " + tmp_ + ": " + errno_text());
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string why = errno_text();
      ::unlink(tmp_.c_str());
      throw CheckpointError("cannot rename " + tmp_ + " to " + path_ + ": " + why);
    }
    const auto parent = std::filesystem::path(path_).parent_path();
    fsync_directory(parent.empty() ? "." : parent.string());
    return digest_;
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  FileDigest digest_{0, static_cast<uint32_t>(::crc32(0, nullptr, 0))};
};

// ---- a read-only mapping of a whole file ----

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw CheckpointError("cannot open safetensors file " + path + ": " + errno_text() +
                            "; check the path");
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw CheckpointError("safetensors path " + path + " is not a regular file");
    }
    size_ = static_cast<int64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        ::close(fd_);
        throw CheckpointError("cannot map safetensors file " + path + ": " + errno_text());
      }
      data_ = static_cast<const char*>(p);
    }
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
    ::close(fd_);
  }
  const char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  int fd_ = -1;
  const char* data_ = nullptr;
  int64_t size_ = 0;
};

// ---- header parsing and validation ----

int64_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "F64") return 8;
  return 0;
}

struct Header {
  std::vector<SafetensorsEntry> entries;  // sorted by name
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // file offset of the data buffer
};

SafetensorsEntry parse_entry(const std::string& path, const std::string& name,
                             const nlohmann::json& j, int64_t buffer_bytes) {
  const std::string where = "tensor '" + name + "'";
  if (!j.is_object()) bad_file(path, where + " is not a JSON object");
  SafetensorsEntry e;
  e.name = name;
  if (!j.contains("dtype") || !j["dtype"].is_string()) bad_file(path, where + " has no dtype");
  e.dtype = j["dtype"].get<std::string>();
  const int64_t elem = dtype_bytes(e.dtype);
  if (elem == 0)
    bad_file(path, where + " has dtype " + e.dtype + "; only F32, F16, BF16 and F64 are read");
  if (!j.contains("shape") || !j["shape"].is_array()) bad_file(path, where + " has no shape");
  int64_t numel = 1;
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 48))
      bad_file(path, where + " has a shape entry that is not a size: " + d.dump());
    const auto v = d.get<int64_t>();
    if (__builtin_mul_overflow(numel, v, &numel) || numel > (int64_t{1} << 48))
      bad_file(path, where + " has a shape too large to hold");
    e.shape.push_back(v);
  }
  const auto& off = j.contains("data_offsets") ? j["data_offsets"] : nlohmann::json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    bad_file(path, where + " needs data_offsets [begin, end] of two non-negative integers");
  const auto begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end || end > static_cast<uint64_t>(buffer_bytes))
    bad_file(path, where + " has data_offsets [" + std::to_string(begin) + ", " +
                       std::to_string(end) + "] outside the data buffer of " +
                       std::to_string(buffer_bytes) + " bytes (truncated file?)");
  e.begin = static_cast<int64_t>(begin);
  e.end = static_cast<int64_t>(end);
  if (e.end - e.begin != numel * elem)
    bad_file(path, where + " holds " + std::to_string(e.end - e.begin) + " bytes but shape " +
                       shape_str(e.shape) + " of " + e.dtype + " needs " +
                       std::to_string(numel * elem));
  return e;
}

Header parse_header(const std::string& path, const char* data, int64_t size) {
  if (size < 8)
    bad_file(path, "it is " + std::to_string(size) + " bytes, too short for the header length");
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > static_cast<uint64_t>(size - 8) || n > static_cast<uint64_t>(kMaxHeaderBytes))
    bad_file(path, "the header length " + std::to_string(n) + " runs past the end of the " +
                       std::to_string(size) + "-byte file (truncated file?)");
  Header h;
  h.data_start = 8 + static_cast<int64_t>(n);
  const int64_t buffer_bytes = size - h.data_start;
  nlohmann::json j;
  try {
    j = io::parse_json_strict(std::string_view(data + 8, static_cast<std::size_t>(n)), path, "");
  } catch (const io::JsonError& e) {
    bad_file(path, "the header " + e.problem());
  }
  if (!j.is_object()) bad_file(path, "the header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) bad_file(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) bad_file(path, "__metadata__ value of '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(path, it.key(), *it, buffer_bytes));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : h.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      bad_file(path, "tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                         "' overlap in the data buffer");
  return h;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {        // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// n elements of dtype from src (the first element to convert) as float32 into dst.
void convert(const std::string& dtype, const char* src, int64_t n, float* dst) {
  if (dtype == "F32") {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (dtype == "F16" || dtype == "BF16") {
    const bool bf = dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      dst[i] = bf ? std::bit_cast<float>(static_cast<uint32_t>(v) << 16) : half_to_float(v);
    }
  } else {  // F64
    for (int64_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, src + 8 * i, 8);
      dst[i] = static_cast<float>(v);
    }
  }
}

}  // namespace

// ---- durable files ----

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError("cannot open directory " + dir + ": " + errno_text());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) throw CheckpointError("cannot fsync directory " + dir + ": " + why);
}

FileDigest write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicWriter w(path);
  w.write(bytes.data(), bytes.size());
  return w.commit();
}

FileDigest file_digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError("cannot open " + path + ": " + errno_text());
  FileDigest d{0, static_cast<uint32_t>(::crc32(0, nullptr, 0))};
  std::vector<char> buf(kChunk);
  for (;;) {
    const ssize_t k = ::read(fd, buf.data(), buf.size());
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      const std::string why = errno_text();
      ::close(fd);
      throw CheckpointError("cannot read " + path + ": " + why);
    }
    if (k == 0) break;
    d.crc32 = crc_update(d.crc32, buf.data(), static_cast<size_t>(k));
    d.size += k;
  }
  ::close(fd);
  return d;
}

// ---- writing ----

FileDigest write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Shape>>& entries,
                             const std::function<Tensor(const std::string& name)>& produce,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Shape>> sorted = entries;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::json header = nlohmann::json::object();
  int64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto& [name, shape] = sorted[i];
    if (name == "__metadata__" || name.empty())
      throw std::invalid_argument("'" + name + "' cannot name a tensor in a safetensors file");
    if (i > 0 && sorted[i - 1].first == name)
      throw std::invalid_argument("tensor name '" + name + "' appears twice");
    const int64_t bytes = shape_numel(shape) * static_cast<int64_t>(sizeof(float));
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  AtomicWriter w(path);
  w.write(&n, 8);
  w.write(text.data(), text.size());
  for (const auto& [name, shape] : sorted) {
    const Tensor t = produce(name);
    if (t.numel() != shape_numel(shape))
      throw std::invalid_argument("tensor '" + name + "' has " + std::to_string(t.numel()) + " elements, its entry " +
                                  shape_str(shape) + " needs " + std::to_string(shape_numel(shape)));
    w.write(t.data(), static_cast<size_t>(t.bytes()));
  }
  return w.commit();
}

FileDigest write_safetensors(const std::string& path,
                             const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Shape>> entries;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    if (t == nullptr) throw std::invalid_argument("tensor '" + name + "' is null");
    Shape shape = t->shape();
    if (shape.empty() && t->numel() == 0) shape = {0};  // a default-constructed Tensor
    entries.emplace_back(name, shape);
    by_name[name] = t;
  }
  return write_safetensors(path, entries, [&](const std::string& name) { return *by_name.at(name); }, metadata);
}

FileDigest write_safetensors(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, const Tensor*>> refs;
  refs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) refs.emplace_back(name, &t);
  return write_safetensors(path, refs, metadata);
}

// ---- reading ----

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path) {
  MappedFile f(path);
  return parse_header(path, f.data(), f.size()).entries;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  MappedFile f(path);
  return parse_header(path, f.data(), f.size()).metadata;
}

NamedTensors read_safetensors(const std::string& path) {
  MappedFile f(path);
  const Header h = parse_header(path, f.data(), f.size());
  NamedTensors out;
  out.reserve(h.entries.size());
  for (const auto& e : h.entries) {
    Tensor t = Tensor::empty(e.shape);
    convert(e.dtype, f.data() + h.data_start + e.begin, shape_numel(e.shape), t.data());
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace meshtrain::train

namespace meshtrain::train {

// ---- reading parts ----

struct SafetensorsFile::Impl {
  std::string path;
  MappedFile file;
  Header header;
  std::map<std::string, size_t> index;
  explicit Impl(const std::string& p) : path(p), file(p), header(parse_header(p, file.data(), file.size())) {
    for (size_t i = 0; i < header.entries.size(); ++i) index[header.entries[i].name] = i;
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
SafetensorsFile::~SafetensorsFile() = default;
const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::vector<SafetensorsEntry>& SafetensorsFile::entries() const { return impl_->header.entries; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->header.metadata; }

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->header.entries[it->second];
}

void SafetensorsFile::copy(const SafetensorsEntry& e, int64_t first, int64_t n, float* dst) const {
  const int64_t elem = dtype_bytes(e.dtype);
  if (first < 0 || n < 0 || (first + n) * elem > e.end - e.begin)
    throw std::out_of_range("safetensors " + impl_->path + ": elements [" + std::to_string(first) + ", " +
                            std::to_string(first + n) + ") outside tensor '" + e.name + "'");
  convert(e.dtype, impl_->file.data() + impl_->header.data_start + e.begin + first * elem, n, dst);
}

}  // namespace meshtrain::train
