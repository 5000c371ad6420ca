// NumPy files: the .npy header, the zip directory of an .npz, mapping and inflating members (the
// writer is npy_write.cpp). The formats and the guarantees are in npy.h; this file only
// implements them.
#include "meshtrain/io/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <set>
#include <string_view>


namespace meshtrain::io {

static_assert(std::endian::native == std::endian::little,
              "NumPy files are read in place as little-endian; a big-endian host needs byte swapping here");

namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 62;
constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr char kNpyMagic[] = "\x93NUMPY";  // 6 bytes and a terminating zero

struct TypeInfo {
  NpyType type;
  const char* name;
  const char* descr;
  int64_t size;
};
constexpr TypeInfo kTypes[] = {
    {NpyType::u8, "uint8", "|u1", 1},    {NpyType::i8, "int8", "|i1", 1},
    {NpyType::u16, "uint16", "<u2", 2},  {NpyType::i16, "int16", "<i2", 2},
    {NpyType::u32, "uint32", "<u4", 4},  {NpyType::i32, "int32", "<i4", 4},
    {NpyType::u64, "uint64", "<u8", 8},  {NpyType::i64, "int64", "<i8", 8},
    {NpyType::f32, "float32", "<f4", 4}, {NpyType::f64, "float64", "<f8", 8},
    {NpyType::b8, "bool", "|b1", 1},
};

const TypeInfo& info(NpyType t) {
  for (const TypeInfo& i : kTypes)
    if (i.type == t) return i;
  throw std::invalid_argument("unknown NpyType");
}

uint16_t le16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t le32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t le64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// ---- the .npy header: a Python dict literal ----

struct Header {
  NpyType type = NpyType::u8;
  std::vector<int64_t> shape;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  Header parse() {
    Header h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip();
      if (peek() == '}') break;
      const std::string key = string_literal("a key");
      expect(':');
      skip();
      if (key == "descr") {
        if (peek() == '[')
          fail("has a structured dtype (a list of fields); save a plain array of one dtype (e.g. "
               "numpy.ascontiguousarray(a, dtype=numpy.float32))");
        h.type = descr(string_literal("the descr"));
        have_descr = true;
      } else if (key == "fortran_order") {
        const std::string word = identifier();
        if (word == "True")
          fail("is stored in Fortran (column-major) order; save it in C order "
               "(numpy.ascontiguousarray(a)) and write the file again");
        if (word != "False") fail("has fortran_order " + word + ", not True or False: the header is malformed");
        have_order = true;
      } else if (key == "shape") {
        h.shape = shape();
        have_shape = true;
      } else {
        fail("has a header key '" + key + "' besides descr, fortran_order and shape: not a .npy header numpy writes");
      }
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail("has a malformed header: expected ',' or '}' at byte " + std::to_string(i_));
    }
    if (!have_descr || !have_order || !have_shape)
      fail("has a header without descr, fortran_order and shape: not a .npy header numpy writes");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw NpyError(where_ + " " + what); }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    skip();
    if (peek() != c)
      fail(std::string("has a malformed header: expected '") + c + "' at byte " + std::to_string(i_) +
           " of the header dict; the file is corrupt or not a .npy file numpy wrote");
    ++i_;
  }
  std::string string_literal(const char* what) {
    skip();
    const char q = peek();
    if (q != '\'' && q != '"') fail(std::string("has a malformed header: expected ") + what + " (a string)");
    const size_t end = s_.find(q, i_ + 1);
    if (end == std::string_view::npos) fail("has a malformed header: a string is not closed");
    std::string out(s_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return out;
  }
  std::string identifier() {
    const size_t start = i_;
    while (i_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[i_]))) ++i_;
    return std::string(s_.substr(start, i_ - start));
  }
  std::vector<int64_t> shape() {
    expect('(');
    std::vector<int64_t> dims;
    while (true) {
      skip();
      if (peek() == ')') break;
      const size_t start = i_;
      int64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        if (v > (kMaxBytes - 9) / 10) fail("has a dimension beyond 2^62 in its shape");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (i_ == start) fail("has a malformed shape: expected a non-negative integer at byte " + std::to_string(i_));
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2's long literal
      dims.push_back(v);
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != ')') fail("has a malformed shape: expected ',' or ')' at byte " + std::to_string(i_));
    }
    ++i_;
    return dims;
  }
  NpyType descr(const std::string& d) {
    if (d.size() >= 2) {
      const char order = d[0];
      const std::string kind = d.substr(1);
      for (const TypeInfo& t : kTypes) {
        if (kind != std::string(t.descr + 1)) continue;
        if (t.size == 1 && (order == '|' || order == '<' || order == '>' || order == '=')) return t.type;
        if (order == '<') return t.type;
        if (order == '>')
          fail("has the big-endian dtype '" + d + "'; meshtrain reads little-endian arrays: save it as a.astype('" +
               std::string(t.descr) + "')");
      }
      if (kind[0] == 'O')
        fail("holds Python objects (dtype '" + d + "'); save a numeric array (e.g. a.astype(numpy.float32))");
    }
    fail("has the dtype '" + d +
         "', which meshtrain does not read; save it as one of uint8, int8, uint16, int16, uint32, int32, uint64, "
         "int64, float32, float64 or bool (little-endian)");
  }

  std::string_view s_;
  const std::string& where_;
  size_t i_ = 0;
};

