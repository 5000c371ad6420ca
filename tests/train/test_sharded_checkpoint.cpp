// Sharded checkpoints (checkpoint/checkpoint.h): every rank writes only what it holds, no rank's
// tensor memory rises during a save, a resuming rank reads only what it needs, and version-1
// (full-tensor) checkpoints still load. Resuming on the curve at other layouts is
// test_layout_matrix.cpp's Resharding test.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/train/trainer.h"
#include "parallel/layout_fixture.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
namespace train = meshtrain::train;
using meshtrain::Shape;
using meshtrain::testing::layout_options;

namespace {

constexpr int64_t kBucketBytes = 64 << 10;  // --bucket-mb 1/16: "one bucket" of the bound below

train::TrainOptions options(int dp, int tp, int pp, int zero, int64_t steps) {
  auto o = layout_options(dp);
  o.tp = tp, o.pp = pp, o.zero = zero;
  o.microbatches = pp > 1 ? 2 : 1;
  o.schedule = "1f1b";
  o.batch = 16;
  o.steps = steps;
  o.bucket_bytes = kBucketBytes;
  return o;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

int64_t model_numel(const meshtrain::model::GPTConfig& cfg) {
  int64_t n = 0;
  for (const auto& [name, shape] : meshtrain::model::gpt_param_shapes(cfg)) n += meshtrain::shape_numel(shape);
  return n;
}

// Elements of the pieces the index places in each file.
std::map<std::string, int64_t> elements_by_file(const nlohmann::json& index) {
  std::map<std::string, int64_t> out;
  for (const auto& [name, t] : index["tensors"].items())
    for (const auto& p : t["pieces"]) out[p["file"]] += p["range"][1].get<int64_t>() - p["range"][0].get<int64_t>();
  return out;
}

}  // namespace

// A save at dp 2 x tp 2 x pp 2 under ZeRO-3: one model and one optimizer file per rank and
// nothing else; each rank's model file holds its own value shard (every logical element once
// over the world, the tied wte's last-stage copy and tp rank 1's replicated copies left out),
// its optimizer file the two moments of the same ranges; and no rank's tensor memory rose
// during the save by more than one bucket (it rises by nothing: the pieces are views).
TEST(ShardedCheckpoint, EveryRankWritesItsShardAndNoMore) {
  meshtrain::testing::TempDir dir("sharded");
  auto o = options(2, 2, 2, 3, 2);
  o.checkpoint_dir = dir.file("ck");
  o.checkpoint_every = 2;
  const train::TrainResult res = train::train(o);
  const fs::path folder = fs::path(o.checkpoint_dir) / "step_00000002";

  std::set<std::string> files, want = {"index.json"};
  for (const auto& e : fs::directory_iterator(folder)) files.insert(e.path().filename().string());
  for (int r = 0; r < 8; ++r) want.insert(train::rank_file_name("model", r)), want.insert(train::rank_file_name("optimizer", r));
  EXPECT_EQ(files, want);

  const nlohmann::json index = read_json(folder / "index.json");
  EXPECT_EQ(index["version"], 2);
  const auto elements = elements_by_file(index);
  ASSERT_EQ(res.saves.size(), 8u);
  ASSERT_EQ(res.ranks.size(), 8u);
  const int64_t wte_slice = res.config.vocab_size * res.config.n_embd / 2 / 2;  // tp 2, then dp 2
  int64_t total = 0;
  for (int r = 0; r < 8; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int64_t mine = elements.at(train::rank_file_name("model", r));
    const int64_t held = res.ranks[r].bytes.params / 4;  // its ZeRO-3 value shard
    EXPECT_EQ(mine, res.saves[r].model_elements);
    EXPECT_EQ(elements.at(train::rank_file_name("optimizer", r)), 2 * mine);
    const int tp = r % 2, pp = r / 4;  // rank = (pp * dp + dp_index) * tp + tp_index
    if (tp == 0 && pp == 0) {
      EXPECT_EQ(mine, held);
    }
    if (tp == 0 && pp == 1) {
      EXPECT_EQ(mine, held - wte_slice);  // its copy of the tied wte is not saved
    }
    if (tp == 1) {  // the tp-replicated tensors are saved by tp rank 0
      EXPECT_LT(mine, held);
      EXPECT_GT(mine, held / 2);
    }
    EXPECT_EQ(res.saves[r].bytes_written,
              static_cast<int64_t>(fs::file_size(folder / train::rank_file_name("model", r)) +
                                   fs::file_size(folder / train::rank_file_name("optimizer", r))));
    // Memory: the counter sees the rank's state, and the save adds at most one bucket to it.
    const auto& b = res.ranks[r].bytes;
    EXPECT_GE(res.saves[r].resident_bytes, b.params + b.grads + b.optimizer);
    EXPECT_LE(res.saves[r].peak_bytes - res.saves[r].resident_bytes, kBucketBytes);
    total += mine;
  }
  EXPECT_EQ(total, model_numel(res.config));  // every logical element exactly once
  // The index's pieces tile every tensor (open_checkpoint checks) and give back the model.
  const train::CheckpointIndex ck = train::open_checkpoint(folder.string());
  EXPECT_EQ(ck.model.size(), meshtrain::model::gpt_param_shapes(res.config).size());
  EXPECT_EQ(ck.optimizer.size(), 2 * ck.model.size());
}

// Resuming reads from the pieces only what a rank holds: its stage's values (all of them at
// ZeRO 0-2, its segments at ZeRO-3) and the moments of its optimizer slices, exactly its state
// bytes, whatever layout saved them, straight into its tensors (no tensor memory is allocated).
TEST(ShardedCheckpoint, ResumingRankReadsOnlyWhatItHolds) {
  meshtrain::testing::TempDir dir("sharded_read");
  auto o = options(2, 2, 2, 3, 2);
  o.checkpoint_dir = dir.file("ck");
  o.checkpoint_every = 2;
  train::train(o);
  int64_t data_bytes = 0;  // of every piece in the checkpoint: model and moments, each element once
  for (const auto& [file, n] : elements_by_file(read_json(fs::path(o.checkpoint_dir) / "step_00000002" / "index.json")))
    data_bytes += 4 * n;
  struct Target {
    int dp, tp, pp, zero;
  };
  for (const Target t : {Target{4, 1, 2, 1}, Target{1, 2, 1, 0}, Target{2, 2, 2, 3}, Target{2, 1, 1, 2}}) {
    const std::string what = "dp " + std::to_string(t.dp) + " tp " + std::to_string(t.tp) + " pp " +
                             std::to_string(t.pp) + " zero " + std::to_string(t.zero);
    SCOPED_TRACE(what);
    const std::string from = dir.file("from" + std::to_string(t.dp) + std::to_string(t.tp) + std::to_string(t.pp));
    fs::copy(o.checkpoint_dir, from, fs::copy_options::recursive);
    auto r = options(t.dp, t.tp, t.pp, t.zero, 3);
    r.checkpoint_dir = from;
    r.checkpoint_every = 3;
    r.resume = true;
    const train::TrainResult res = train::train(r);
    ASSERT_EQ(res.start_step, 2);
    const int world = t.dp * t.tp * t.pp;
    ASSERT_EQ(res.restore_bytes_read.size(), static_cast<size_t>(world));
    int64_t sum = 0;
    for (int k = 0; k < world; ++k) {
      const auto& b = res.ranks[k].bytes;
      EXPECT_EQ(res.restore_bytes_read[k], b.params + b.optimizer) << "rank " << k;
      EXPECT_EQ(res.restore_tensor_bytes[k], 0) << "rank " << k << ": read into its tensors in place";
      if (t.zero == 3) {  // an eighth of the model and its moments, give or take the replicated tensors
        EXPECT_LT(res.restore_bytes_read[k], data_bytes / 4) << "rank " << k;
      }
      sum += res.restore_bytes_read[k];
    }
    EXPECT_GE(sum, data_bytes) << "together the ranks read every piece at least once";
  }
}

// A version-1 checkpoint (full tensors in model.safetensors and optimizer.safetensors) made
// from a version-2 one resumes exactly as the version-2 one does, at another layout.
TEST(ShardedCheckpoint, VersionOneCheckpointsStillLoad) {
  meshtrain::testing::TempDir dir("sharded_v1");
  auto o = options(2, 1, 1, 3, 2);
  o.checkpoint_dir = dir.file("v2");
  o.checkpoint_every = 2;
  train::train(o);
  const train::CheckpointData full = train::load_checkpoint(o.checkpoint_dir);

  const fs::path v1 = fs::path(dir.file("v1")) / "step_00000002";
  fs::create_directories(v1);
  nlohmann::json j = {{"format", "meshtrain-checkpoint"}, {"version", 1},       {"step", full.step},
                      {"config", full.config},           {"state", full.state}, {"files", nlohmann::json::object()}};
  for (const auto& [file, tensors] : {std::pair{"model.safetensors", &full.model}, std::pair{"optimizer.safetensors", &full.optimizer}}) {
    const train::FileDigest d = train::write_safetensors((v1 / file).string(), *tensors, {{"format", "pt"}});
    j["files"][file] = {{"size", d.size}, {"crc32", d.crc32}};
  }
  const std::string compact = j.dump();
  j["index_crc32"] = static_cast<uint32_t>(::crc32(::crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(compact.data()),
                                                   static_cast<uInt>(compact.size())));
  std::ofstream(v1 / "index.json") << j.dump(2) << "\n";
  std::ofstream(fs::path(dir.file("v1")) / "latest") << "step_00000002\n";

  const auto weights = train::load_model_weights(dir.file("v1"));
  ASSERT_EQ(weights.size(), full.model.size());
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_EQ(meshtrain::max_abs_diff(weights[i].second, full.model[i].second), 0.f);

  auto resume = [&](const std::string& from) {
    auto r = options(1, 2, 1, 0, 5);
    r.checkpoint_dir = from;
    r.resume = true;
    return train::train(r).steps;
  };
  const auto a = resume(o.checkpoint_dir), b = resume(dir.file("v1"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].loss, b[i].loss) << "step " << a[i].step;
}
