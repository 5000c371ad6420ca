// Tests for data/data: the three file layouts, the split, sequential batches against the file
// bytes (computed here independently, llm.c's loop), random batches (reproducible, independent
// of row slicing and of B, inside the split), and the error messages.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/data/data.h"
#include "meshtrain/tensor/rng.h"

using namespace meshtrain;
using namespace meshtrain::train;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test, removed afterwards.
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_data_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  std::string write_u16(const std::string& name, const std::vector<uint16_t>& tokens,
                        const std::vector<int32_t>& header = {}) {
    std::string bytes(header.size() * 4 + tokens.size() * 2, '\0');
    if (!header.empty()) std::memcpy(bytes.data(), header.data(), header.size() * 4);
    if (!tokens.empty()) std::memcpy(bytes.data() + header.size() * 4, tokens.data(), tokens.size() * 2);
    return write(name, bytes);
  }
  static std::vector<int32_t> llmc_header(int64_t count, int32_t version = 1) {
    std::vector<int32_t> h(256, 0);
    h[0] = 20240520;
    h[1] = version;
    h[2] = static_cast<int32_t>(count);
    return h;
  }

  fs::path dir_;
};

// Bytes 0..255 in a scrambled but fixed order, n of them.
std::string some_bytes(int64_t n) {
  std::string s(static_cast<size_t>(n), '\0');
  uint32_t x = 12345;
  for (auto& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

std::vector<uint16_t> some_tokens(int64_t n, uint16_t vocab) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  uint32_t x = 777;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<uint16_t>((x >> 8) % vocab);
  }
  return t;
}

struct Batch {
  std::vector<int32_t> x, y;
};

Batch get(const TokenDataset& ds, Split split, DataOrder order, uint64_t seed, int64_t step,
          int64_t B, int64_t T, int64_t r0, int64_t r1) {
  Batch b{std::vector<int32_t>((r1 - r0) * T), std::vector<int32_t>((r1 - r0) * T)};
  ds.batch(split, order, seed, step, B, T, r0, r1, b.x.data(), b.y.data());
  return b;
}

