// Training on a user's own NumPy arrays (data/images.h, data/data.h): an .npz written here by
// io::write_npz (no Python needed) with images of 3 x 32 x 32 (NCHW, uint8 and float32) and of
// 1 x 28 x 28 (N x H x W) trains a small conv-bn-relu-pool graph written here; dp 2 gives one
// rank's curve within 1e-5; the same images as NHWC give the NCHW losses exactly; a 1-d .npy
// of tokens trains a token model. Every malformed file exits 2 naming the array.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "meshtrain/io/npy.h"
#include "temp_dir.h"

using meshtrain::io::NpyType;
using meshtrain::io::NpyWrite;
using meshtrain::testing::run_cli;

namespace {

// A learnable set: class c is a bright band of rows at c * H / 10 over noise, in every channel
// (channel k a little brighter), so a few steps lower the loss.
struct Images {
  int64_t n = 0, c = 0, h = 0, w = 0;
  std::vector<uint8_t> nchw;  // (n, c, h, w)
  std::vector<int64_t> labels;
  Images(int64_t n_, int64_t c_, int64_t h_, int64_t w_, uint32_t seed) : n(n_), c(c_), h(h_), w(w_) {
    uint32_t s = seed;
    auto rnd = [&s] { return (s = s * 1664525u + 1013904223u) >> 24; };
    nchw.resize(static_cast<size_t>(n * c * h * w));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t label = rnd() % 10;
      labels.push_back(label);
      for (int64_t k = 0; k < c; ++k)
        for (int64_t y = 0; y < h; ++y)
          for (int64_t x = 0; x < w; ++x) {
            const bool band = y >= label * h / 10 && y < label * h / 10 + 2;
            nchw[static_cast<size_t>(((i * c + k) * h + y) * w + x)] =
                static_cast<uint8_t>(rnd() % 60 + (band ? 150 : 0) + 10 * k);
          }
    }
  }
  std::vector<uint8_t> nhwc() const {
    std::vector<uint8_t> out(nchw.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < c; ++k)
        for (int64_t y = 0; y < h; ++y)
          for (int64_t x = 0; x < w; ++x)
            out[static_cast<size_t>(((i * h + y) * w + x) * c + k)] = nchw[static_cast<size_t>(((i * c + k) * h + y) * w + x)];
    return out;
  }
  std::vector<float> as_float() const {
    std::vector<float> out(nchw.size());
    for (size_t i = 0; i < nchw.size(); ++i) out[i] = static_cast<float>(nchw[i]) / 255.0f;
    return out;
  }
};

class NpzCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = std::make_unique<meshtrain::testing::TempDir>("npz_cli"); }

  std::string file(const std::string& name) const { return dir_->file(name); }

  // A conv-bn-relu-pool x 2, flatten, linear graph for images c x h x w.
  std::string model(int64_t c, int64_t h, int64_t w, int64_t classes = 10) const {
    nlohmann::json j = {{"name", "npz-cnn"},
                        {"input", {{"image", {c, h, w}}, {"classes", classes}}},
                        {"layers",
                         {{{"name", "conv1"}, {"op", "conv2d"}, {"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}, {"bias", false}},
                          {{"name", "bn1"}, {"op", "batchnorm2d"}},
                          {{"name", "relu1"}, {"op", "relu"}},
                          {{"name", "pool1"}, {"op", "maxpool2d"}, {"kernel_size", 2}},
                          {{"name", "conv2"}, {"op", "conv2d"}, {"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}},
                          {{"name", "relu2"}, {"op", "relu"}},
                          {{"name", "pool2"}, {"op", "maxpool2d"}, {"kernel_size", 2}},
                          {{"name", "flat"}, {"op", "flatten"}},
                          {{"name", "fc"}, {"op", "linear"}, {"out_features", classes}}}}};
    std::string path = file("model_");
    for (int64_t v : {c, h, w, classes}) {
      path += std::to_string(v);
      path += "_";
    }
    path += ".json";
    std::ofstream(path) << j.dump(1);
    return path;
  }

  // x/y arrays of a train and a test set as given (4-d shape or 3-d).
  static void write(const std::string& path, NpyType type, const void* x_train, std::vector<int64_t> x_train_shape,
                    const void* y_train, std::vector<int64_t> y_train_shape, const void* x_test,
                    std::vector<int64_t> x_test_shape, const void* y_test, std::vector<int64_t> y_test_shape,
                    NpyType label_type = NpyType::i64) {
    meshtrain::io::write_npz(path, {{"x_train", type, std::move(x_train_shape), x_train},
                                    {"y_train", label_type, std::move(y_train_shape), y_train},
                                    {"x_test", type, std::move(x_test_shape), x_test},
                                    {"y_test", label_type, std::move(y_test_shape), y_test}});
  }

  // The NCHW (or, for one channel, N x H x W) uint8 file of `train` and `test`.
  std::string write_set(const std::string& name, const Images& train, const Images& test, bool three_d = false) {
    const std::string path = file(name);
    auto shape = [&](const Images& s) {
      return three_d ? std::vector<int64_t>{s.n, s.h, s.w} : std::vector<int64_t>{s.n, s.c, s.h, s.w};
    };
    write(path, NpyType::u8, train.nchw.data(), shape(train), train.labels.data(), {train.n}, test.nchw.data(),
          shape(test), test.labels.data(), {test.n});
    return path;
  }

  // The per-step losses of a run (`output`: what it printed).
  std::vector<double> curve(const std::string& model_path, const std::string& data, const std::string& flags, int steps,
                            std::string* output = nullptr) {
    std::string name = "m";  // built with += (GCC 12 warns falsely about "m" + std::to_string)
    name += std::to_string(++runs_);
    name += ".jsonl";
    const std::string metrics = file(name);
    std::string args = "train --model " + model_path + " --data " + data + " --steps " + std::to_string(steps);
    args += " --batch 16 --microbatches 2 --threads 1 --warmup 2 --lr 0.003 --eval-every 0 --eval-batches 1 --log-every 1";
    args += " --metrics " + metrics + " " + flags;
    const auto r = run_cli(args, 600);
    EXPECT_EQ(r.code, 0) << args << "\n" << r.output;
    if (output) *output = r.output;
    std::vector<double> losses;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    }
    EXPECT_EQ(losses.size(), static_cast<size_t>(steps)) << args;
    return losses;
  }

  // A refused run: exit 2, and the message holds every part.
  void refused(const std::string& args, const std::vector<std::string>& parts) {
    const auto r = run_cli(args + " --steps 1 --batch 8 --quiet --eval-every 0 --eval-batches 1");
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    for (const std::string& p : parts) EXPECT_NE(r.output.find(p), std::string::npos) << args << "\nlacks: " << p << "\n" << r.output;
  }

  static void expect_falls(const std::vector<double>& losses) {
    ASSERT_GE(losses.size(), 4u);
    for (double l : losses) EXPECT_TRUE(std::isfinite(l));
    EXPECT_LT((losses[losses.size() - 1] + losses[losses.size() - 2]) / 2, losses[0]);
  }

  std::unique_ptr<meshtrain::testing::TempDir> dir_;
  int runs_ = 0;
};

}  // namespace

TEST_F(NpzCli, ColourImagesNchwTrainAndDp2GivesOneRanksCurve) {
  const Images train(256, 3, 32, 32, 1), test(40, 3, 32, 32, 2);
  const std::string data = write_set("colour.npz", train, test);
  const std::string m = model(3, 32, 32);
  std::string out;
  const std::vector<double> one = curve(m, data, "", 8, &out);
  expect_falls(one);
  EXPECT_NE(out.find("data: x_train 256 x 3 x 32 x 32 uint8 (NCHW), mean ["), std::string::npos) << out;
  EXPECT_NE(out.find("; x_test 40"), std::string::npos) << out;
  const std::vector<double> dp2 = curve(m, data, "--dp 2", 8);
  ASSERT_EQ(dp2.size(), one.size());
  for (size_t s = 0; s < one.size(); ++s) EXPECT_LE(std::abs(dp2[s] - one[s]), 1e-5 * std::abs(one[s])) << "step " << s + 1;
}

TEST_F(NpzCli, NhwcAndNchwOfTheSameImagesGiveIdenticalLosses) {
  const Images train(64, 3, 32, 32, 3), test(16, 3, 32, 32, 4);
  const std::string nchw = write_set("nchw.npz", train, test);
  const std::vector<uint8_t> a = train.nhwc(), b = test.nhwc();
  const std::string nhwc = file("nhwc.npz");
  write(nhwc, NpyType::u8, a.data(), {64, 32, 32, 3}, train.labels.data(), {64}, b.data(), {16, 32, 32, 3},
        test.labels.data(), {16});
  const std::string m = model(3, 32, 32);
  std::string out;
  const std::vector<double> x = curve(m, nchw, "--data-order sequential", 4);
  const std::vector<double> y = curve(m, nhwc, "--data-order sequential", 4, &out);
  EXPECT_EQ(x, y);
  EXPECT_NE(out.find("uint8 (NHWC)"), std::string::npos) << out;
  // The layout said outright agrees; the wrong one is refused with the way out.
  EXPECT_EQ(curve(m, nhwc, "--data-order sequential --data-layout nhwc", 4), x);
  refused("train --model " + m + " --data " + nhwc + " --data-layout nchw",
          {"arrays x_train and x_test, read as NCHW", "(32, 32, 3)", "(3, 32, 32)", "--data-layout nhwc"});
}

TEST_F(NpzCli, FloatImagesTrainAsTheirUint8Originals) {
  const Images train(64, 3, 32, 32, 5), test(16, 3, 32, 32, 6);
  const std::vector<float> a = train.as_float(), b = test.as_float();
  const std::string data = file("float.npz");
  write(data, NpyType::f32, a.data(), {64, 3, 32, 32}, train.labels.data(), {64}, b.data(), {16, 3, 32, 32},
        test.labels.data(), {16});
  std::string out;
  const std::vector<double> f = curve(model(3, 32, 32), data, "", 4, &out);
  for (double l : f) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NE(out.find("data: x_train 64 x 3 x 32 x 32 float32 (NCHW)"), std::string::npos) << out;
  // x/255 of the same pixels: the same statistics to float round-off, so the same curve closely.
  const std::vector<double> u = curve(model(3, 32, 32), write_set("u8.npz", train, test), "", 4);
  for (size_t s = 0; s < f.size(); ++s) EXPECT_NEAR(f[s], u[s], 1e-4 * std::abs(u[s])) << "step " << s + 1;
}

TEST_F(NpzCli, GreyImagesAsNxHxWTrainAndDp2GivesOneRanksCurve) {
  const Images train(256, 1, 28, 28, 7), test(30, 1, 28, 28, 8);
  const std::string data = write_set("grey.npz", train, test, /*three_d=*/true);
  const std::string m = model(1, 28, 28);
  std::string out;
  const std::vector<double> one = curve(m, data, "--augment", 8, &out);
  expect_falls(one);
  EXPECT_NE(out.find("data: x_train 256 x 1 x 28 x 28 uint8 (NHW)"), std::string::npos) << out;
  const std::vector<double> dp2 = curve(m, data, "--augment --dp 2", 8);
  ASSERT_EQ(dp2.size(), one.size());
  for (size_t s = 0; s < one.size(); ++s) EXPECT_LE(std::abs(dp2[s] - one[s]), 1e-5 * std::abs(one[s])) << "step " << s + 1;
}

TEST_F(NpzCli, EveryMalformedFileExits2NamingTheArray) {
  const Images train(20, 1, 28, 28, 9), test(10, 1, 28, 28, 10);
  const std::string m = model(1, 28, 28);
  const std::string run = "train --model " + m + " --data ";
  const std::vector<int64_t> tr{20, 28, 28}, te{10, 28, 28};
  const void* xa = train.nchw.data();
  const void* xb = test.nchw.data();
  const void* ya = train.labels.data();
  const void* yb = test.labels.data();

  const std::string missing = file("missing.npz");
  meshtrain::io::write_npz(missing, {{"x_train", NpyType::u8, tr, xa},
                                     {"y_train", NpyType::i64, {20}, ya},
                                     {"x_test", NpyType::u8, te, xb}});
  refused(run + missing, {"has no array y_test", "x_train, y_train, x_test", "x_train, y_train, x_test and y_test"});

  const std::vector<int32_t> ints(20 * 28 * 28, 1);
  const std::string dtype = file("dtype.npz");
  write(dtype, NpyType::i32, ints.data(), tr, ya, {20}, ints.data(), {10, 28, 28}, yb, {10});
  refused(run + dtype, {"the array x_train of " + dtype + " is int32", "uint8 (0..255) or float32"});

  const std::vector<float> labels_f(20, 1.0f);
  const std::string flabels = file("flabels.npz");
  write(flabels, NpyType::u8, xa, tr, labels_f.data(), {20}, xb, te, labels_f.data(), {10}, NpyType::f32);
  refused(run + flabels, {"the array y_train", "is float32", "integer class indices"});

  std::vector<int64_t> bad_labels = train.labels;
  bad_labels[7] = 10;
  const std::string range = file("range.npz");
  write(range, NpyType::u8, xa, tr, bad_labels.data(), {20}, xb, te, yb, {10});
  refused(run + range, {"the array y_train", "the label 10 at row 7", "the 10 classes of npz-cnn"});
  bad_labels[7] = -3;
  write(range, NpyType::u8, xa, tr, bad_labels.data(), {20}, xb, te, yb, {10});
  refused(run + range, {"the array y_train", "the label -3 at row 7"});

  const std::string size = file("size.npz");
  write(size, NpyType::u8, xa, {20, 28, 14}, ya, {20}, xb, {10, 28, 14}, yb, {10});
  refused(run + size, {"arrays x_train and x_test", "(1, 28, 14)", "npz-cnn takes (1, 28, 28)"});
  refused("train --model " + model(3, 28, 28) + " --data " + size, {"arrays x_train and x_test", "(3, 28, 28)"});

  const std::string empty = file("empty.npz");
  write(empty, NpyType::u8, xa, tr, ya, {20}, nullptr, {0, 28, 28}, nullptr, {0});
  refused(run + empty, {"the array x_test", "holds no images", "(0, 28, 28)"});

  const std::string count = file("count.npz");
  write(count, NpyType::u8, xa, tr, ya, {19}, xb, te, yb, {10});
  refused(run + count, {"the array y_train", "(19,)", "x_train holds 20 images", "one label per image"});

  const std::string text = file("data.npz");
  std::ofstream(text) << "x_train,y_train\n1,2\n";
  refused(run + text, {text, "not NumPy's", "x_train, y_train, x_test and y_test"});
  const std::string cut = file("cut.npz");
  {
    std::ifstream in(missing, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, 100);
  }
  refused(run + cut, {cut, "array x_train", "truncated"});

  const std::vector<uint8_t> px(20 * 2 * 8 * 2, 3);
  const std::string ambiguous = file("ambiguous.npz");
  write(ambiguous, NpyType::u8, px.data(), {20, 2, 8, 2}, ya, {20}, px.data(), {10, 2, 8, 2}, yb, {10});
  refused(run + ambiguous, {"the array x_train", "(20, 2, 8, 2)", "could both be channels", "--data-layout"});
  refused(run + ambiguous + " --data-layout nwhc", {"--data-layout must be nhwc", "'nwhc'"});
}

TEST_F(NpzCli, TokenArraysTrainATokenModel) {
  // gpt-tiny's vocabulary is 256: bytes of a text as uint16.
  std::vector<uint16_t> tokens;
  const std::string words = "the ranks sum their gradients and each stage sends its output. ";
  for (int i = 0; i < 400; ++i)
    for (char ch : words) tokens.push_back(static_cast<uint16_t>(static_cast<unsigned char>(ch)));
  const std::string npy = file("tokens.npy");
  {
    meshtrain::io::NpyWrite a{"tokens", NpyType::u16, {static_cast<int64_t>(tokens.size())}, tokens.data()};
    std::ofstream(npy, std::ios::binary) << meshtrain::io::encode_npy(a);
  }
  const std::string metrics = file("tok.jsonl");
  const auto r = run_cli("train --model gpt-tiny --data " + npy +
                         " --steps 3 --batch 4 --seq 32 --threads 1 --eval-every 0 --eval-batches 1 --quiet --metrics " +
                         metrics);
  EXPECT_EQ(r.code, 0) << r.output;
  int lines = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) lines += nlohmann::json::parse(line).contains("loss");
  EXPECT_EQ(lines, 3);

  const std::string tok = " --steps 1 --batch 4 --seq 32 --quiet --eval-every 0 --eval-batches 1";
  std::vector<int32_t> big(tokens.begin(), tokens.end());
  big[1234] = 300;
  meshtrain::io::NpyWrite b{"tokens", NpyType::i32, {static_cast<int64_t>(big.size())}, big.data()};
  std::ofstream(npy, std::ios::binary) << meshtrain::io::encode_npy(b);
  auto r2 = run_cli("train --model gpt-tiny --data " + npy + tok);
  EXPECT_EQ(r2.code, 2) << r2.output;
  EXPECT_NE(r2.output.find("the first id beyond it: 300 at index 1234 of the array"), std::string::npos) << r2.output;
  big[1234] = 70000;
  std::ofstream(npy, std::ios::binary) << meshtrain::io::encode_npy(b);
  r2 = run_cli("train --model gpt-tiny --data " + npy + tok);
  EXPECT_EQ(r2.code, 2) << r2.output;
  EXPECT_NE(r2.output.find("the array tokens holds 70000 at index 1234"), std::string::npos) << r2.output;
  meshtrain::io::NpyWrite c{"tokens", NpyType::i32, {2, static_cast<int64_t>(big.size()) / 2}, big.data()};
  std::ofstream(npy, std::ios::binary) << meshtrain::io::encode_npy(c);
  r2 = run_cli("train --model gpt-tiny --data " + npy + tok);
  EXPECT_EQ(r2.code, 2) << r2.output;
  EXPECT_NE(r2.output.find("the array tokens has the shape (2, "), std::string::npos) << r2.output;
  const std::string npz = file("tokens.npz");
  meshtrain::io::write_npz(npz, {{"tokens", NpyType::u16, {static_cast<int64_t>(tokens.size())}, tokens.data()}});
  r2 = run_cli("train --model gpt-tiny --data " + npz + tok);
  EXPECT_EQ(r2.code, 2) << r2.output;
  EXPECT_NE(r2.output.find("is an .npz archive of several arrays"), std::string::npos) << r2.output;
  r2 = run_cli("train --model gpt-tiny --data " + npy + tok + " --data-layout nhwc");
  EXPECT_EQ(r2.code, 2) << r2.output;
  EXPECT_NE(r2.output.find("--data-layout applies to image models"), std::string::npos) << r2.output;
}
