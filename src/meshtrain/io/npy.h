// NumPy's file formats: reading .npy and .npz files in place, and writing .npz archives.
//
// .npy (NEP 1, format versions 1.0, 2.0 and 3.0): the magic "\x93NUMPY", a version, a header
// length (uint16 in 1.0, uint32 after), a Python dict literal with 'descr', 'fortran_order' and
// 'shape', then the elements in C order. Read: the little-endian (or byte-sized) dtypes
//     |u1 |i1 <u2 <i2 <u4 <i4 <u8 <i8 <f4 <f8 |b1
// Refused, each with a sentence naming the file and the array: fortran_order True, big-endian
// and structured or object dtypes, a header that is not such a dict, fewer bytes than the shape
// needs (a truncated file).
//
// .npz: a zip archive of NAME.npy members, as numpy.savez (stored) and numpy.savez_compressed
// (deflate) write it, zip64 included (savez writes zip64 records for large members). The
// archive is memory-mapped read-only: a stored member's array points into the mapping, never
// copied; a deflated member is inflated once (zlib) into memory the archive owns, its CRC-32
// checked. Stored members' CRCs are not checked (that would read every page at open); their
// sizes are. Encrypted members and methods other than stored and deflate are refused.
//
// The zip directory is parsed here (end of central directory, zip64 locator and record, the
// central entries, each member's local header for the offset of its data), because mapping a
// member needs that offset, which zip libraries do not expose (docs/architecture.md).
//
// Alignment: a member's data starts wherever the zip put it, so NpyArray::data may be
// unaligned for its dtype. Read elements with NpyArray::at<T>() or std::memcpy, never through
// a cast pointer (an unaligned float* is undefined behaviour and breaks vectorised loops).
//
// Writing: write_npz() builds a stored (uncompressed) archive of .npy 1.0 members with their
// CRC-32s, which numpy.load reads, and writes it atomically (io/file.h: temporary file, fsync,
// rename). Member order is the order given; 0-d arrays (shape ()) are written as numpy writes
// them. The bytes are fixed by the arrays alone (timestamps are 1980-01-01 00:00), so the same
// arrays give the same file. The archive's comment (which numpy ignores) is kNpzWriterComment,
// so the output policy (train/outputs.h) knows a file meshtrain wrote.
//
// Errors: every refusal of a file throws NpyError (a std::invalid_argument: a file the user gave
// that cannot be used) whose message starts "NumPy file PATH" and, once an array is known,
// names it ("NumPy file d.npz, array x_train: ..."). write_npz throws std::invalid_argument for
// arrays it cannot write (a duplicate or empty name, a shape that does not match the bytes) and
// io::WriteError when the file cannot be written.
//
// Concurrency: an NpyFile is immutable after open; its arrays may be read from any thread.
// Limits: little-endian hosts only; write_npz keeps the whole archive in memory while writing
// and refuses archives of 4 GiB or more (it writes no zip64 records); arrays of at most 2^62
// bytes; a member name is the zip name less ".npy" (numpy.load's key).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain::io {

// The zip comment of every .npz write_npz writes.
inline constexpr const char* kNpzWriterComment = "written by meshtrain";

class NpyError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class NpyType { u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, b8 };

// "uint8", "int8", ..., "float32", "float64", "bool": numpy's names, for messages.
const char* to_string(NpyType t);
// Bytes per element: 1, 2, 4 or 8.
int64_t npy_itemsize(NpyType t);
// numpy's descr: "|u1", "<i8", "<f4", ...
const char* npy_descr(NpyType t);
bool npy_is_integer(NpyType t);  // the signed and unsigned integer types (not bool)

// One array of a file: a view into memory its NpyFile owns (valid while the file lives).
struct NpyArray {
  std::string name;            // the zip member less ".npy"; a .npy file's name less ".npy"
  NpyType type = NpyType::u8;
  std::vector<int64_t> shape;  // C order; empty for a 0-d array
  const std::byte* data = nullptr;  // numel() * itemsize bytes, little-endian, maybe unaligned
  bool mapped = false;         // true: points into the file's mapping (a stored member)

  int64_t numel() const;
  int64_t bytes() const { return numel() * npy_itemsize(type); }
  // "(60000, 28, 28)", "(5,)", "()": numpy's spelling of the shape.
  std::string shape_str() const;
  // Element i (flat C order) read as T, which must be the array's own element type.
  template <class T>
  T at(int64_t i) const {
    T v;
    std::memcpy(&v, data + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  }
  // Element i of an integer or bool array as int64 (uint64 values above 2^63-1 throw NpyError
  // naming the array, the value and the index); `path` names the file in that message.
  int64_t integer_at(int64_t i, const std::string& path) const;
};

// Whether `path` starts as an .npz ("PK\3\4") or a .npy ("\x93NUMPY") does: a cheap look at
// its first bytes, to tell NumPy files from text before opening them. False when unreadable.
bool looks_like_numpy(const std::string& path);
// Whether it starts as a .npy array does.
bool looks_like_npy(const std::string& path);

class NpyFile {
 public:
  // Opens a .npz or .npy file, told apart by its first bytes (a zip's "PK\3\4", or the .npy
  // magic), whatever its name. Throws NpyError as described in the header comment, also for a
  // missing or unreadable file, a directory, an empty file, or one that is neither format.
  static std::shared_ptr<const NpyFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  bool is_npz() const { return npz_; }
  const std::vector<NpyArray>& arrays() const { return arrays_; }
  // The array of that name, or nullptr.
  const NpyArray* find(const std::string& name) const;
  // "x_train, y_train": the arrays' names, for messages.
  std::string names() const;

  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;
  ~NpyFile();

 private:
  NpyFile() = default;
  std::string path_;
  bool npz_ = false;
  void* map_ = nullptr;  // the whole file, PROT_READ (nullptr when empty)
  size_t map_size_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> inflated_;  // deflated members' arrays
  std::vector<NpyArray> arrays_;
  friend struct NpyFileBuilder;
};

// An array to write: `data` holds numel(shape) elements of `type`, C order, little-endian.
struct NpyWrite {
  std::string name;            // the key numpy.load gives ("fc.weight"); the member is name + ".npy"
  NpyType type = NpyType::f32;
  std::vector<int64_t> shape;  // {} for a 0-d array (one element)
  const void* data = nullptr;  // may be null only when the shape holds no element
};

// The bytes of one .npy file (format 1.0; 2.0 when the header needs more than 65535 bytes).
std::string encode_npy(const NpyWrite& array);
// Writes `arrays` as a stored .npz at `path`, atomically (header comment). `what` names the
// file in write errors ("state dict").
void write_npz(const std::string& path, const std::vector<NpyWrite>& arrays,
               const std::string& what = "NumPy archive");

}  // namespace meshtrain::io