template <class F>
void expect_data_error(F&& f, const std::string& path, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no DataError for " << path;
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace

// ---- layouts and split ----

TEST_F(DataTest, TextFileIsBytesWithLastTenthAsValidation) {
  const std::string bytes = some_bytes(1000);
  const auto path = write("input.txt", bytes);
  const auto ds = TokenDataset::open(path);
  EXPECT_EQ(ds.format(), TokenDataset::Format::text);
  EXPECT_EQ(ds.vocab_size(), 256);
  EXPECT_EQ(ds.num_tokens(Split::train), 900);
  EXPECT_EQ(ds.num_tokens(Split::val), 100);
  for (int64_t i = 0; i < 900; ++i)
    ASSERT_EQ(ds.tokens(Split::train)[i], static_cast<unsigned char>(bytes[i]));
  for (int64_t i = 0; i < 100; ++i)
    ASSERT_EQ(ds.tokens(Split::val)[i], static_cast<unsigned char>(bytes[900 + i]));

  const auto ds2 = TokenDataset::open(path, 0.25);
  EXPECT_EQ(ds2.num_tokens(Split::train), 750);
  EXPECT_EQ(ds2.num_tokens(Split::val), 250);
  const auto ds0 = TokenDataset::open(path, 0.0);
  EXPECT_EQ(ds0.num_tokens(Split::val), 0);
  EXPECT_THROW(TokenDataset::open(path, 1.0), std::invalid_argument);
}

TEST_F(DataTest, NanogptBinIsRawUint16) {
  const auto tokens = some_tokens(2001, 50257);
  const auto path = write_u16("train.bin", tokens);
  const auto ds = TokenDataset::open(path, 0.1);
  EXPECT_EQ(ds.format(), TokenDataset::Format::nanogpt_bin);
  EXPECT_EQ(ds.num_tokens(Split::val), 200);
  EXPECT_EQ(ds.num_tokens(Split::train), 1801);
  uint16_t max = 0;
  for (auto t : tokens) max = std::max(max, t);
  EXPECT_EQ(ds.vocab_size(), max + 1);
  for (size_t i = 0; i < tokens.size(); ++i)
    ASSERT_EQ(ds.tokens(Split::train)[i], tokens[i]);  // val follows train in memory
}

TEST_F(DataTest, LlmcBinSkipsHeader) {
  const auto tokens = some_tokens(500, 300);
  const auto path = write_u16("tiny_shakespeare_val.bin", tokens, llmc_header(500));
  const auto ds = TokenDataset::open(path, 0.2);
  EXPECT_EQ(ds.format(), TokenDataset::Format::llmc_bin);
  EXPECT_EQ(ds.num_tokens(Split::train), 400);
  EXPECT_EQ(ds.num_tokens(Split::val), 100);
  EXPECT_LE(ds.vocab_size(), 300);
  EXPECT_EQ(ds.tokens(Split::train)[0], tokens[0]);
  EXPECT_EQ(ds.tokens(Split::val)[99], tokens[499]);
}

// ---- sequential order ----

TEST_F(DataTest, SequentialBatchesFollowLlmcReader) {
  // Training splits of 900, 897 (exactly 14 batches of 64 plus one token) and 896 (13 fit).
  for (int64_t file_size : {1000, 996, 995}) {
    SCOPED_TRACE(file_size);
    const std::string bytes = some_bytes(file_size);
    const auto ds = TokenDataset::open(write("input.txt", bytes), 0.1);
    const int64_t B = 4, T = 16, n = ds.num_tokens(Split::train);
    ASSERT_EQ(n, file_size - file_size / 10);
    // llm.c's dataloader loop, written out: read at pos, advance by B*T, wrap when the next
    // batch would need more than the remaining tokens.
    int64_t pos = 0;
    int wraps = 0;
    for (int64_t step = 0; step < 40; ++step) {
      const Batch b = get(ds, Split::train, DataOrder::sequential, 0, step, B, T, 0, B);
      for (int64_t i = 0; i < B * T; ++i) {
        ASSERT_EQ(b.x[i], static_cast<unsigned char>(bytes[pos + i])) << step << " " << i;
        ASSERT_EQ(b.y[i], static_cast<unsigned char>(bytes[pos + i + 1])) << step << " " << i;
      }
      pos += B * T;
      if (pos + B * T + 1 > n) {
        pos = 0;
        ++wraps;
      }
    }
    EXPECT_GE(wraps, 2);
  }
}

TEST_F(DataTest, SequentialValSplitAndSlices) {
  const auto tokens = some_tokens(3000, 50000);
  const auto ds = TokenDataset::open(write_u16("data.bin", tokens, llmc_header(3000)), 0.1);
  const int64_t B = 3, T = 20, val0 = 2700;
  for (int64_t step = 0; step < 10; ++step) {
    const int64_t pos = val0 + (step % ((300 - 1) / (B * T))) * B * T;
    const Batch full = get(ds, Split::val, DataOrder::sequential, 0, step, B, T, 0, B);
    const Batch tail = get(ds, Split::val, DataOrder::sequential, 0, step, B, T, 1, 3);
    for (int64_t i = 0; i < B * T; ++i) {
      ASSERT_EQ(full.x[i], tokens[pos + i]);
      ASSERT_EQ(full.y[i], tokens[pos + i + 1]);
    }
    for (int64_t i = 0; i < 2 * T; ++i) ASSERT_EQ(tail.x[i], full.x[T + i]);
  }
}

// ---- random order ----

TEST_F(DataTest, RandomBatchesReproducibleAndSliceInvariant) {
  const auto ds = TokenDataset::open(write("input.txt", some_bytes(5000)), 0.1);
  const int64_t B = 8, T = 32;
  const Batch a = get(ds, Split::train, DataOrder::random, 7, 3, B, T, 0, B);
  const Batch again = get(ds, Split::train, DataOrder::random, 7, 3, B, T, 0, B);
  EXPECT_EQ(a.x, again.x);
  EXPECT_EQ(a.y, again.y);
  // Rows [0, 3) + [3, 8) equal rows [0, 8).
  const Batch lo = get(ds, Split::train, DataOrder::random, 7, 3, B, T, 0, 3);
  const Batch hi = get(ds, Split::train, DataOrder::random, 7, 3, B, T, 3, B);
  std::vector<int32_t> x = lo.x, y = lo.y;
  x.insert(x.end(), hi.x.begin(), hi.x.end());
  y.insert(y.end(), hi.y.begin(), hi.y.end());
  EXPECT_EQ(x, a.x);
  EXPECT_EQ(y, a.y);
  // Row i does not depend on B.
  const Batch wide = get(ds, Split::train, DataOrder::random, 7, 3, 2 * B, T, 0, 2 * B);
  EXPECT_TRUE(std::equal(a.x.begin(), a.x.end(), wide.x.begin()));
  // Targets are tokens shifted by one.
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t + 1 < T; ++t) ASSERT_EQ(a.y[r * T + t], a.x[r * T + t + 1]);
  // Other steps, seeds and splits give other batches.
  EXPECT_NE(get(ds, Split::train, DataOrder::random, 7, 4, B, T, 0, B).x, a.x);
  EXPECT_NE(get(ds, Split::train, DataOrder::random, 8, 3, B, T, 0, B).x, a.x);
  EXPECT_NE(get(ds, Split::val, DataOrder::random, 7, 3, B, T, 0, B).x, a.x);
}

