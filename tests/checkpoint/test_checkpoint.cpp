// Tests for checkpoint/safetensors and checkpoint/checkpoint: round trips, a safetensors file built here
// by hand (F32, F16, BF16), malformed files, checkpoint corruption (every file truncated or
// with a flipped byte), `latest`, replacement, pruning and leftover .tmp folders.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/nn/param.h"
#include "meshtrain/tensor/rng.h"

using namespace meshtrain;
using namespace meshtrain::train;
namespace fs = std::filesystem;

namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_ckpt_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Tensor random_tensor(Shape shape, const std::string& name, uint64_t seed = 1) {
  Tensor t(std::move(shape));
  fill_normal(t.data(), t.numel(), stream_key(seed, name), 0, 1.0f);
  return t;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         (a.numel() == 0 || std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0);
}

// A safetensors file: 8-byte length, the header text as given, then the data.
std::string st_file(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <class F>
void expect_checkpoint_error(F&& f, const std::string& part1, const std::string& part2 = "") {
  try {
    f();
    ADD_FAILURE() << "no CheckpointError (" << part1 << ")";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(part1), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(part2), std::string::npos) << e.what();
  }
}

CheckpointData sample(int64_t step, uint64_t seed = 1) {
  CheckpointData d;
  d.step = step;
  d.config = {{"model", "gpt-tiny"}, {"lr", 3e-4}, {"dp", 2}, {"tp", 1}};
  d.state = {{"adam_step", step}, {"data_position", 12345}, {"rng", "philox:7"},
             {"loss_history", {5.5, 4.25, 3.125 + static_cast<double>(seed)}}};
  for (const char* n : {"wte.weight", "h.0.attn.c_attn.weight", "ln_f.bias"}) {
    const Shape s = std::string(n) == "ln_f.bias" ? Shape{16} : Shape{16, 48};
    d.model.emplace_back(n, random_tensor(s, n, seed));
    d.optimizer.emplace_back(std::string("exp_avg.") + n, random_tensor(s, "m" + std::string(n), seed));
    d.optimizer.emplace_back(std::string("exp_avg_sq.") + n, random_tensor(s, "v" + std::string(n), seed));
  }
  return d;
}

void expect_same(const std::vector<std::pair<std::string, Tensor>>& got,
                 std::vector<std::pair<std::string, Tensor>> want) {
  std::sort(want.begin(), want.end(), [](auto& a, auto& b) { return a.first < b.first; });
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(same(got[i].second, want[i].second)) << want[i].first;
  }
}

}  // namespace

// ---- safetensors ----

