// Test helpers: IDX files written byte by byte (big-endian header, then uint8 values), plain or
// gzip-compressed, and small image sets whose pixels say which image and which pixel they are.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain::testing {

inline void put_u32_be(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

// The bytes of an IDX file: magic, dimensions, values.
inline std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                             const std::vector<uint8_t>& values) {
  std::string out;
  put_u32_be(out, magic);
  for (uint32_t d : dims) put_u32_be(out, d);
  out.append(values.begin(), values.end());
  return out;
}

inline void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

inline void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot gzopen " + path);
  if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) <= 0)
    throw std::runtime_error("gzwrite failed for " + path);
  gzclose(f);
}

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Pixel (y, x) of image i in the test sets: distinct within an image (so crops and flips show)
// and varying between images.
inline uint8_t test_pixel(int64_t i, int64_t y, int64_t x, int64_t cols) {
  return static_cast<uint8_t>((i * 37 + y * cols + x + 1) % 251);
}

inline std::vector<uint8_t> test_pixels(int64_t n, int64_t rows, int64_t cols) {
  std::vector<uint8_t> p(static_cast<size_t>(n * rows * cols));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t y = 0; y < rows; ++y)
      for (int64_t x = 0; x < cols; ++x) p[(i * rows + y) * cols + x] = test_pixel(i, y, x, cols);
  return p;
}

inline std::vector<uint8_t> test_labels(int64_t n, int64_t offset = 0) {
  std::vector<uint8_t> l(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) l[i] = static_cast<uint8_t>((i + offset) % 10);
  return l;
}

// A learnable synthetic image set in Fashion-MNIST's shape (28 x 28, 10 classes): image i has
// class (i * 7 + salt) % 10, drawn as a bright bar at rows 2c+4, 2c+5 over noise.
inline std::vector<uint8_t> bar_images(int64_t n, uint32_t salt, std::vector<uint8_t>& labels) {
  std::vector<uint8_t> px(static_cast<size_t>(n * 28 * 28));
  uint32_t s = salt;
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>((i * 7 + salt) % 10);
    labels.push_back(static_cast<uint8_t>(c));
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) {
        s = s * 1103515245u + 12345u;
        px[(i * 28 + y) * 28 + x] = static_cast<uint8_t>((s >> 16) % 96 + (y / 2 == c + 2 ? 150 : 0));
      }
  }
  return px;
}

// The four IDX files of a bar-image set in `dir` (gzip or plain); returns the test labels.
inline std::vector<uint8_t> write_bar_image_set(const std::string& dir, int64_t train_n, int64_t test_n, bool gzip) {
  std::vector<uint8_t> train_labels, test_labels;
  const auto train_px = bar_images(train_n, 1, train_labels), test_px = bar_images(test_n, 5, test_labels);
  const std::string z = gzip ? ".gz" : "";
  auto put = [&](const std::string& name, const std::string& bytes) {
    (gzip ? write_gzip : write_plain)(dir + "/" + name + z, bytes);
  };
  const auto n = static_cast<uint32_t>(train_n), m = static_cast<uint32_t>(test_n);
  put("train-images-idx3-ubyte", idx_bytes(0x803, {n, 28, 28}, train_px));
  put("train-labels-idx1-ubyte", idx_bytes(0x801, {n}, train_labels));
  put("t10k-images-idx3-ubyte", idx_bytes(0x803, {m, 28, 28}, test_px));
  put("t10k-labels-idx1-ubyte", idx_bytes(0x801, {m}, test_labels));
  return test_labels;
}

}  // namespace meshtrain::testing