int64_t checked_numel(const std::vector<int64_t>& shape, int64_t itemsize, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > kMaxBytes / itemsize / d)
      throw NpyError(where + " has a shape whose size is beyond 2^62 bytes: the header is corrupt");
    n *= d;
  }
  return n;
}

// Parses the .npy bytes [p, p + size) as the array `name`: its header, and that the bytes hold
// its elements. `where` starts every message.
NpyArray parse_npy(const std::byte* p, int64_t size, const std::string& name, const std::string& where) {
  if (size < 10 || std::memcmp(p, kNpyMagic, 6) != 0)
    throw NpyError(where + " is not a .npy array (it does not start with the magic \\x93NUMPY); save it with "
                           "numpy.save or numpy.savez");
  const int major = static_cast<int>(p[6]), minor = static_cast<int>(p[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw NpyError(where + " is in .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   "; meshtrain reads versions 1.0, 2.0 and 3.0 (those numpy writes)");
  const int64_t prefix = major == 1 ? 10 : 12;
  if (size < prefix)
    throw NpyError(where + " ends inside its header: the file is truncated; write it again");
  const int64_t header_len = major == 1 ? le16(p + 8) : le32(p + 8);
  if (prefix + header_len > size)
    throw NpyError(where + " ends inside its header (" + std::to_string(header_len) + " bytes announced, " +
                   std::to_string(size - prefix) + " present): the file is truncated; write it again");
  const std::string_view text(reinterpret_cast<const char*>(p + prefix), static_cast<size_t>(header_len));
  Header h = HeaderParser(text, where).parse();
  NpyArray a;
  a.name = name;
  a.type = h.type;
  a.shape = std::move(h.shape);
  a.data = p + prefix + header_len;
  const int64_t need = checked_numel(a.shape, npy_itemsize(a.type), where) * npy_itemsize(a.type);
  const int64_t have = size - prefix - header_len;
  if (have < need)
    throw NpyError(where + " is " + std::string(to_string(a.type)) + " " + a.shape_str() + ", " + std::to_string(need) +
                   " bytes, but only " + std::to_string(have) +
                   " follow its header: the file is truncated; write it again");
  return a;
}

// ---- the zip directory ----

// The member's key: its name less ".npy" (numpy.load's key).
std::string key_of(const std::string& member) {
  return member.ends_with(".npy") ? member.substr(0, member.size() - 4) : member;
}


struct Member {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t csize = 0, usize = 0, local = 0;
};

class ZipReader {
 public:
  ZipReader(const std::byte* p, uint64_t size, const std::string& path) : p_(p), size_(size), path_(path) {}

  std::vector<Member> members() {
    const uint64_t end = find_end();
    uint64_t entries = le16(p_ + end + 10), cd_size = le32(p_ + end + 12), cd_offset = le32(p_ + end + 16);
    if (entries == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {
      if (end < 20 || le32(p_ + end - 20) != kZip64LocatorSig)
        fail("has a zip end record that points to zip64 records which are missing: the archive is corrupt");
      const uint64_t z = le64(p_ + end - 20 + 8);
      need(z, 56, "its zip64 end record");
      if (le32(p_ + z) != kZip64EndSig) fail("has no zip64 end record where its locator points: the archive is corrupt");
      entries = le64(p_ + z + 32), cd_size = le64(p_ + z + 40), cd_offset = le64(p_ + z + 48);
    }
    need(cd_offset, cd_size, "its central directory");
    std::vector<Member> out;
    uint64_t at = cd_offset;
    for (uint64_t i = 0; i < entries; ++i) {
      need(at, 46, "its central directory");
      if (le32(p_ + at) != kCentralSig) fail("has a corrupt central directory (entry " + std::to_string(i) + ")");
      Member m;
      m.flags = le16(p_ + at + 8), m.method = le16(p_ + at + 10), m.crc = le32(p_ + at + 16);
      m.csize = le32(p_ + at + 20), m.usize = le32(p_ + at + 24);
      const uint64_t n = le16(p_ + at + 28), e = le16(p_ + at + 30), c = le16(p_ + at + 32);
      m.local = le32(p_ + at + 42);
      need(at + 46, n + e + c, "its central directory");
      m.name.assign(reinterpret_cast<const char*>(p_ + at + 46), n);
      zip64_extra(p_ + at + 46 + n, e, m);
      out.push_back(std::move(m));
      at += 46 + n + e + c;
    }
    return out;
  }

  // Offset of the member's data, after its local header.
  uint64_t data_offset(const Member& m, const std::string& where) {
    if (m.local > size_ || size_ - m.local < 30 || le32(p_ + m.local) != kLocalSig)
      throw NpyError(where + " has no local zip header where the directory points: the archive is truncated or corrupt");
    const uint64_t data = m.local + 30 + le16(p_ + m.local + 26) + le16(p_ + m.local + 28);
    if (data > size_ || size_ - data < m.csize)
      throw NpyError(where + " is cut short: the archive ends inside its " + std::to_string(m.csize) +
                     " bytes (the file is truncated; write it again)");
    return data;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw NpyError("NumPy file " + path_ + " " + what); }
  void need(uint64_t at, uint64_t n, const char* what) const {
    if (at > size_ || size_ - at < n) fail(std::string("ends inside ") + what + ": the archive is truncated or corrupt");
  }
  // The end-of-central-directory record: the last signature within the 64 KiB comment reach.
  uint64_t find_end() const {
    if (size_ >= 22) {
      const uint64_t lowest = size_ > 22 + 0xffff ? size_ - 22 - 0xffff : 0;
      for (uint64_t at = size_ - 22 + 1; at-- > lowest;)
        if (le32(p_ + at) == kEndSig) return at;
    }
    truncated_member();
    fail("has no zip end record: it is a truncated .npz (write it again) or not a zip archive at all");
  }
  // Without a directory, the members' local headers in order name the one the file ends inside.
  void truncated_member() const {
    std::string last;
    for (uint64_t at = 0; at <= size_ && size_ - at >= 30 && le32(p_ + at) == kLocalSig;) {
      Member m;
      m.flags = le16(p_ + at + 6), m.csize = le32(p_ + at + 18), m.usize = le32(p_ + at + 22);
      const uint64_t n = le16(p_ + at + 26), e = le16(p_ + at + 28);
      if (size_ - at - 30 < n + e) return;
      m.name.assign(reinterpret_cast<const char*>(p_ + at + 30), n);
      zip64_extra(p_ + at + 30 + n, e, m);
      if ((m.flags & 8) != 0) return;  // sizes in a data descriptor after the data: cannot walk on
      if (size_ - at - 30 - n - e < m.csize)
        throw NpyError("NumPy file " + path_ + ", array " + key_of(m.name) + " is cut short: the archive ends inside its " + std::to_string(m.csize) +
             " bytes (the file is truncated; write it again)");
      last = m.name;
      at += 30 + n + e + m.csize;
    }
    if (!last.empty())
      fail("ends after the array " + key_of(last) +
           " without its zip directory: the file is truncated; write it again");
  }
  void zip64_extra(const std::byte* x, uint64_t len, Member& m) const {
    for (uint64_t at = 0; at + 4 <= len;) {
      const uint16_t id = le16(x + at), size = le16(x + at + 2);
      if (at + 4 + size > len) break;
      if (id == 0x0001) {
        uint64_t k = at + 4;
        auto take = [&](uint64_t& field) {
          if (k + 8 > at + 4 + size) fail("has a malformed zip64 field for the member " + m.name);
          field = le64(x + k);
          k += 8;
        };
        if (m.usize == 0xffffffff) take(m.usize);
        if (m.csize == 0xffffffff) take(m.csize);
        if (m.local == 0xffffffff) take(m.local);
      }
      at += 4 + size;
    }
  }

  const std::byte* p_;
  uint64_t size_;
  const std::string& path_;
};

uint32_t crc32_of(const std::byte* p, uint64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt k = static_cast<uInt>(std::min<uint64_t>(n, uint64_t{1} << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p), k);
    p += k;
    n -= k;
  }
  return static_cast<uint32_t>(crc);
}

// Inflates a raw deflate stream of exactly `out_size` bytes into a new buffer.
std::unique_ptr<std::byte[]> inflate_member(const std::byte* in, uint64_t in_size, uint64_t out_size,
                                            const std::string& where) {
  if (out_size > in_size * 1040 + 1024)  // deflate never compresses more than about 1032:1
    throw NpyError(where + " claims " + std::to_string(out_size) + " bytes from " + std::to_string(in_size) +
                   " compressed ones, beyond what deflate can do: the archive is corrupt");
  auto out = std::make_unique<std::byte[]>(std::max<uint64_t>(out_size, 1));
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw NpyError(where + " cannot be inflated: zlib failed to start");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in));
  z.next_out = reinterpret_cast<Bytef*>(out.get());
  uint64_t in_left = in_size, out_left = out_size;
  int rc = Z_OK;
  do {  // Z_OK always means progress; no progress (out of input or of room) gives Z_BUF_ERROR
    const uInt ai = static_cast<uInt>(std::min<uint64_t>(in_left, uint64_t{1} << 30));
    const uInt ao = static_cast<uInt>(std::min<uint64_t>(out_left, uint64_t{1} << 30));
    z.avail_in = ai, z.avail_out = ao;
    rc = inflate(&z, Z_NO_FLUSH);
    in_left -= ai - z.avail_in, out_left -= ao - z.avail_out;
  } while (rc == Z_OK);
  inflateEnd(&z);
  if (rc != Z_STREAM_END || out_left != 0)
    throw NpyError(where + (rc == Z_DATA_ERROR ? " has a corrupt deflate stream"
                                               : " does not inflate to the " + std::to_string(out_size) +
                                                     " bytes its zip entry records") +
                   ": the archive is truncated or corrupt; write it again");
  return out;
}

}  // namespace

