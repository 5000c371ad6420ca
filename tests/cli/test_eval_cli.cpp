// `meshtrain eval`: a classifier checkpoint's test accuracy equals what training measured on the
// same test images at the same step, and the confusion matrix counts every test image once, by
// its true class. The images are a small synthetic IDX set (tests/train/idx_files.h).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "temp_dir.h"
#include "train/idx_files.h"

using meshtrain::testing::run_cli;

TEST(EvalCli, AccuracyAndConfusionMatrixOfATrainedClassifier) {
  meshtrain::testing::TempDir d("eval_cli");
  auto images = [](int64_t n, uint32_t salt, std::vector<uint8_t>& labels) {
    std::vector<uint8_t> px(n * 28 * 28);
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
  };
  std::vector<uint8_t> train_labels, test_labels;
  const auto train_px = images(256, 1, train_labels), test_px = images(90, 5, test_labels);
  using meshtrain::testing::idx_bytes, meshtrain::testing::write_plain;
  write_plain(d.file("train-images-idx3-ubyte"), idx_bytes(0x803, {256, 28, 28}, train_px));
  write_plain(d.file("train-labels-idx1-ubyte"), idx_bytes(0x801, {256}, train_labels));
  write_plain(d.file("t10k-images-idx3-ubyte"), idx_bytes(0x803, {90, 28, 28}, test_px));
  write_plain(d.file("t10k-labels-idx1-ubyte"), idx_bytes(0x801, {90}, test_labels));
  const std::string data = d.path().string(), ck = d.file("ck"), metrics = d.file("m.jsonl");
  auto t = run_cli("train --model cnn-small --data " + data + " --steps 12 --batch 16 --eval-every 12 --eval-batches 100 "
                   "--lr 0.003 --warmup 2 --threads 1 --quiet --checkpoint-dir " + ck + " --metrics " + metrics);
  ASSERT_EQ(t.code, 0) << t.output;
  std::ifstream f(metrics);
  std::string line, last;
  while (std::getline(f, line)) last = line;
  const auto j = nlohmann::json::parse(last);
  ASSERT_TRUE(j.contains("val_accuracy")) << last;
  const double trained = j["val_accuracy"].get<double>();

  auto e = run_cli("eval --checkpoint " + ck + " --data " + data + " --batch 32 --threads 1");
  ASSERT_EQ(e.code, 0) << e.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(e.output, m, std::regex("on the 90 test images of .*: accuracy ([0-9.]+)%"))) << e.output;
  EXPECT_NEAR(std::stod(m[1]), 100.0 * trained, 0.006) << e.output;
  // The matrix: 10 rows after its header, each summing to that class's test images.
  std::istringstream in(e.output.substr(e.output.find("confusion matrix")));
  std::getline(in, line), std::getline(in, line);  // title, column header
  int64_t diagonal = 0, total = 0;
  for (int c = 0; c < 10; ++c) {
    ASSERT_TRUE(std::getline(in, line)) << e.output;
    std::istringstream row(line);
    int64_t cls = -1, sum = 0, v = 0;
    row >> cls;
    EXPECT_EQ(cls, c);
    for (int p = 0; p < 10 && row >> v; ++p) sum += v, diagonal += p == c ? v : 0;
    int64_t want = 0;
    for (uint8_t l : test_labels) want += l == c;
    EXPECT_EQ(sum, want) << "class " << c;
    total += sum;
  }
  EXPECT_EQ(total, 90);
  EXPECT_NEAR(100.0 * static_cast<double>(diagonal) / 90.0, std::stod(m[1]), 0.006);

  auto gpt = run_cli("eval --checkpoint " + d.file("missing"));
  EXPECT_EQ(gpt.code, 2) << gpt.output;
}
