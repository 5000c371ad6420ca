// Tests for data/images: opening a directory of four IDX files (plain and gzip), every refusal
// of a directory, the epoch permutation and the sequential (file) order, training batches as pure functions of (seed, step)
// whatever the row slicing, augmentation (deterministic, a real crop and flip, checked against
// an independent padded crop), evaluation batches with the padded last batch, and, when Debian's
// dataset-fashion-mnist is installed, the real data set.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "idx_files.h"
#include "meshtrain/data/idx.h"
#include "meshtrain/data/images.h"
#include "meshtrain/tensor/rng.h"
#include "temp_dir.h"

using namespace meshtrain;
using namespace meshtrain::train;
using meshtrain::testing::idx_bytes;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_gzip;
using meshtrain::testing::write_plain;
namespace fs = std::filesystem;

namespace mt = meshtrain::testing;

namespace {

constexpr int64_t kRows = 5;  // not square, so a swapped row and column shows
constexpr int64_t kCols = 6;
constexpr int64_t kTrain = 50;
constexpr int64_t kTest = 23;

// A small data set in dir: training images plain, the rest gzip (the reader takes both).
void write_set(const TempDir& dir, int64_t n_train = kTrain, int64_t n_test = kTest) {
  write_plain(dir.file("train-images-idx3-ubyte"),
              idx_bytes(kIdxImagesMagic, {uint32_t(n_train), kRows, kCols},
                        mt::test_pixels(n_train, kRows, kCols)));
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"),
             idx_bytes(kIdxLabelsMagic, {uint32_t(n_train)}, mt::test_labels(n_train)));
  write_gzip(dir.file("t10k-images-idx3-ubyte.gz"),
             idx_bytes(kIdxImagesMagic, {uint32_t(n_test), kRows, kCols},
                       mt::test_pixels(n_test, kRows, kCols)));
  write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"),
             idx_bytes(kIdxLabelsMagic, {uint32_t(n_test)}, mt::test_labels(n_test, 3)));
}

float normalised(int pixel) {
  return (static_cast<float>(pixel) / 255.0f - ImageDataset::kMean) / ImageDataset::kStd;
}

template <class F>
void expect_data_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no DataError (expected: " << parts.back() << ")";
  } catch (const DataError& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};

Batch train_rows(const ImageDataset& ds, uint64_t seed, int64_t step, int64_t B, int64_t r0,
                 int64_t r1, bool augment, Split split = Split::train,
                 DataOrder order = DataOrder::random) {
  const int64_t pixels = ds.height() * ds.width();
  Batch b{std::vector<float>((r1 - r0) * pixels), std::vector<int32_t>(r1 - r0)};
  ds.batch(split, order, seed, step, B, r0, r1, b.images.data(), b.labels.data(), augment);
  return b;
}

// Image i of the test set as the batch should hold it, built independently: pad by 2 zero
// pixels, crop at (dy, dx), then mirror.
std::vector<float> expected_image(int64_t i, const Augmentation& a) {
  const int64_t pad = ImageDataset::kPad;
  const int64_t ph = kRows + 2 * pad, pw = kCols + 2 * pad;
  std::vector<int> padded(ph * pw, 0);
  for (int64_t y = 0; y < kRows; ++y)
    for (int64_t x = 0; x < kCols; ++x)
      padded[(y + pad) * pw + x + pad] = mt::test_pixel(i, y, x, kCols);
  std::vector<float> out(kRows * kCols);
  for (int64_t y = 0; y < kRows; ++y)
    for (int64_t x = 0; x < kCols; ++x) {
      const int64_t cx = a.flip ? kCols - 1 - x : x;
      out[y * kCols + x] = normalised(padded[(y + a.dy) * pw + cx + a.dx]);
    }
  return out;
}

// The index of the training image a batch row holds, read back from its pixels and label.
int64_t which_image(const float* img, int32_t label) {
  for (int64_t i = 0; i < kTrain; ++i)
    if (img[0] == normalised(mt::test_pixel(i, 0, 0, kCols)) &&
        img[kCols + 1] == normalised(mt::test_pixel(i, 1, 1, kCols)) && label == i % 10)
      return i;
  return -1;
}

