// NumPy files: encoding a .npy and writing a stored .npz (npy.h states what is written).
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

#include "meshtrain/io/file.h"
#include "meshtrain/io/npy.h"

namespace meshtrain::io {

namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 62;
constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr char kNpyMagic[] = "\x93NUMPY";  // 6 bytes and a terminating zero

void put16(std::string& s, uint32_t v) {
  s += static_cast<char>(v & 0xff);
  s += static_cast<char>((v >> 8) & 0xff);
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xffff);
  put16(s, v >> 16);
}

uint32_t crc32_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  for (size_t n = bytes.size(); n > 0;) {
    const uInt k = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = crc32(crc, p, k);
    p += k;
    n -= k;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

std::string encode_npy(const NpyWrite& a) {
  const int64_t itemsize = npy_itemsize(a.type);
  int64_t n = 1;
  for (int64_t d : a.shape) {
    if (d < 0 || (d != 0 && n > kMaxBytes / itemsize / d))
      throw std::invalid_argument("array " + a.name + " has a negative or too large dimension");
    n *= d;
  }
  if (n > 0 && a.data == nullptr) throw std::invalid_argument("array " + a.name + " has elements but no data");
  std::string dict = "{'descr': '";
  dict += npy_descr(a.type);
  dict += "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < a.shape.size(); ++i) {
    if (i > 0) dict += ", ";
    dict += std::to_string(a.shape[i]);
  }
  if (a.shape.size() == 1) dict += ",";
  dict += "), }";
  // numpy pads the header with spaces and a newline so the data starts at a multiple of 64.
  const bool v2 = dict.size() + 11 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string out(kNpyMagic, 6);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  if (v2)
    put32(out, static_cast<uint32_t>(dict.size()));
  else
    put16(out, static_cast<uint32_t>(dict.size()));
  out += dict;
  out.append(static_cast<const char*>(a.data), static_cast<size_t>(n * itemsize));
  return out;
}

void write_npz(const std::string& path, const std::vector<NpyWrite>& arrays, const std::string& what) {
  constexpr uint32_t kDosDate = (1 << 5) | 1;  // 1980-01-01; time 00:00
  std::set<std::string> names;
  std::string zip, central;
  for (const NpyWrite& a : arrays) {
    if (a.name.empty()) throw std::invalid_argument("an array to write to " + path + " has no name; give each a name");
    if (!names.insert(a.name).second)
      throw std::invalid_argument("the array " + a.name + " is given twice for " + path + "; names must be unique");
    const std::string member = a.name + ".npy";
    if (member.size() > 0xffff) throw std::invalid_argument("the array name " + a.name.substr(0, 40) + "... is too long");
    const std::string npy = encode_npy(a);
    const uint32_t crc = crc32_of(npy);
    if (zip.size() + npy.size() + member.size() + 30 >= 0xffffffffull || arrays.size() > 0xfffe)
      throw std::invalid_argument("the arrays for " + path +
                                  " come to 4 GiB or more (or more than 65534 arrays), beyond a zip without "
                                  "zip64 records; write them to several files");
    const auto offset = static_cast<uint32_t>(zip.size());
    auto common = [&](std::string& s) {  // version needed .. name length, shared by both headers
      put16(s, 20), put16(s, 0), put16(s, 0), put16(s, 0), put16(s, kDosDate);
      put32(s, crc), put32(s, static_cast<uint32_t>(npy.size())), put32(s, static_cast<uint32_t>(npy.size()));
      put16(s, static_cast<uint32_t>(member.size()));
    };
    put32(zip, kLocalSig);
    common(zip);
    put16(zip, 0);  // extra length
    zip += member;
    zip += npy;
    put32(central, kCentralSig);
    put16(central, 20);  // version made by
    common(central);
    put16(central, 0), put16(central, 0), put16(central, 0), put16(central, 0);  // extra, comment, disk, internal
    put32(central, 0), put32(central, offset);  // external attributes, local header
    central += member;
  }
  if (zip.size() + central.size() + 22 >= 0xffffffffull)
    throw std::invalid_argument("the arrays for " + path + " come to 4 GiB or more; write them to several files");
  const auto cd_offset = static_cast<uint32_t>(zip.size());
  zip += central;
  put32(zip, kEndSig);
  put16(zip, 0), put16(zip, 0);
  put16(zip, static_cast<uint32_t>(arrays.size())), put16(zip, static_cast<uint32_t>(arrays.size()));
  put32(zip, static_cast<uint32_t>(central.size())), put32(zip, cd_offset);
  put16(zip, static_cast<uint32_t>(std::strlen(kNpzWriterComment)));  // the archive's comment: its writer
  zip += kNpzWriterComment;
  write_file_atomic(path, zip, what);
}

}  // namespace meshtrain::io
