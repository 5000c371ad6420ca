// Image data sets from an .npz (data/images.h): the per-channel statistics against a direct
// computation, normalised batches in NCHW whatever the file's layout, uint8 read from the
// mapping, float32 images, keras' (N, 1) labels, the sequential order in file order, and the
// refusals that need no model (fit_to's are in tests/cli/test_npz_cli.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/data/images.h"
#include "meshtrain/io/npy.h"
#include "temp_dir.h"

using namespace meshtrain::train;
using meshtrain::io::NpyType;
using meshtrain::testing::TempDir;

namespace {

constexpr int64_t kN = 12, kC = 3, kH = 5, kW = 7, kTest = 4;

uint8_t pixel(int64_t i, int64_t c, int64_t y, int64_t x) {
  return static_cast<uint8_t>((i * 37 + c * 80 + y * 11 + x * 5) % 256);
}

std::vector<uint8_t> images(int64_t n, bool nhwc, int64_t offset = 0) {
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t a = 0; a < (nhwc ? kH : kC); ++a)
      for (int64_t b = 0; b < (nhwc ? kW : kH); ++b)
        for (int64_t d = 0; d < (nhwc ? kC : kW); ++d)
          out.push_back(nhwc ? pixel(i + offset, d, a, b) : pixel(i + offset, a, b, d));
  return out;
}

void expect_data_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nlacks: " << p;
  }
}

struct Set {
  std::vector<uint8_t> x_train, x_test;
  std::vector<int64_t> y_train, y_test;
};

Set make(bool nhwc) {
  Set s{images(kN, nhwc), images(kTest, nhwc, 100), {}, {}};
  for (int64_t i = 0; i < kN; ++i) s.y_train.push_back(i % 3);
  for (int64_t i = 0; i < kTest; ++i) s.y_test.push_back((i + 1) % 3);
  return s;
}

void write(const std::string& path, const Set& s, bool nhwc) {
  const std::vector<int64_t> tr = nhwc ? std::vector<int64_t>{kN, kH, kW, kC} : std::vector<int64_t>{kN, kC, kH, kW};
  const std::vector<int64_t> te = nhwc ? std::vector<int64_t>{kTest, kH, kW, kC} : std::vector<int64_t>{kTest, kC, kH, kW};
  meshtrain::io::write_npz(path, {{"x_train", NpyType::u8, tr, s.x_train.data()},
                                  {"y_train", NpyType::i64, {kN}, s.y_train.data()},
                                  {"x_test", NpyType::u8, te, s.x_test.data()},
                                  {"y_test", NpyType::i64, {kTest}, s.y_test.data()}});
}

}  // namespace

TEST(NpzImages, StatisticsAndBatchesWhateverTheLayout) {
  TempDir dir("npz_images");
  write(dir.file("nchw.npz"), make(false), false);
  write(dir.file("nhwc.npz"), make(true), true);
  const ImageDataset a = ImageDataset::open(dir.file("nchw.npz"));
  const ImageDataset b = ImageDataset::open(dir.file("nhwc.npz"));
  for (const ImageDataset* ds : {&a, &b}) {
    EXPECT_EQ(ds->channels(), kC);
    EXPECT_EQ(ds->height(), kH);
    EXPECT_EQ(ds->width(), kW);
    EXPECT_EQ(ds->num_images(Split::train), kN);
    EXPECT_EQ(ds->num_images(Split::val), kTest);
    EXPECT_EQ(ds->classes(), 3);  // the largest label + 1 until fit_to
    ASSERT_EQ(ds->mean().size(), 3u);
  }
  EXPECT_NE(a.describe().find("data: x_train 12 x 3 x 5 x 7 uint8 (NCHW), mean ["), std::string::npos) << a.describe();
  EXPECT_NE(b.describe().find("(NHWC)"), std::string::npos) << b.describe();
  // The statistics of x/255 per channel, directly.
  for (int64_t c = 0; c < kC; ++c) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t y = 0; y < kH; ++y)
        for (int64_t x = 0; x < kW; ++x) sum += pixel(i, c, y, x) / 255.0;
    const double mean = sum / (kN * kH * kW);
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t y = 0; y < kH; ++y)
        for (int64_t x = 0; x < kW; ++x) sq += (pixel(i, c, y, x) / 255.0 - mean) * (pixel(i, c, y, x) / 255.0 - mean);
    EXPECT_FLOAT_EQ(a.mean()[static_cast<size_t>(c)], static_cast<float>(mean));
    EXPECT_FLOAT_EQ(a.std_dev()[static_cast<size_t>(c)], static_cast<float>(std::sqrt(sq / (kN * kH * kW))));
    EXPECT_EQ(a.mean()[static_cast<size_t>(c)], b.mean()[static_cast<size_t>(c)]);
    EXPECT_EQ(a.std_dev()[static_cast<size_t>(c)], b.std_dev()[static_cast<size_t>(c)]);
  }
  // Sequential batches: file order, NCHW, normalised; the two layouts give the same floats.
  const int64_t B = 5, per = kC * kH * kW;
  for (int64_t step = 0; step < 4; ++step) {
    std::vector<float> xa(B * per), xb(B * per);
    std::vector<int32_t> la(B), lb(B);
    a.batch(Split::train, DataOrder::sequential, 1, step, B, 0, B, xa.data(), la.data(), false);
    b.batch(Split::train, DataOrder::sequential, 1, step, B, 0, B, xb.data(), lb.data(), false);
    EXPECT_EQ(xa, xb);
    EXPECT_EQ(la, lb);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t i = (step * B + r) % kN;
      EXPECT_EQ(la[static_cast<size_t>(r)], i % 3);
      for (int64_t c = 0; c < kC; ++c) {
        const float want = (static_cast<float>(pixel(i, c, 2, 3)) / 255.0f - a.mean()[static_cast<size_t>(c)]) /
                           a.std_dev()[static_cast<size_t>(c)];
        EXPECT_EQ(xa[static_cast<size_t>(r * per + (c * kH + 2) * kW + 3)], want) << "step " << step << " row " << r << " channel " << c;
      }
    }
  }
  // Random order with augmentation: the same rows whatever the layout.
  std::vector<float> xa(B * per), xb(B * per);
  std::vector<int32_t> la(B), lb(B);
  a.batch(Split::train, DataOrder::random, 7, 3, B, 0, B, xa.data(), la.data(), true);
  b.batch(Split::train, DataOrder::random, 7, 3, B, 0, B, xb.data(), lb.data(), true);
  EXPECT_EQ(xa, xb);
  // Evaluation pads with zero images and label -1.
  std::vector<float> xe(6 * per, 1.0f);
  std::vector<int32_t> le(6);
  EXPECT_EQ(a.eval_batch(Split::val, 0, 6, 0, 6, xe.data(), le.data()), kTest);
  EXPECT_EQ(le[5], -1);
  EXPECT_EQ(xe[5 * per], 0.0f);
  // uint8 images are read where the file holds them.
  ASSERT_NE(a.pixels(Split::train), nullptr);
  EXPECT_EQ(a.pixels(Split::train)[1], pixel(0, 0, 0, 1));
}