// ---- opening ----

TEST(ImageDataset, OpensADirectoryOfPlainAndGzipFiles) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  EXPECT_EQ(ds.path(), dir.path().string());
  EXPECT_EQ(ds.channels(), 1);
  EXPECT_EQ(ds.height(), kRows);
  EXPECT_EQ(ds.width(), kCols);
  EXPECT_EQ(ds.classes(), 10);
  EXPECT_EQ(ds.num_images(Split::train), kTrain);
  EXPECT_EQ(ds.num_images(Split::val), kTest);
  EXPECT_EQ(std::vector<uint8_t>(ds.pixels(Split::train), ds.pixels(Split::train) + kTrain * kRows * kCols),
            mt::test_pixels(kTrain, kRows, kCols));
  EXPECT_EQ(std::vector<uint8_t>(ds.labels(Split::val), ds.labels(Split::val) + kTest),
            mt::test_labels(kTest, 3));
}

TEST(ImageDataset, PrefersThePlainFileWhenBothNamesExist) {
  TempDir dir("images");
  write_set(dir);
  // A gzip twin of the training images that would fail: the plain one must be read.
  write_gzip(dir.file("train-images-idx3-ubyte.gz"), "garbage");
  EXPECT_EQ(ImageDataset::open(dir.path().string()).num_images(Split::train), kTrain);
}

TEST(ImageDataset, RefusesMissingDirectoriesAndFiles) {
  TempDir dir("images");
  const std::string missing = dir.file("nowhere");
  expect_data_error([&] { ImageDataset::open(missing); }, {missing, "does not exist"});
  write_plain(dir.file("a_file"), "x");
  expect_data_error([&] { ImageDataset::open(dir.file("a_file")); },
                    {dir.file("a_file"), "is not a directory"});
  write_set(dir);
  // write_set writes the training images plain and the other three files gzip-compressed.
  for (const std::string name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    TempDir one("images");
    write_set(one);
    const std::string plain = one.file(name);
    fs::remove(fs::exists(plain) ? plain : plain + ".gz");
    expect_data_error([&] { ImageDataset::open(one.path().string()); },
                      {one.path().string(), "has neither " + name + " nor " + name + ".gz"});
  }
}

TEST(ImageDataset, RefusesMismatchedFiles) {
  {  // image and label counts differ
    TempDir dir("images");
    write_set(dir);
    write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"),
               idx_bytes(kIdxLabelsMagic, {kTest - 1}, mt::test_labels(kTest - 1)));
    expect_data_error([&] { ImageDataset::open(dir.path().string()); },
                      {dir.file("t10k-images-idx3-ubyte.gz"), dir.file("t10k-labels-idx1-ubyte.gz"),
                       "holds 23 images but the second 22 labels"});
  }
  {  // a split without images
    TempDir dir("images");
    write_set(dir, kTrain, 0);
    expect_data_error([&] { ImageDataset::open(dir.path().string()); },
                      {dir.file("t10k-images-idx3-ubyte.gz"), "holds no images"});
  }
  {  // training and test images of different sizes
    TempDir dir("images");
    write_set(dir);
    write_gzip(dir.file("t10k-images-idx3-ubyte.gz"),
               idx_bytes(kIdxImagesMagic, {kTest, kCols, kRows}, mt::test_pixels(kTest, kCols, kRows)));
    expect_data_error([&] { ImageDataset::open(dir.path().string()); },
                      {dir.file("t10k-images-idx3-ubyte.gz"), "different sizes (5 x 6 and 6 x 5)"});
  }
  {  // the reader's refusals name the file inside the directory
    TempDir dir("images");
    write_set(dir);
    write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"),
               idx_bytes(kIdxLabelsMagic, {kTest}, std::vector<uint8_t>(kTest, 10)));
    expect_data_error([&] { ImageDataset::open(dir.path().string()); },
                      {dir.file("t10k-labels-idx1-ubyte.gz"), "has label 10 at index 0, outside the classes 0..9"});
    write_plain(dir.file("train-labels-idx1-ubyte"), mt::read_all(dir.file("train-images-idx3-ubyte")));
    expect_data_error([&] { ImageDataset::open(dir.path().string()); },
                      {dir.file("train-labels-idx1-ubyte"), "not 0x00000801"});
  }
}

