// IDX files, plain or gzip-compressed: the format and the refusals are specified in idx.h;
// this file only implements them.
#include "meshtrain/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "meshtrain/data/data.h"

namespace meshtrain::train {

namespace {

constexpr int64_t kChunk = int64_t{1} << 20;  // bytes per read, and the growth step of a gzip read

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError("data file " + path + ": " + what);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// ---- byte sources: a plain file or a gzip stream ----

// Reads a file front to back; gzip is recognised by its magic bytes, not by the name.
class Source {
 public:
  explicit Source(const std::string& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail(path, "does not exist");
    if (!std::filesystem::is_regular_file(path, ec))
      fail(path, "is not a regular file (a directory, pipe or device); pass an IDX file");
    plain_.open(path, std::ios::binary);
    if (!plain_)
      fail(path, "cannot be opened for reading (" + std::string(std::strerror(errno)) +
                     "); check its permissions");
    plain_.seekg(0, std::ios::end);
    size_ = static_cast<int64_t>(plain_.tellg());
    plain_.seekg(0, std::ios::beg);
    if (size_ == 0) fail(path, "is empty; an IDX file starts with a 4-byte magic and its dimensions");
    unsigned char magic[2] = {0, 0};
    plain_.read(reinterpret_cast<char*>(magic), std::min<int64_t>(size_, 2));
    plain_.seekg(0, std::ios::beg);
    if (size_ >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      plain_.close();
      gz_ = gzopen(path.c_str(), "rb");
      if (gz_ == nullptr) fail(path, "cannot be opened by zlib for decompression");
      gzbuffer(gz_, 1 << 18);
    }
  }
  ~Source() {
    if (gz_ != nullptr) gzclose(gz_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  bool gzip() const { return gz_ != nullptr; }
  // Size of a plain file; -1 for gzip (the decompressed size is known only by reading).
  int64_t plain_size() const { return gzip() ? -1 : size_; }
  const char* kind() const { return gzip() ? "decompressed gzip stream" : "file"; }

  // Reads up to n bytes into dst and returns how many were read: fewer only at the end of the
  // data. A truncated or corrupt gzip stream throws.
  int64_t read(void* dst, int64_t n) {
    auto* out = static_cast<char*>(dst);
    int64_t done = 0;
    while (done < n) {
      const int64_t want = std::min(n - done, kChunk);
      int64_t got = 0;
      if (gzip()) {
        const int r = gzread(gz_, out + done, static_cast<unsigned>(want));
        got = r > 0 ? r : 0;
        if (r < want) check_gzip_end();
      } else {
        plain_.read(out + done, want);
        got = plain_.gcount();
        if (got < want && plain_.bad()) fail(path_, "could not be read completely (an I/O error)");
      }
      done += got;
      if (got < want) break;
    }
    return done;
  }

 private:
  // After a short gzip read: a clean end of stream, or a sentence saying what broke.
  void check_gzip_end() {
    int err = Z_OK;
    const char* msg = gzerror(gz_, &err);
    if (err == Z_OK) return;
    if (err == Z_BUF_ERROR)
      fail(path_, "is a truncated gzip stream (it ends before the compressed data does); "
                  "download or copy the file again");
    std::string why = msg != nullptr ? msg : "unknown error";
    if (why.rfind(path_ + ": ", 0) == 0) why.erase(0, path_.size() + 2);  // zlib adds the path
    fail(path_, "is a corrupt gzip stream (zlib: " + why + "); download or copy the file again");
  }

  std::string path_;
  std::ifstream plain_;
  gzFile gz_ = nullptr;
  int64_t size_ = 0;
};

// ---- the IDX layout ----

uint32_t big_endian_u32(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

const char* describe_magic(uint32_t magic) {
  if (magic == kIdxImagesMagic) return "the magic of an IDX image file";
  if (magic == kIdxLabelsMagic) return "the magic of an IDX label file";
  if ((magic >> 16) == 0) return "an IDX magic of another type or rank";
  return "not an IDX magic at all";
}

// Reads the magic and `ndims` dimensions, checks them, then reads exactly the values they
// promise (their product) and refuses a single byte more or less.
std::vector<uint8_t> read_idx(const std::string& path, uint32_t want_magic, int ndims,
                              const char* what, int64_t* dims) {
  Source src(path);
  const int64_t header_bytes = 4 + 4 * int64_t{ndims};
  unsigned char header[16];
  // The magic first, so a file of the wrong kind is named as such even when it is short.
  int64_t got = src.read(header, 4);
  const uint32_t magic = got == 4 ? big_endian_u32(header) : 0;
  if (got == 4 && magic != want_magic)
    fail(path, "starts with " + hex32(magic) + " (" + describe_magic(magic) + "), not " +
                   hex32(want_magic) + " of " + what + "; check which file is passed");
  if (got == 4) got += src.read(header + 4, header_bytes - 4);
  if (got < header_bytes)
    fail(path, "holds only " + std::to_string(got) + " bytes (as a " + src.kind() +
                   "), fewer than the " + std::to_string(header_bytes) + "-byte IDX header of " +
                   what + "; the file is truncated or not an IDX file");
  int64_t count = 1;
  std::string shape;
  for (int d = 0; d < ndims; ++d) {
    dims[d] = big_endian_u32(header + 4 + 4 * d);
    shape += (d ? " x " : "") + std::to_string(dims[d]);
    // Dimensions are below 2^32 each; stop before the product could leave int64.
    if (dims[d] != 0 && count > (int64_t{1} << 40) / dims[d])
      fail(path, "declares dimensions " + shape + "..., far more values than any data set holds; "
                 "the header is corrupt");
    count *= dims[d];
  }
  const std::string promise = "its header declares " + shape + " = " + std::to_string(count) +
                              " values";
  if (src.plain_size() >= 0 && src.plain_size() - header_bytes != count)
    fail(path, promise + " but " + std::to_string(src.plain_size() - header_bytes) +
                   " bytes follow the header; the file is truncated or corrupt");
  std::vector<uint8_t> values;
  // A gzip stream's size is known only by reading it: grow chunk by chunk so a corrupt header
  // that promises gigabytes fails at the stream's end instead of allocating them.
  while (static_cast<int64_t>(values.size()) < count) {
    const int64_t at = static_cast<int64_t>(values.size());
    const int64_t want = std::min(count - at, src.gzip() ? 64 * kChunk : count);
    values.resize(static_cast<size_t>(at + want));
    const int64_t n = src.read(values.data() + at, want);
    if (n < want)
      fail(path, promise + " but only " + std::to_string(at + n) + " follow the header in the " +
                     src.kind() + "; the file is truncated or its header is wrong");
  }
  unsigned char extra = 0;
  if (src.read(&extra, 1) != 0)
    fail(path, promise + " but more bytes follow them; the file is corrupt or not " + what);
  return values;
}

}  // namespace

// ---- public readers ----

IdxImages read_idx_images(const std::string& path) {
  int64_t dims[3] = {0, 0, 0};
  IdxImages out;
  out.pixels = read_idx(path, kIdxImagesMagic, 3, "uint8 images (N, rows, cols)", dims);
  out.path = path;
  out.count = dims[0];
  out.rows = dims[1];
  out.cols = dims[2];
  return out;
}

IdxLabels read_idx_labels(const std::string& path, int32_t classes) {
  if (classes < 1 || classes > 256)
    throw std::invalid_argument("classes must be in 1..256 for uint8 labels, got " +
                                std::to_string(classes));
  int64_t dims[1] = {0};
  IdxLabels out;
  out.labels = read_idx(path, kIdxLabelsMagic, 1, "uint8 labels (N)", dims);
  out.path = path;
  for (size_t i = 0; i < out.labels.size(); ++i)
    if (out.labels[i] >= classes)
      fail(path, "has label " + std::to_string(out.labels[i]) + " at index " + std::to_string(i) +
                     ", outside the classes 0.." + std::to_string(classes - 1) +
                     "; the file is corrupt or belongs to another data set");
  return out;
}

}  // namespace meshtrain::train