// ---- types and views ----

const char* to_string(NpyType t) { return info(t).name; }
int64_t npy_itemsize(NpyType t) { return info(t).size; }
const char* npy_descr(NpyType t) { return info(t).descr; }
bool npy_is_integer(NpyType t) { return t != NpyType::f32 && t != NpyType::f64 && t != NpyType::b8; }

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NpyArray::shape_str() const {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  s += ")";
  return s;
}

int64_t NpyArray::integer_at(int64_t i, const std::string& path) const {
  switch (type) {
    case NpyType::u8: return at<uint8_t>(i);
    case NpyType::b8: return at<uint8_t>(i) != 0;
    case NpyType::i8: return at<int8_t>(i);
    case NpyType::u16: return at<uint16_t>(i);
    case NpyType::i16: return at<int16_t>(i);
    case NpyType::u32: return at<uint32_t>(i);
    case NpyType::i32: return at<int32_t>(i);
    case NpyType::i64: return at<int64_t>(i);
    case NpyType::u64: {
      const uint64_t v = at<uint64_t>(i);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw NpyError("NumPy file " + path + ", array " + name + " holds " + std::to_string(v) + " at index " +
                       std::to_string(i) + ", beyond any label or token meshtrain reads");
      return static_cast<int64_t>(v);
    }
    case NpyType::f32:
    case NpyType::f64: break;
  }
  throw NpyError("NumPy file " + path + ", array " + name + " is " + to_string(type) + ", not an integer array");
}