// ---- the permutation ----

TEST(EpochPosition, IsABijectionForEverySize) {
  for (int64_t n : {1, 2, 3, 4, 5, 16, 17, 100, 1000, 4097}) {
    for (uint64_t key : {uint64_t{1}, uint64_t{0x9e3779b97f4a7c15}}) {
      std::vector<char> seen(n, 0);
      for (int64_t k = 0; k < n; ++k) {
        const int64_t v = epoch_position(key, n, k);
        ASSERT_TRUE(v >= 0 && v < n) << "n=" << n << " k=" << k;
        EXPECT_FALSE(seen[v]) << "n=" << n << " value " << v << " twice";
        seen[v] = 1;
      }
    }
  }
  EXPECT_THROW(epoch_position(1, 10, 10), std::invalid_argument);
  EXPECT_THROW(epoch_position(1, 0, 0), std::invalid_argument);
}

TEST(EpochPosition, KeysGiveDifferentShuffles) {
  const int64_t n = 1000;
  std::vector<int64_t> a(n), b(n);
  int64_t fixed = 0;
  for (int64_t k = 0; k < n; ++k) {
    a[k] = epoch_position(stream_key(1, "x"), n, k);
    b[k] = epoch_position(stream_key(2, "x"), n, k);
    fixed += a[k] == k;
  }
  EXPECT_NE(a, b);
  EXPECT_LT(fixed, 10);  // a random permutation has one fixed point on average
}

// ---- training batches ----

TEST(ImageDataset, EveryImageOncePerEpoch) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  const int64_t B = 7;  // does not divide 50: batches straddle epoch ends
  std::vector<int64_t> order;
  for (int64_t step = 0; step * B < 3 * kTrain; ++step) {
    const Batch b = train_rows(ds, 5, step, B, 0, B, false);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t i = ds.image_index(Split::train, DataOrder::random, 5, step, B, r);
      EXPECT_EQ(which_image(b.images.data() + r * kRows * kCols, b.labels[r]), i);
      order.push_back(i);
    }
  }
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int64_t> ep(order.begin() + e * kTrain, order.begin() + (e + 1) * kTrain);
    std::vector<int64_t> sorted = ep;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < kTrain; ++i) ASSERT_EQ(sorted[i], i) << "epoch " << e;
    epochs.push_back(ep);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  std::vector<int64_t> other;
  for (int64_t r = 0; r < B; ++r)
    other.push_back(ds.image_index(Split::train, DataOrder::random, 6, 0, B, r));
  EXPECT_NE(other, std::vector<int64_t>(order.begin(), order.begin() + B)) << "seed changes the order";
}

TEST(ImageDataset, SequentialOrderIsFileOrderWrappingAtTheEnd) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  const int64_t B = 7;  // does not divide 50: steps 7 and 14 straddle the end of the file
  for (int64_t step = 0; step * B < 3 * kTrain; ++step) {
    const Batch b = train_rows(ds, 5, step, B, 0, B, false, Split::train, DataOrder::sequential);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t want = (step * B + r) % kTrain;
      ASSERT_EQ(ds.image_index(Split::train, DataOrder::sequential, 5, step, B, r), want);
      ASSERT_EQ(which_image(b.images.data() + r * kRows * kCols, b.labels[r]), want)
          << "step " << step << " row " << r;
      ASSERT_EQ(b.labels[r], ds.labels(Split::train)[want]);
    }
  }
  // The seed plays no part, and a data-parallel slice holds the whole batch's rows.
  const Batch a = train_rows(ds, 1, 3, B, 0, B, false, Split::train, DataOrder::sequential);
  const Batch c = train_rows(ds, 2, 3, B, 0, B, false, Split::train, DataOrder::sequential);
  EXPECT_EQ(a.images, c.images);
  EXPECT_EQ(a.labels, c.labels);
  const Batch part = train_rows(ds, 1, 3, B, 2, 5, false, Split::train, DataOrder::sequential);
  EXPECT_TRUE(std::equal(part.labels.begin(), part.labels.end(), a.labels.begin() + 2));
  EXPECT_TRUE(std::equal(part.images.begin(), part.images.end(), a.images.begin() + 2 * kRows * kCols));
  // The default order is not file order.
  const Batch random = train_rows(ds, 1, 0, B, 0, B, false);
  const Batch sequential = train_rows(ds, 1, 0, B, 0, B, false, Split::train, DataOrder::sequential);
  EXPECT_NE(random.images, sequential.images);
}

