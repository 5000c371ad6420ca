// Reading IDX files, the format of MNIST and Fashion-MNIST (LeCun's "THE IDX FILE FORMAT").
//
// An IDX file is a 4-byte magic, then one big-endian uint32 per dimension, then the values in
// row-major order. The magic is 0x00 0x00 <type> <number of dimensions>; two kinds are read:
//   - images: magic 0x00000803 (uint8, 3 dimensions): N, rows, cols, then N*rows*cols pixels;
//   - labels: magic 0x00000801 (uint8, 1 dimension):  N, then N labels.
// A file is read plain or gzip-compressed (as the data sets are published): a file that starts
// with the gzip magic 0x1f 0x8b is decompressed through zlib whatever its name, any other file
// is read as it is.
//
// Every problem throws DataError with one sentence that names the file, says what is wrong and
// what to do: a missing or unreadable file, a wrong magic, dimensions that do not match the
// bytes that follow (too few or too many), a truncated or corrupt gzip stream, a label outside
// 0..classes-1.
//
// Limits: only unsigned-byte IDX files of these two shapes; the whole file is decompressed into
// memory once (one byte per value, no second copy).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::train {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // uint8, (N, rows, cols)
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // uint8, (N)

struct IdxImages {
  std::string path;
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // (count, rows, cols), row-major, 0 (background) .. 255
};

struct IdxLabels {
  std::string path;
  std::vector<uint8_t> labels;  // (count,), each in 0..classes-1
};

// Reads an image file (magic 0x00000803). Throws DataError as described above.
IdxImages read_idx_images(const std::string& path);

// Reads a label file (magic 0x00000801) whose labels must lie in 0..classes-1 (classes in
// 1..256, else std::invalid_argument). Throws DataError as described above.
IdxLabels read_idx_labels(const std::string& path, int32_t classes);

}  // namespace meshtrain::train