// ---- opening ----

struct NpyFileBuilder {
  static std::shared_ptr<NpyFile> make() { return std::shared_ptr<NpyFile>(new NpyFile()); }

  static void map(NpyFile& f) {
    const std::string& path = f.path_;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      throw NpyError("NumPy file " + path + " does not exist; check the path");
    if (std::filesystem::is_directory(path, ec))
      throw NpyError("NumPy file " + path + " is a directory; give a .npz or .npy file");
    if (!std::filesystem::is_regular_file(path, ec))  // a FIFO would block, a device never ends
      throw NpyError("NumPy file " + path + " is not a regular file (a pipe, socket or device); save it to a file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw NpyError("NumPy file " + path + " cannot be opened (" + std::strerror(errno) + "); check its permissions");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size == 0) {
      ::close(fd);
      throw NpyError("NumPy file " + path + " is empty; write it with numpy.savez or numpy.save");
    }
    void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (m == MAP_FAILED)
      throw NpyError("NumPy file " + path + " cannot be mapped into memory (" + std::strerror(err) + ")");
    f.map_ = m;
    f.map_size_ = static_cast<size_t>(st.st_size);
  }

  static void read_npz(NpyFile& f) {
    const auto* p = static_cast<const std::byte*>(f.map_);
    ZipReader zip(p, f.map_size_, f.path_);
    std::set<std::string> seen;
    for (const Member& m : zip.members()) {
      const std::string name = key_of(m.name);
      const std::string where = "NumPy file " + f.path_ + ", array " + name;
      if (!m.name.ends_with(".npy"))
        throw NpyError("NumPy file " + f.path_ + " holds the member '" + m.name +
                       "', which is not a .npy array; an .npz holds only NAME.npy members (numpy.savez writes them)");
      if (!seen.insert(name).second)
        throw NpyError(where + " is in the archive twice; write it once (numpy.savez does)");
      if (m.flags & 1) throw NpyError(where + " is encrypted; save the arrays with numpy.savez");
      const uint64_t at = zip.data_offset(m, where);
      NpyArray a;
      if (m.method == 0) {
        if (m.usize != m.csize)
          throw NpyError(where + " is stored with two different sizes in the zip directory: the archive is corrupt");
        a = parse_npy(p + at, static_cast<int64_t>(m.csize), name, where);
        a.mapped = true;
      } else if (m.method == 8) {
        auto buf = inflate_member(p + at, m.csize, m.usize, where);
        if (crc32_of(buf.get(), m.usize) != m.crc)
          throw NpyError(where + " fails its CRC-32 check: the archive is corrupt; write it again");
        a = parse_npy(buf.get(), static_cast<int64_t>(m.usize), name, where);
        f.inflated_.push_back(std::move(buf));
      } else {
        throw NpyError(where + " is compressed with zip method " + std::to_string(m.method) +
                       "; meshtrain reads stored and deflated members (numpy.savez and numpy.savez_compressed)");
      }
      f.arrays_.push_back(std::move(a));
    }
  }
};