TEST(NpzImages, FloatImagesAndKerasColumnLabels) {
  TempDir dir("npz_images");
  std::vector<float> x(kN * kH * kW), t(kTest * kH * kW, 0.5f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 9) - 4.0f;
  std::vector<uint8_t> y(kN, 1), yt(kTest, 0);
  meshtrain::io::write_npz(dir.file("f.npz"), {{"x_train", NpyType::f32, {kN, kH, kW}, x.data()},
                                               {"y_train", NpyType::u8, {kN, 1}, y.data()},
                                               {"x_test", NpyType::f32, {kTest, kH, kW}, t.data()},
                                               {"y_test", NpyType::u8, {kTest, 1}, yt.data()}});
  const ImageDataset ds = ImageDataset::open(dir.file("f.npz"));
  EXPECT_EQ(ds.channels(), 1);
  EXPECT_EQ(ds.pixels(Split::train), nullptr);
  double sum = 0, sq = 0;
  for (float v : x) sum += v;
  const double mean = sum / static_cast<double>(x.size());
  for (float v : x) sq += (v - mean) * (v - mean);
  EXPECT_FLOAT_EQ(ds.mean()[0], static_cast<float>(mean));
  EXPECT_FLOAT_EQ(ds.std_dev()[0], static_cast<float>(std::sqrt(sq / static_cast<double>(x.size()))));
  std::vector<float> img(kH * kW);
  int32_t label = -5;
  ds.batch(Split::train, DataOrder::sequential, 0, 0, 1, 0, 1, img.data(), &label, false);
  EXPECT_EQ(label, 1);
  EXPECT_EQ(img[4], (x[4] - ds.mean()[0]) / ds.std_dev()[0]);
}

TEST(NpzImages, RefusalsNameTheArray) {
  TempDir dir("npz_images");
  const Set s = make(false);
  const std::string p = dir.file("d.npz");
  meshtrain::io::write_npz(p, {{"x_train", NpyType::u8, {kN, kC, kH, kW}, s.x_train.data()},
                               {"y_train", NpyType::i64, {kN}, s.y_train.data()}});
  expect_data_error([&] { ImageDataset::open(p); }, {"has no array x_test", "it holds x_train, y_train", "keras"});
  // (N, 3, 5, 3): dims 1 and 3 could both be channels.
  std::vector<uint8_t> px(kN * 3 * 5 * 3, 1);
  meshtrain::io::write_npz(p, {{"x_train", NpyType::u8, {kN, 3, 5, 3}, px.data()},
                               {"y_train", NpyType::i64, {kN}, s.y_train.data()},
                               {"x_test", NpyType::u8, {kN, 3, 5, 3}, px.data()},
                               {"y_test", NpyType::i64, {kN}, s.y_train.data()}});
  expect_data_error([&] { ImageDataset::open(p); }, {"the array x_train", "(12, 3, 5, 3)", "--data-layout"});
  EXPECT_EQ(ImageDataset::open(p, ImageLayout::nhwc).width(), 5);
  EXPECT_EQ(ImageDataset::open(p, ImageLayout::nchw).width(), 3);
  // x_test of another sample shape or dtype.
  meshtrain::io::write_npz(p, {{"x_train", NpyType::u8, {kN, 3, 5, 3}, px.data()},
                               {"y_train", NpyType::i64, {kN}, s.y_train.data()},
                               {"x_test", NpyType::u8, {kN, 3, 3, 5}, px.data()},
                               {"y_test", NpyType::i64, {kN}, s.y_train.data()}});
  expect_data_error([&] { ImageDataset::open(p, ImageLayout::nchw); }, {"the array x_test", "(12, 3, 3, 5)", "(12, 3, 5, 3)"});
  // A .npy, not an .npz.
  meshtrain::io::NpyWrite one{"x", NpyType::u8, {2}, px.data()};
  const std::string npy = dir.file("x.npy");
  {
    std::FILE* f = std::fopen(npy.c_str(), "wb");
    const std::string bytes = meshtrain::io::encode_npy(one);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  expect_data_error([&] { ImageDataset::open(npy); }, {npy, "single .npy array", "x_train, y_train, x_test and y_test"});
}