TEST_F(DataTest, RandomWindowsFollowPhiloxAndStayInSplit) {
  // Training bytes are all < 128 and validation bytes all >= 128, so a window that crossed
  // the split boundary would show.
  std::string bytes = some_bytes(2000);
  for (int i = 0; i < 2000; ++i) bytes[i] = static_cast<char>(i < 1500 ? bytes[i] & 0x7f : bytes[i] | 0x80);
  const auto ds = TokenDataset::open(write("split.txt", bytes), 0.25);
  ASSERT_EQ(ds.num_tokens(Split::train), 1500);
  const int64_t B = 16, T = 64;
  for (int64_t step = 0; step < 50; ++step) {
    for (Split split : {Split::train, Split::val}) {
      const Batch b = get(ds, split, DataOrder::random, 42, step, B, T, 0, B);
      const int64_t n = ds.num_tokens(split);
      const int64_t base = split == Split::train ? 0 : 1500;
      const uint64_t key = stream_key(42, split == Split::train ? "data.train" : "data.val");
      for (int64_t r = 0; r < B; ++r) {
        const auto start = static_cast<int64_t>(philox_u64(key, (uint64_t(step) << 24) + r) % uint64_t(n - T));
        ASSERT_LE(start + T, n - 1);
        for (int64_t t = 0; t < T; ++t) {
          ASSERT_EQ(b.x[r * T + t], static_cast<unsigned char>(bytes[base + start + t]));
          ASSERT_EQ(b.y[r * T + t], static_cast<unsigned char>(bytes[base + start + t + 1]));
          ASSERT_EQ(b.x[r * T + t] >= 128, split == Split::val);
          ASSERT_EQ(b.y[r * T + t] >= 128, split == Split::val);
        }
      }
    }
  }
}

// ---- errors ----

TEST_F(DataTest, BadFilesThrowDataErrorNamingTheFile) {
  const std::string missing = (dir_ / "nope.txt").string();
  expect_data_error([&] { TokenDataset::open(missing); }, missing, "does not exist");
  const auto empty = write("empty.txt", "");
  expect_data_error([&] { TokenDataset::open(empty); }, empty, "empty");
  const auto short_text = write("short.txt", "abcdefghi");  // 9 bytes: val split gets none
  expect_data_error([&] { TokenDataset::open(short_text); }, short_text, "too short");
  const auto medium = write("medium.txt", some_bytes(200));
  expect_data_error([&] { TokenDataset::open(medium, 0.1, 64); }, medium, "too short");
  const auto odd = write("odd.bin", "abc");
  expect_data_error([&] { TokenDataset::open(odd); }, odd, "odd size");
  const auto v2 = write_u16("v2.bin", some_tokens(100, 10), llmc_header(100, 2));
  expect_data_error([&] { TokenDataset::open(v2); }, v2, "version 2");
  const auto bad_count = write_u16("count.bin", some_tokens(100, 10), llmc_header(150));
  expect_data_error([&] { TokenDataset::open(bad_count); }, bad_count, "malformed llm.c header");
  std::vector<int32_t> cut = llmc_header(10);
  cut.resize(10);
  const auto truncated = write_u16("cut.bin", {}, cut);
  expect_data_error([&] { TokenDataset::open(truncated); }, truncated, "1024-byte header");

  // A split too short for the requested batch.
  const auto ds = TokenDataset::open(medium, 0.1);  // 180 train, 20 val tokens
  std::vector<int32_t> x(64), y(64);
  expect_data_error([&] { ds.batch(Split::val, DataOrder::random, 0, 0, 1, 32, 0, 1, x.data(), y.data()); },
                    medium, "val split");
  expect_data_error([&] { ds.batch(Split::train, DataOrder::sequential, 0, 0, 2, 90, 0, 2, x.data(), y.data()); },
                    medium, "B*T+1");
  EXPECT_THROW(ds.batch(Split::train, DataOrder::random, 0, 0, 2, 8, 1, 3, x.data(), y.data()),
               std::invalid_argument);
  EXPECT_THROW(ds.batch(Split::train, DataOrder::random, 0, -1, 2, 8, 0, 2, x.data(), y.data()),
               std::invalid_argument);
}

TEST(DataOrderParse, AcceptsTheTwoNames) {
  EXPECT_EQ(parse_data_order("random"), DataOrder::random);
  EXPECT_EQ(parse_data_order("sequential"), DataOrder::sequential);
  EXPECT_STREQ(to_string(DataOrder::sequential), "sequential");
  try {
    parse_data_order("shuffled");
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'shuffled'"), std::string::npos);
  }
}