TEST(ImageDataset, BatchesArePureFunctionsOfSeedAndStepWhateverTheSlicing) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  const ImageDataset again = ImageDataset::open(dir.path().string());
  const int64_t B = 12, pixels = kRows * kCols;
  for (bool augment : {false, true})
    for (Split split : {Split::train, Split::val})
      for (int64_t step : {0, 3, 17}) {
        const Batch whole = train_rows(ds, 42, step, B, 0, B, augment, split);
        const Batch other = train_rows(again, 42, step, B, 0, B, augment, split);
        EXPECT_EQ(whole.images, other.images);
        EXPECT_EQ(whole.labels, other.labels);
        // Data-parallel slices, uneven on purpose, and one empty slice.
        for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, 5}, {5, 5}, {5, 9}, {9, 12}}) {
          const Batch part = train_rows(ds, 42, step, B, r0, r1, augment, split);
          EXPECT_TRUE(std::equal(part.images.begin(), part.images.end(),
                                 whole.images.begin() + r0 * pixels))
              << "rows " << r0 << ".." << r1 << " of step " << step;
          EXPECT_TRUE(std::equal(part.labels.begin(), part.labels.end(), whole.labels.begin() + r0));
        }
      }
}

TEST(ImageDataset, NormalisesWithFashionMnistStatistics) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  const Batch b = train_rows(ds, 1, 0, 4, 0, 4, false);
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t i = ds.image_index(Split::train, DataOrder::random, 1, 0, 4, r);
    EXPECT_EQ(b.labels[r], i % 10);
    for (int64_t y = 0; y < kRows; ++y)
      for (int64_t x = 0; x < kCols; ++x)
        ASSERT_FLOAT_EQ(b.images[(r * kRows + y) * kCols + x],
                        (mt::test_pixel(i, y, x, kCols) / 255.0f - 0.2860f) / 0.3530f);
  }
}

// A scale of 3 (a model taking images 3 times larger): every pixel of the file's image, as scale 1
// gives it (augmented or not), becomes a 3 x 3 square.
TEST(ImageDataset, ScaledBatchesRepeatEachPixelAsASquare) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset plain = ImageDataset::open(dir.path().string());
  ImageDataset big = ImageDataset::open(dir.path().string());
  big.set_scale(3);
  ASSERT_EQ(big.height(), 3 * kRows);
  ASSERT_EQ(big.width(), 3 * kCols);
  for (bool augment : {false, true}) {
    const Batch small = train_rows(plain, 5, 2, 4, 0, 4, augment);
    const Batch large = train_rows(big, 5, 2, 4, 0, 4, augment);
    EXPECT_EQ(small.labels, large.labels);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t y = 0; y < 3 * kRows; ++y)
        for (int64_t x = 0; x < 3 * kCols; ++x)
          ASSERT_EQ(large.images[(r * 3 * kRows + y) * 3 * kCols + x], small.images[(r * kRows + y / 3) * kCols + x / 3])
              << "row " << r << " (" << y << ", " << x << ")";
  }
  EXPECT_THROW(big.set_scale(0), std::invalid_argument);
  EXPECT_THROW(big.set_scale(17), std::invalid_argument);
}

// ---- augmentation ----