std::shared_ptr<const NpyFile> NpyFile::open(const std::string& path) {
  std::shared_ptr<NpyFile> f = NpyFileBuilder::make();
  f->path_ = path;
  NpyFileBuilder::map(*f);
  const auto* p = static_cast<const std::byte*>(f->map_);
  if (f->map_size_ >= 4 && le32(p) == kLocalSig) {
    f->npz_ = true;
    NpyFileBuilder::read_npz(*f);
  } else if (f->map_size_ >= 6 && std::memcmp(p, kNpyMagic, 6) == 0) {
    const std::string name = key_of(std::filesystem::path(path).filename().string());
    NpyArray a = parse_npy(p, static_cast<int64_t>(f->map_size_), name, "NumPy file " + path + ", array " + name);
    a.mapped = true;
    f->arrays_.push_back(std::move(a));
  } else {
    throw NpyError("NumPy file " + path +
                   " is neither an .npz (a zip archive) nor a .npy array: it starts with neither \"PK\\3\\4\" "
                   "nor \"\\x93NUMPY\"; write it with numpy.savez or numpy.save");
  }
  return f;
}

namespace {
std::string first_bytes(const std::string& path, size_t n) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string s(n, '\0');
  const ssize_t k = ::read(fd, s.data(), n);
  ::close(fd);
  s.resize(k > 0 ? static_cast<size_t>(k) : 0);
  return s;
}
}  // namespace

bool looks_like_numpy(const std::string& path) {
  const std::string s = first_bytes(path, 6);
  return s.starts_with(std::string_view("PK\3\4", 4)) || s == std::string_view(kNpyMagic, 6);
}

bool looks_like_npy(const std::string& path) { return first_bytes(path, 6) == std::string_view(kNpyMagic, 6); }

NpyFile::~NpyFile() {
  if (map_) ::munmap(map_, map_size_);
}

const NpyArray* NpyFile::find(const std::string& name) const {
  for (const NpyArray& a : arrays_)
    if (a.name == name) return &a;
  return nullptr;
}

std::string NpyFile::names() const {
  std::string s;
  for (const NpyArray& a : arrays_) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s.empty() ? "no arrays" : s;
}

}  // namespace meshtrain::io
