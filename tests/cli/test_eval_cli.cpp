// `meshtrain eval`: a classifier checkpoint's test accuracy equals what training measured on the
// same test images at the same step, and the confusion matrix counts every test image once, by
// its true class. The images are a small synthetic IDX set (tests/data/idx_files.h).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "data/idx_files.h"
#include "temp_dir.h"

using meshtrain::testing::run_cli;

TEST(EvalCli, AccuracyAndConfusionMatrixOfATrainedClassifier) {
  meshtrain::testing::TempDir d("eval_cli");
  const std::vector<uint8_t> test_labels = meshtrain::testing::write_bar_image_set(d.path().string(), 256, 90, false);
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