TEST(ImageDataset, AugmentationIsAPaddedCropAndFlipKeyedByRow) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  const int64_t B = 16, pixels = kRows * kCols;
  std::set<std::pair<int, int>> offsets;
  int flips = 0, changed = 0;
  for (int64_t step = 0; step < 10; ++step) {
    const Batch plain = train_rows(ds, 9, step, B, 0, B, false);
    const Batch aug = train_rows(ds, 9, step, B, 0, B, true);
    EXPECT_EQ(plain.labels, aug.labels) << "augmentation keeps the order and the labels";
    for (int64_t r = 0; r < B; ++r) {
      const Augmentation a = ImageDataset::augmentation(9, step, r);
      const Augmentation same = ImageDataset::augmentation(9, step, r);
      EXPECT_TRUE(a.dy == same.dy && a.dx == same.dx && a.flip == same.flip);
      ASSERT_TRUE(a.dy >= 0 && a.dy <= 4 && a.dx >= 0 && a.dx <= 4);
      offsets.insert({a.dy, a.dx});
      flips += a.flip;
      const int64_t i = ds.image_index(Split::train, DataOrder::random, 9, step, B, r);
      const std::vector<float> want = expected_image(i, a);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), aug.images.begin() + r * pixels))
          << "step " << step << " row " << r << " dy " << a.dy << " dx " << a.dx << " flip " << a.flip;
      const std::vector<float> identity = expected_image(i, Augmentation{2, 2, false});
      EXPECT_TRUE(std::equal(identity.begin(), identity.end(), plain.images.begin() + r * pixels));
      changed += !std::equal(identity.begin(), identity.end(), aug.images.begin() + r * pixels);
    }
  }
  EXPECT_EQ(offsets.size(), 25u) << "all crop offsets occur";
  EXPECT_GT(flips, 50);
  EXPECT_LT(flips, 110);
  EXPECT_GT(changed, 140) << "almost every augmented image differs from the original";
  const Augmentation s1 = ImageDataset::augmentation(1, 0, 0), s2 = ImageDataset::augmentation(2, 0, 0);
  const Augmentation s3 = ImageDataset::augmentation(1, 0, 1), s4 = ImageDataset::augmentation(1, 1, 0);
  const std::set<std::tuple<int, int, bool>> draws = {
      {s1.dy, s1.dx, s1.flip}, {s2.dy, s2.dx, s2.flip}, {s3.dy, s3.dx, s3.flip}, {s4.dy, s4.dx, s4.flip}};
  EXPECT_GT(draws.size(), 1u) << "seed, step and row all key the draw";
}

// ---- evaluation batches ----

TEST(ImageDataset, EvaluationBatchesInOrderWithAPaddedLastBatch) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  const int64_t B = 10, pixels = kRows * kCols;
  ASSERT_EQ(ds.num_eval_batches(Split::val, B), 3);  // 23 images: 10, 10, 3 real rows
  EXPECT_EQ(ds.num_eval_batches(Split::val, 23), 1);
  EXPECT_EQ(ds.num_eval_batches(Split::train, 1), kTrain);
  for (int64_t j = 0; j < 3; ++j) {
    std::vector<float> images(B * pixels, 7.0f);
    std::vector<int32_t> labels(B, 99);
    const int64_t real = ds.eval_batch(Split::val, j, B, 0, B, images.data(), labels.data());
    EXPECT_EQ(real, j < 2 ? 10 : 3);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t i = j * B + r;
      if (i < kTest) {
        EXPECT_EQ(labels[r], (i + 3) % 10);
        EXPECT_FLOAT_EQ(images[r * pixels + 7], normalised(mt::test_pixel(i, 1, 1, kCols)));
      } else {
        EXPECT_EQ(labels[r], -1) << "padding rows carry the ignored label";
        EXPECT_TRUE(std::all_of(images.begin() + r * pixels, images.begin() + (r + 1) * pixels,
                                [](float v) { return v == 0.0f; }));
      }
    }
    // A rank's slice holds the same rows and counts only its real ones.
    std::vector<float> part(4 * pixels);
    std::vector<int32_t> part_labels(4);
    EXPECT_EQ(ds.eval_batch(Split::val, j, B, 1, 5, part.data(), part_labels.data()), j < 2 ? 4 : 2);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), images.begin() + pixels));
    EXPECT_TRUE(std::equal(part_labels.begin(), part_labels.end(), labels.begin() + 1));
  }
}

