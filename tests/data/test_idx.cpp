// Tests for data/idx: IDX image and label files read plain and gzip-compressed (recognised by
// their bytes, not their names), and every refusal: a DataError whose sentence names the file
// and the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "idx_files.h"
#include "meshtrain/data/data.h"
#include "meshtrain/data/idx.h"
#include "temp_dir.h"

using namespace meshtrain;
using namespace meshtrain::train;
using meshtrain::testing::idx_bytes;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_gzip;
using meshtrain::testing::write_plain;

namespace mt = meshtrain::testing;

namespace {

template <class F>
void expect_data_error(F&& f, const std::string& path, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no DataError for " << path << " (expected: " << part << ")";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find(part), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one sentence, one line: " << what;
  }
}

const std::vector<uint8_t> kPixels = mt::test_pixels(2, 3, 4);  // (2, 3, 4)
const std::string kImages = idx_bytes(kIdxImagesMagic, {2, 3, 4}, kPixels);
const std::string kLabels = idx_bytes(kIdxLabelsMagic, {5}, {0, 9, 3, 3, 7});

// ---- reading ----

TEST(Idx, ReadsPlainImagesAndLabels) {
  TempDir dir("idx");
  write_plain(dir.file("img"), kImages);
  write_plain(dir.file("lab"), kLabels);
  const IdxImages im = read_idx_images(dir.file("img"));
  EXPECT_EQ(im.path, dir.file("img"));
  EXPECT_EQ(im.count, 2);
  EXPECT_EQ(im.rows, 3);
  EXPECT_EQ(im.cols, 4);
  EXPECT_EQ(im.pixels, kPixels);
  const IdxLabels lab = read_idx_labels(dir.file("lab"), 10);
  EXPECT_EQ(lab.labels, (std::vector<uint8_t>{0, 9, 3, 3, 7}));
}

TEST(Idx, ReadsGzipByItsBytesWhateverTheName) {
  TempDir dir("idx");
  write_gzip(dir.file("img.gz"), kImages);
  write_gzip(dir.file("img_no_suffix"), kImages);   // gzip without the .gz name
  write_plain(dir.file("plain.gz"), kImages);       // plain with a .gz name
  for (const char* name : {"img.gz", "img_no_suffix", "plain.gz"}) {
    const IdxImages im = read_idx_images(dir.file(name));
    EXPECT_EQ(im.count, 2) << name;
    EXPECT_EQ(im.pixels, kPixels) << name;
  }
  write_gzip(dir.file("lab.gz"), kLabels);
  EXPECT_EQ(read_idx_labels(dir.file("lab.gz"), 10).labels.size(), 5u);
}

TEST(Idx, ReadsEmptySetsAndMultiMegabyteGzip) {
  TempDir dir("idx");
  write_gzip(dir.file("empty.gz"), idx_bytes(kIdxLabelsMagic, {0}, {}));
  EXPECT_TRUE(read_idx_labels(dir.file("empty.gz"), 10).labels.empty());
  // Larger than one read chunk (1 MiB), so the chunked gzip path is walked more than once.
  const std::vector<uint8_t> big = mt::test_pixels(3000, 28, 28);
  write_gzip(dir.file("big.gz"), idx_bytes(kIdxImagesMagic, {3000, 28, 28}, big));
  EXPECT_EQ(read_idx_images(dir.file("big.gz")).pixels, big);
}

// ---- refusals ----

TEST(Idx, RefusesMissingEmptyAndNonRegularFiles) {
  TempDir dir("idx");
  expect_data_error([&] { read_idx_images(dir.file("nope")); }, dir.file("nope"), "does not exist");
  expect_data_error([&] { read_idx_images(dir.path().string()); }, dir.path().string(),
                    "not a regular file");
  write_plain(dir.file("empty"), "");
  expect_data_error([&] { read_idx_images(dir.file("empty")); }, dir.file("empty"), "is empty");
}

TEST(Idx, RefusesWrongMagic) {
  TempDir dir("idx");
  write_plain(dir.file("lab"), kLabels);
  write_plain(dir.file("img"), kImages);
  write_plain(dir.file("text"), "hello, this is not an IDX file at all");
  expect_data_error([&] { read_idx_images(dir.file("lab")); }, dir.file("lab"),
                    "starts with 0x00000801 (the magic of an IDX label file), not 0x00000803");
  expect_data_error([&] { read_idx_labels(dir.file("img"), 10); }, dir.file("img"),
                    "starts with 0x00000803 (the magic of an IDX image file), not 0x00000801");
  expect_data_error([&] { read_idx_images(dir.file("text")); }, dir.file("text"),
                    "not an IDX magic at all");
  // uint8 but four dimensions: an IDX file of another rank.
  write_plain(dir.file("rank4"), idx_bytes(0x00000804, {1, 1, 1, 1}, {0}));
  expect_data_error([&] { read_idx_images(dir.file("rank4")); }, dir.file("rank4"),
                    "another type or rank");
}