TEST_F(CheckpointTest, SafetensorsRoundTrip) {
  std::vector<std::pair<std::string, Tensor>> ts;
  ts.emplace_back("b", random_tensor({3, 4}, "b"));
  ts.emplace_back("a.weight", random_tensor({5}, "a"));
  ts.emplace_back("scalar", Tensor::from({}, {2.5f}));
  ts.emplace_back("empty", Tensor({0, 3}));
  const auto p = path("t.safetensors");
  const FileDigest d = write_safetensors(p, ts, {{"format", "pt"}, {"note", "hi"}});
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(d.size, static_cast<int64_t>(fs::file_size(p)));
  EXPECT_EQ(file_digest(p).crc32, d.crc32);
  const std::string bytes = read_bytes(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  expect_same(read_safetensors(p), ts);
  const auto meta = read_safetensors_metadata(p);
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(meta.at("note"), "hi");
  EXPECT_THROW(write_safetensors(p, {{"x", &ts[0].second}, {"x", &ts[1].second}}), std::invalid_argument);
}

TEST_F(CheckpointTest, SafetensorsReadsHandWrittenF32F16BF16) {
  const std::vector<float> f32 = {1.5f, -2.0f, 0.25f, 1e-3f};
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF};  // 1, -2, .5, 2^-24, 65504
  const std::vector<uint16_t> bf16 = {0x3F80, 0x4049, 0xC2F7};  // 1, 3.140625, -123.5
  const std::vector<double> f64 = {0.1, -7.0};
  nlohmann::json h;
  // Data laid out in an order other than by name: f16 first.
  h["h"] = {{"dtype", "F16"}, {"shape", {5}}, {"data_offsets", {0, 10}}};
  h["a"] = {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {10, 26}}};
  h["bf"] = {{"dtype", "BF16"}, {"shape", {3, 1}}, {"data_offsets", {26, 32}}};
  h["d"] = {{"dtype", "F64"}, {"shape", {2}}, {"data_offsets", {32, 48}}};
  h["__metadata__"] = {{"format", "pt"}};
  const auto p = path("hand.safetensors");
  write_bytes(p, st_file(h.dump(), raw(f16) + raw(f32) + raw(bf16) + raw(f64)));  // header unpadded

  const auto ts = read_safetensors(p);
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_EQ(ts[0].first, "a");
  EXPECT_EQ(ts[0].second.shape(), (Shape{2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ts[0].second[i], f32[i]);
  EXPECT_EQ(ts[1].first, "bf");
  EXPECT_EQ(ts[1].second.shape(), (Shape{3, 1}));
  EXPECT_EQ(ts[1].second[0], 1.0f);
  EXPECT_EQ(ts[1].second[1], 3.140625f);
  EXPECT_EQ(ts[1].second[2], -123.5f);
  EXPECT_EQ(ts[2].first, "d");
  EXPECT_EQ(ts[2].second[0], 0.1f);
  EXPECT_EQ(ts[3].first, "h");
  EXPECT_EQ(ts[3].second[0], 1.0f);
  EXPECT_EQ(ts[3].second[1], -2.0f);
  EXPECT_EQ(ts[3].second[2], 0.5f);
  EXPECT_EQ(ts[3].second[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(ts[3].second[4], 65504.0f);
  EXPECT_EQ(read_safetensors_metadata(p).at("format"), "pt");
  EXPECT_EQ(read_safetensors_header(p)[3].dtype, "F16");
}

TEST_F(CheckpointTest, SafetensorsRefusesMalformedFiles) {
  const std::vector<float> v = {1, 2, 3, 4};
  auto header = [](const std::string& dtype, nlohmann::json shape, int64_t b, int64_t e) {
    nlohmann::json h;
    h["x"] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
    return h;
  };
  const std::string good = st_file(header("F32", {4}, 0, 16).dump(), raw(v));
  write_bytes(path("good.safetensors"), good);
  ASSERT_EQ(read_safetensors(path("good.safetensors")).size(), 1u);

  nlohmann::json two = header("F32", {2, 2}, 0, 16);
  two["y"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}};
  nlohmann::json bad_meta = header("F32", {4}, 0, 16);
  bad_meta["__metadata__"] = {{"n", 3}};
  std::string huge_len = good;
  const uint64_t big = 1 << 20;
  std::memcpy(huge_len.data(), &big, 8);

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated data", good.substr(0, good.size() - 4)},
      {"header length past the end", huge_len},
      {"too short", std::string("\x05\x00", 2)},
      {"offsets outside", st_file(header("F32", {4}, 0, 20).dump(), raw(v))},
      {"size mismatch", st_file(header("F32", {2, 2}, 0, 12).dump(), raw(v))},
      {"reversed offsets", st_file(header("F32", {0}, 8, 4).dump(), raw(v))},
      {"overlap", st_file(two.dump(), raw(v))},
      {"bad json", st_file("{\"x\": {\"dtype\": \"F32\",", raw(v))},
      {"not an object", st_file("[1, 2]", raw(v))},
      {"unknown dtype", st_file(header("I64", {2}, 0, 16).dump(), raw(v))},
      {"negative dim", st_file(header("F32", {-4}, 0, 16).dump(), raw(v))},
      {"non-string metadata", st_file(bad_meta.dump(), raw(v))},
  };
  for (const auto& [what, bytes] : cases) {
    SCOPED_TRACE(what);
    const auto p = path("bad.safetensors");
    write_bytes(p, bytes);
    expect_checkpoint_error([&] { read_safetensors(p); }, p);
  }
  expect_checkpoint_error([&] { read_safetensors(path("missing.safetensors")); }, "missing.safetensors");
}

// ---- checkpoints ----

TEST_F(CheckpointTest, RoundTripModelOptimizerConfigState) {
  const CheckpointData d = sample(100);
  const std::string ckdir = path("run");
  const std::string folder = save_checkpoint(ckdir, d);
  EXPECT_EQ(folder, (fs::path(ckdir) / "step_00000100").string());
  for (const char* f : {"model-00000.safetensors", "optimizer-00000.safetensors", "index.json"})
    EXPECT_TRUE(fs::is_regular_file(fs::path(folder) / f)) << f;
  EXPECT_EQ(read_bytes(ckdir + "/latest"), "step_00000100\n");
  EXPECT_EQ(*latest_checkpoint(ckdir), folder);

  for (const std::string& from : {ckdir, folder}) {
    const CheckpointData got = load_checkpoint(from);
    EXPECT_EQ(got.step, 100);
    EXPECT_EQ(got.config, d.config);
    EXPECT_EQ(got.state, d.state);
    expect_same(got.model, d.model);
    expect_same(got.optimizer, d.optimizer);
  }
  // index.json records each file's size and CRC32.
  const auto index = nlohmann::json::parse(read_bytes(folder + "/index.json"));
  EXPECT_EQ(index["step"], 100);
  const FileDigest md = file_digest(folder + "/model-00000.safetensors");
  EXPECT_EQ(index["files"]["model-00000.safetensors"]["size"], md.size);
  EXPECT_EQ(index["files"]["model-00000.safetensors"]["crc32"], md.crc32);
  // Model weights from the directory, the step folder and the bare file.
  expect_same(load_model_weights(ckdir), d.model);
  expect_same(load_model_weights(folder), d.model);
  expect_same(load_model_weights(folder + "/model-00000.safetensors"), d.model);
}

TEST_F(CheckpointTest, LatestFollowsNewestAndSameStepIsReplaced) {
  const std::string ckdir = path("run");
  EXPECT_FALSE(latest_checkpoint(ckdir).has_value());
  save_checkpoint(ckdir, sample(100));
  save_checkpoint(ckdir, sample(200));
  EXPECT_EQ(*latest_checkpoint(ckdir), ckdir + "/step_00000200");
  EXPECT_EQ(load_checkpoint(ckdir).step, 200);
  EXPECT_EQ(load_checkpoint(ckdir + "/step_00000100").step, 100);

  const CheckpointData again = sample(200, 9);  // same step, other values
  save_checkpoint(ckdir, again);
  EXPECT_FALSE(fs::exists(ckdir + "/step_00000200.tmp"));
  const CheckpointData got = load_checkpoint(ckdir);
  EXPECT_EQ(got.state, again.state);
  expect_same(got.model, again.model);

  // keep_last = 2 keeps 300 and 200, deletes 100.
  save_checkpoint(ckdir, sample(300), 2);
  EXPECT_TRUE(fs::exists(ckdir + "/step_00000300"));
  EXPECT_TRUE(fs::exists(ckdir + "/step_00000200"));
  EXPECT_FALSE(fs::exists(ckdir + "/step_00000100"));
}

TEST_F(CheckpointTest, EveryTruncatedOrFlippedFileIsRefused) {
  const std::string base = path("base");
  const std::string base_folder = save_checkpoint(base, sample(100));
  for (const std::string file : {"model-00000.safetensors", "optimizer-00000.safetensors", "index.json"}) {
    const auto size = static_cast<int64_t>(fs::file_size(base_folder + "/" + file));
    // Damage: truncate by one byte, by half, or flip one byte at the start, middle, end.
    std::vector<std::pair<std::string, std::function<void(std::string&)>>> damages = {
        {"truncate 1", [](std::string& b) { b.pop_back(); }},
        {"truncate half", [](std::string& b) { b.resize(b.size() / 2); }},
        {"remove", nullptr},
    };
    for (int64_t at : {int64_t{0}, int64_t{9}, size / 2, size - 2, size - 1})
      for (unsigned char mask : {0x01, 0xff})
        damages.emplace_back("flip " + std::to_string(at) + "^" + std::to_string(mask),
                             [at, mask](std::string& b) { b[at] = static_cast<char>(b[at] ^ mask); });
    for (const auto& [what, damage] : damages) {
      SCOPED_TRACE(file + ": " + what);
      const std::string ckdir = path("damaged");
      fs::remove_all(ckdir);
      fs::copy(base, ckdir, fs::copy_options::recursive);
      const std::string target = ckdir + "/step_00000100/" + file;
      if (damage) {
        std::string bytes = read_bytes(target);
        damage(bytes);
        write_bytes(target, bytes);
      } else {
        fs::remove(target);
      }
      expect_checkpoint_error([&] { load_checkpoint(ckdir); }, file, "step_00000100");
      if (file != "optimizer-00000.safetensors")
        expect_checkpoint_error([&] { load_model_weights(ckdir); }, file, "step_00000100");
    }
  }
  EXPECT_EQ(load_checkpoint(base).step, 100);  // the original is untouched
}

TEST_F(CheckpointTest, LeftoverTmpFolderIsIgnored) {
  const std::string ckdir = path("run");
  save_checkpoint(ckdir, sample(100));
  // An interrupted save of step 200: a partial .tmp folder, `latest` not yet updated.
  fs::create_directories(ckdir + "/step_00000200.tmp");
  write_bytes(ckdir + "/step_00000200.tmp/model-00000.safetensors", "partial");
  EXPECT_EQ(*latest_checkpoint(ckdir), ckdir + "/step_00000100");
  EXPECT_EQ(load_checkpoint(ckdir).step, 100);
  // Pruning ignores it; the next save of step 200 replaces it.
  const CheckpointData d = sample(200);
  save_checkpoint(ckdir, d, 1);
  EXPECT_FALSE(fs::exists(ckdir + "/step_00000200.tmp"));
  EXPECT_FALSE(fs::exists(ckdir + "/step_00000100"));
  expect_same(load_checkpoint(ckdir).model, d.model);
}

TEST_F(CheckpointTest, MissingOrDanglingCheckpointsAreClearErrors) {
  expect_checkpoint_error([&] { load_checkpoint(path("nothing")); }, "nothing", "does not exist");
  fs::create_directories(path("emptydir"));
  expect_checkpoint_error([&] { load_checkpoint(path("emptydir")); }, "emptydir", "latest");
  EXPECT_FALSE(latest_checkpoint(path("emptydir")).has_value());
  write_bytes(path("emptydir") + "/latest", "step_00000700\n");
  expect_checkpoint_error([&] { latest_checkpoint(path("emptydir")); }, "step_00000700");
  // A NUL (or any unprintable byte) in `latest` is quoted escaped, not where the message ends.
  write_bytes(path("emptydir") + "/latest", std::string("step_0000\0\x01" "2\n", 13));
  expect_checkpoint_error([&] { latest_checkpoint(path("emptydir")); }, "'step_0000\\x00\\x012', not a step folder name");
  // A folder with only model.safetensors (as downloaded from the hub) loads as weights.
  fs::create_directories(path("hub"));
  const Tensor w = random_tensor({4, 4}, "w");
  write_safetensors(path("hub") + "/model.safetensors", {{"wte.weight", &w}});
  const auto ws = load_model_weights(path("hub"));
  ASSERT_EQ(ws.size(), 1u);
  EXPECT_TRUE(same(ws[0].second, w));
}

// ---- pieces (version 2) ----

namespace {

// The pieces of `full` as saved by `ranks` tp ranks cutting it with `spec` (rank set per piece),
// each tp-local tensor split again into `parts` flat ranges (as ZeRO segments are); rank
// (tp, part) writes one file pair.
std::string save_cut(const std::string& dir, const std::string& name, const Tensor& full, nn::ShardSpec spec,
                     int parts) {
  const std::string tmp = begin_save(dir, 1);
  std::vector<RankFiles> files;
  for (int r = 0; r < spec.size; ++r) {
    nn::ShardSpec s = spec;
    s.rank = r;
    Tensor local = s.is_split() ? Tensor(s.local_shape(full.shape())) : full.clone();
    if (s.is_split())
      s.for_each_run(full.shape(), 0, local.numel(), [&](int64_t l, int64_t g, int64_t n) {
        std::memcpy(local.data() + l, full.data() + g, n * sizeof(float));
      });
    const int64_t n = local.numel();
    for (int k = 0; k < parts; ++k) {
      const int64_t b = n * k / parts, e = n * (k + 1) / parts;
      RankPieces pieces;
      if (e > b) pieces.model.push_back({{name, full.shape(), s, b, e}, Tensor::view(local, b, {e - b})});
      files.push_back(write_rank_pieces(tmp, static_cast<int>(files.size()), pieces));
    }
  }
  return commit_save(dir, 1, nlohmann::json::object(), nlohmann::json::object(), files);
}

}  // namespace

// A tensor saved at one tp cut (and in ZeRO-like ranges) reads back at any other cut and range,
// element for element, reading exactly the bytes asked for: the fused qkv weight (three groups)
// from tp 2 to tp 4 and 1, a padded vocabulary split from tp 3 to tp 2.
TEST_F(CheckpointTest, PiecesReadAtAnyOtherCut) {
  struct Case {
    std::string name;
    Shape shape;
    nn::ShardSpec saved;
    std::vector<nn::ShardSpec> loads;
  };
  const std::vector<Case> cases = {
      {"h.0.attn.c_attn.weight", {8, 24}, nn::ShardSpec::split(1, 0, 2, 3),
       {nn::ShardSpec::split(1, 0, 4, 3), nn::ShardSpec::split(1, 0, 2, 3), nn::ShardSpec::replicated()}},
      {"wte.weight", {10, 6}, nn::ShardSpec::split_padded(0, 0, 3),
       {nn::ShardSpec::split_padded(0, 0, 2), nn::ShardSpec::split_padded(0, 0, 4), nn::ShardSpec::replicated()}},
  };
  for (const Case& c : cases) {
    const Tensor full = random_tensor(c.shape, c.name);
    const std::string dir = path("cut_" + c.name);
    const std::string folder = save_cut(dir, c.name, full, c.saved, 3);
    const CheckpointIndex index = open_checkpoint(folder);
    ASSERT_EQ(index.model.at(c.name).pieces.size(), static_cast<size_t>(3 * c.saved.size));
    for (nn::ShardSpec load : c.loads)
      for (int r = 0; r < load.size; ++r) {
        load.rank = r;
        SCOPED_TRACE(c.name + " saved " + c.saved.str() + " read " + load.str());
        const int64_t n = shape_numel(load.local_shape(c.shape));
        Tensor want(load.local_shape(c.shape));  // padding rows stay 0
        load.for_each_run(c.shape, 0, n, [&](int64_t l, int64_t g, int64_t k) {
          std::memcpy(want.data() + l, full.data() + g, k * sizeof(float));
        });
        // The whole local tensor, then an odd range of it.
        for (auto [b, e] : {std::pair<int64_t, int64_t>{0, n}, {n / 3, n - 1}}) {
          PieceReader rd(index);
          std::vector<float> got(e - b, -1.f);
          rd.read(c.name, c.shape, load, b, e, got.data());
          int64_t real = 0;
          load.for_each_run(c.shape, b, e, [&](int64_t, int64_t, int64_t k) { real += k; });
          EXPECT_EQ(rd.bytes_read(), 4 * real);
          for (int64_t i = b; i < e; ++i) ASSERT_EQ(got[i - b], want.data()[i]) << "element " << i;
        }
      }
  }
}

// An index whose pieces leave an element out or give one twice is refused on opening.
TEST_F(CheckpointTest, PiecesThatDoNotTileTheTensorAreRefused) {
  const Tensor full = random_tensor({4, 4}, "w");
  auto save = [&](const std::string& dir, std::vector<std::pair<int64_t, int64_t>> ranges) {
    const std::string tmp = begin_save(dir, 1);
    RankPieces pieces;
    for (auto [b, e] : ranges) pieces.model.push_back({{"w", {4, 4}, {}, b, e}, Tensor::view(full, b, {e - b})});
    return commit_save(dir, 1, nlohmann::json::object(), nlohmann::json::object(), {write_rank_pieces(tmp, 0, pieces)});
  };
  EXPECT_EQ(max_abs_diff(PieceReader(open_checkpoint(save(path("ok"), {{0, 5}, {5, 16}}))).full("w"), full), 0.f);
  expect_checkpoint_error([&] { open_checkpoint(save(path("gap"), {{0, 5}, {6, 16}})); }, "do not cover element 5");
  expect_checkpoint_error([&] { open_checkpoint(save(path("twice"), {{0, 6}, {5, 16}})); }, "overlap");
}