TEST(ImageDataset, RefusesBadBatchArguments) {
  TempDir dir("images");
  write_set(dir);
  const ImageDataset ds = ImageDataset::open(dir.path().string());
  std::vector<float> img(64 * kRows * kCols);
  std::vector<int32_t> lab(64);
  const DataOrder o = DataOrder::random;
  EXPECT_THROW(ds.batch(Split::train, o, 1, 0, 0, 0, 0, img.data(), lab.data(), false), std::invalid_argument);
  EXPECT_THROW(ds.batch(Split::train, o, 1, -1, 4, 0, 4, img.data(), lab.data(), false), std::invalid_argument);
  EXPECT_THROW(ds.batch(Split::train, o, 1, int64_t{1} << 39, 4, 0, 4, img.data(), lab.data(), false),
               std::invalid_argument);
  EXPECT_THROW(ds.batch(Split::train, o, 1, 0, 4, 2, 5, img.data(), lab.data(), false), std::invalid_argument);
  EXPECT_THROW(ds.batch(Split::train, o, 1, 0, 4, 3, 2, img.data(), lab.data(), false), std::invalid_argument);
  EXPECT_THROW(ds.eval_batch(Split::val, 3, 10, 0, 10, img.data(), lab.data()), std::invalid_argument);
  EXPECT_THROW(ds.eval_batch(Split::val, -1, 10, 0, 10, img.data(), lab.data()), std::invalid_argument);
  EXPECT_THROW(ds.num_eval_batches(Split::val, 0), std::invalid_argument);
}

// ---- the real data set ----

TEST(ImageDataset, OpensDebiansFashionMnist) {
  if (!fs::is_directory(ImageDataset::kFashionMnistDir))
    GTEST_SKIP() << ImageDataset::kFashionMnistDir
                 << " is absent: install the Debian package dataset-fashion-mnist "
                    "(scripts/setup.sh does) to check the real data set";
  const auto t0 = std::chrono::steady_clock::now();
  const ImageDataset ds = ImageDataset::open("fashion-mnist");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[          ] opening fashion-mnist took " << ms << " ms\n";
  RecordProperty("open_ms", std::to_string(ms));
  EXPECT_EQ(ds.path(), ImageDataset::kFashionMnistDir);
  EXPECT_EQ(ds.channels(), 1);
  EXPECT_EQ(ds.height(), 28);
  EXPECT_EQ(ds.width(), 28);
  ASSERT_EQ(ds.num_images(Split::train), 60000);
  ASSERT_EQ(ds.num_images(Split::val), 10000);
  for (Split split : {Split::train, Split::val}) {
    std::vector<int64_t> count(10, 0);
    for (int64_t i = 0; i < ds.num_images(split); ++i) ++count[ds.labels(split)[i]];
    for (int c = 0; c < 10; ++c)  // Fashion-MNIST is balanced exactly
      EXPECT_EQ(count[c], ds.num_images(split) / 10) << to_string(split) << " class " << c;
  }
  // The normalisation constants are the training pixels' mean and standard deviation.
  const int64_t n = 60000 * 28 * 28;
  double sum = 0, sum2 = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double v = ds.pixels(Split::train)[k] / 255.0;
    sum += v;
    sum2 += v * v;
  }
  const double mean = sum / n, std = std::sqrt(sum2 / n - mean * mean);
  EXPECT_NEAR(mean, ImageDataset::kMean, 5e-4);
  EXPECT_NEAR(std, ImageDataset::kStd, 5e-4);
  // A training batch is normalised: mean near 0, standard deviation near 1.
  const int64_t B = 256;
  std::vector<float> img(B * 28 * 28);
  std::vector<int32_t> lab(B);
  ds.batch(Split::train, DataOrder::random, 1, 0, B, 0, B, img.data(), lab.data(), false);
  double bs = 0, bs2 = 0;
  for (float v : img) {
    bs += v;
    bs2 += double(v) * v;
  }
  const double bm = bs / img.size();
  EXPECT_NEAR(bm, 0.0, 0.1);
  EXPECT_NEAR(std::sqrt(bs2 / img.size() - bm * bm), 1.0, 0.1);
}

}  // namespace