TEST(Idx, RefusesAHeaderCutShort) {
  TempDir dir("idx");
  write_plain(dir.file("img"), kImages.substr(0, 10));
  expect_data_error([&] { read_idx_images(dir.file("img")); }, dir.file("img"),
                    "holds only 10 bytes (as a file), fewer than the 16-byte IDX header");
  write_gzip(dir.file("lab.gz"), kLabels.substr(0, 6));
  expect_data_error([&] { read_idx_labels(dir.file("lab.gz"), 10); }, dir.file("lab.gz"),
                    "holds only 6 bytes (as a decompressed gzip stream)");
}

TEST(Idx, RefusesDimensionsThatDoNotMatchTheBytes) {
  TempDir dir("idx");
  write_plain(dir.file("short"), kImages.substr(0, kImages.size() - 1));
  expect_data_error([&] { read_idx_images(dir.file("short")); }, dir.file("short"),
                    "its header declares 2 x 3 x 4 = 24 values but 23 bytes follow the header");
  write_plain(dir.file("long"), kImages + "x");
  expect_data_error([&] { read_idx_images(dir.file("long")); }, dir.file("long"),
                    "24 values but 25 bytes follow the header");
  write_gzip(dir.file("short.gz"), kLabels.substr(0, kLabels.size() - 2));
  expect_data_error([&] { read_idx_labels(dir.file("short.gz"), 10); }, dir.file("short.gz"),
                    "declares 5 = 5 values but only 3 follow the header in the decompressed gzip stream");
  write_gzip(dir.file("long.gz"), kLabels + std::string(3, '\0'));
  expect_data_error([&] { read_idx_labels(dir.file("long.gz"), 10); }, dir.file("long.gz"),
                    "declares 5 = 5 values but more bytes follow them");
  // A corrupt header promising a terabyte fails without allocating it.
  write_gzip(dir.file("huge.gz"), idx_bytes(kIdxImagesMagic, {0xffffffffu, 0xffffffffu, 4}, {1, 2}));
  expect_data_error([&] { read_idx_images(dir.file("huge.gz")); }, dir.file("huge.gz"),
                    "far more values than any data set holds");
  write_gzip(dir.file("big.gz"), idx_bytes(kIdxImagesMagic, {60000, 28, 28}, {1, 2, 3}));
  expect_data_error([&] { read_idx_images(dir.file("big.gz")); }, dir.file("big.gz"),
                    "47040000 values but only 3 follow");
}

TEST(Idx, RefusesTruncatedAndCorruptGzip) {
  TempDir dir("idx");
  const std::vector<uint8_t> big = mt::test_pixels(200, 28, 28);
  write_gzip(dir.file("whole.gz"), idx_bytes(kIdxImagesMagic, {200, 28, 28}, big));
  const std::string gz = mt::read_all(dir.file("whole.gz"));
  ASSERT_GT(gz.size(), 100u);
  // Cut inside the compressed data, and cut only the 8-byte trailer (CRC32 and size).
  write_plain(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  expect_data_error([&] { read_idx_images(dir.file("cut.gz")); }, dir.file("cut.gz"),
                    "is a truncated gzip stream");
  write_plain(dir.file("cut_trailer.gz"), gz.substr(0, gz.size() - 4));
  expect_data_error([&] { read_idx_images(dir.file("cut_trailer.gz")); },
                    dir.file("cut_trailer.gz"), "is a truncated gzip stream");
  // A wrong CRC32 in the trailer: every byte decompresses, the check fails.
  std::string bad_crc = gz;
  bad_crc[gz.size() - 8] = static_cast<char>(bad_crc[gz.size() - 8] ^ 0x5a);
  write_plain(dir.file("crc.gz"), bad_crc);
  expect_data_error([&] { read_idx_images(dir.file("crc.gz")); }, dir.file("crc.gz"),
                    "is a corrupt gzip stream (zlib: incorrect data check)");
}

TEST(Idx, RefusesLabelsOutsideTheClasses) {
  TempDir dir("idx");
  write_plain(dir.file("lab"), idx_bytes(kIdxLabelsMagic, {4}, {0, 9, 10, 1}));
  expect_data_error([&] { read_idx_labels(dir.file("lab"), 10); }, dir.file("lab"),
                    "has label 10 at index 2, outside the classes 0..9");
  EXPECT_EQ(read_idx_labels(dir.file("lab"), 11).labels[2], 10);
  expect_data_error([&] { read_idx_labels(dir.file("lab"), 3); }, dir.file("lab"),
                    "has label 9 at index 1, outside the classes 0..2");
  EXPECT_THROW(read_idx_labels(dir.file("lab"), 0), std::invalid_argument);
  EXPECT_THROW(read_idx_labels(dir.file("lab"), 257), std::invalid_argument);
}

}  // namespace
