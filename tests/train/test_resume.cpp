// Resume without data loss: --resume continues from the newest step folder that verifies
// (whatever `latest` says), skips invalid folders, refuses a missing directory and folders none
// of which verifies, and a new run refuses a directory holding another run's step folders. Every
// case checks which step was resumed and that the step folders that were there before are
// byte-for-byte (and mtime-for-mtime) what they were. Also: a diverged run stops without
// applying its step or saving its state, and the metrics file of a resumed run has one line per
// step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/nn/param.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/trainer.h"
#include "temp_dir.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every file under the step folders of `dir`: relative path -> (contents, mtime).
using Snapshot = std::map<std::string, std::pair<std::string, fs::file_time_type>>;
Snapshot snapshot_steps(const fs::path& dir) {
  Snapshot s;
  for (const auto& [step, folder] : train::step_folders(dir.string()))
    for (const auto& e : fs::recursive_directory_iterator(folder))
      if (e.is_regular_file())
        s[fs::relative(e.path(), dir).string()] = {read_all(e.path()), fs::last_write_time(e.path())};
  return s;
}

// The step folders present in `now` that were in `before` are unchanged (files, bytes, times).
void expect_unchanged(const Snapshot& before, const Snapshot& now) {
  ASSERT_FALSE(before.empty());
  for (const auto& [path, v] : before) {
    auto it = now.find(path);
    ASSERT_NE(it, now.end()) << path << " was removed";
    EXPECT_TRUE(it->second.first == v.first) << path << " was rewritten with other bytes";
    EXPECT_TRUE(it->second.second == v.second) << path << " was rewritten";
  }
}

std::string small_corpus(const fs::path& dir) {
  const char* words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "a ", "lazy ", "dog. ", "and "};
  std::string text;
  uint32_t s = 7;
  while (text.size() < 40000) {
    s = s * 1103515245u + 12345u;
    text += words[(s >> 16) % 10];
  }
  fs::path p = dir / "corpus.txt";
  std::ofstream(p) << text;
  return p.string();
}

class Resume : public ::testing::Test {
 protected:
  meshtrain::testing::TempDir tmp{"resume"};
  std::string data = small_corpus(tmp.path());
  fs::path ck = tmp.path() / "ckpt";

  train::TrainOptions options(int64_t steps, uint64_t seed = 1337) const {
    train::TrainOptions o;
    o.model = "gpt-tiny";
    o.data = data;
    o.batch = 4;
    o.seq = 16;
    o.steps = steps;
    o.seed = seed;
    o.optim.warmup_steps = 2;
    o.optim.decay_steps = 8;  // the same schedule however far a run goes
    o.eval_every = 0;
    o.eval_batches = 1;
    o.quiet = true;
    o.threads = 1;
    o.checkpoint_dir = ck.string();
    o.checkpoint_every = 2;
    return o;
  }
  train::TrainOptions resume_options(int64_t steps, uint64_t seed = 1337) const {
    auto o = options(steps, seed);
    o.resume = true;
    return o;
  }
  std::string latest() const { return read_all(ck / "latest"); }
  // A first run that saves step_00000002 and step_00000004.
  void first_run() {
    train::train(options(4));
    ASSERT_TRUE(fs::is_directory(ck / "step_00000002"));
    ASSERT_TRUE(fs::is_directory(ck / "step_00000004"));
    ASSERT_EQ(latest(), "step_00000004\n");
  }
};

bool mentions(const std::vector<std::string>& notes, const std::string& phrase) {
  for (const auto& n : notes)
    if (n.find(phrase) != std::string::npos) return true;
  return false;
}

void flip_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
  f.put(static_cast<char>(c ^ 0x5a));
}

}  // namespace

TEST_F(Resume, DeletedLatestResumesTheNewestFolder) {
  first_run();
  fs::remove(ck / "latest");
  const Snapshot before = snapshot_steps(ck);
  const auto rp = train::find_resume_point(ck.string());
  ASSERT_TRUE(rp.folder);
  EXPECT_EQ(rp.step, 4);
  EXPECT_TRUE(mentions(rp.notes, "`latest` is missing")) << ::testing::PrintToString(rp.notes);
  auto r = train::train(resume_options(6));
  EXPECT_EQ(r.start_step, 4);
  EXPECT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps.front().step, 4);  // 0-based: the 5th step
  expect_unchanged(before, snapshot_steps(ck));
  EXPECT_TRUE(fs::is_directory(ck / "step_00000006"));
  EXPECT_EQ(latest(), "step_00000006\n");
}

// A save that fails writing `latest` (a full disk at exactly that point) leaves a complete
// step folder and no `latest`: the run fails (CheckpointWriteError), the folder is resumed.
TEST_F(Resume, LatestNeverWrittenResumesTheCompleteFolder) {
  fs::create_directories(ck / "latest.tmp");  // `latest` cannot be written: its temp path is a directory
  EXPECT_THROW(train::train(options(4)), train::CheckpointWriteError);
  ASSERT_TRUE(fs::is_directory(ck / "step_00000002"));
  ASSERT_FALSE(fs::exists(ck / "latest"));
  EXPECT_NO_THROW(train::verify_checkpoint((ck / "step_00000002").string()));
  fs::remove(ck / "latest.tmp");
  const Snapshot before = snapshot_steps(ck);
  auto r = train::train(resume_options(4));
  EXPECT_EQ(r.start_step, 2);
  EXPECT_EQ(r.steps.size(), 2u);
  expect_unchanged(before, snapshot_steps(ck));
  EXPECT_EQ(latest(), "step_00000004\n");
}

// `latest` one step behind (the same failure one save later): the newer complete folder wins.
TEST_F(Resume, StaleLatestResumesTheNewestValidFolder) {
  first_run();
  std::ofstream(ck / "latest") << "step_00000002\n";
  const Snapshot before = snapshot_steps(ck);
  const auto rp = train::find_resume_point(ck.string());
  EXPECT_EQ(rp.step, 4);
  EXPECT_TRUE(mentions(rp.notes, "names step_00000002")) << ::testing::PrintToString(rp.notes);
  auto r = train::train(resume_options(6));
  EXPECT_EQ(r.start_step, 4);
  expect_unchanged(before, snapshot_steps(ck));
}

TEST_F(Resume, InvalidNewestFolderIsSkippedWithANote) {
  first_run();
  flip_byte(ck / "step_00000004" / "model-00000.safetensors");
  const Snapshot before = snapshot_steps(ck);
  const auto rp = train::find_resume_point(ck.string());
  EXPECT_EQ(rp.step, 2);
  EXPECT_TRUE(mentions(rp.notes, "skipping step_00000004")) << ::testing::PrintToString(rp.notes);
  EXPECT_TRUE(mentions(rp.notes, "model-00000.safetensors")) << ::testing::PrintToString(rp.notes);
  auto r = train::train(resume_options(3));  // ends at step 3: saves step_00000003 only
  EXPECT_EQ(r.start_step, 2);
  EXPECT_EQ(r.steps.size(), 1u);
  expect_unchanged(before, snapshot_steps(ck));
  EXPECT_EQ(latest(), "step_00000003\n");
}

TEST_F(Resume, NoValidFolderIsRefused) {
  first_run();
  flip_byte(ck / "step_00000004" / "model-00000.safetensors");
  fs::remove(ck / "step_00000002" / "index.json");
  const Snapshot before = snapshot_steps(ck);
  try {
    train::train(resume_options(6));
    FAIL() << "resumed from invalid folders";
  } catch (const train::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("none of the 2 step folder(s)"), std::string::npos) << e.what();
  }
  expect_unchanged(before, snapshot_steps(ck));
}

// The case: `latest` gone and a run with another seed. Without --resume it is refused
// (the directory holds step folders); with --resume it is refused too (another run's config).
TEST_F(Resume, AnotherRunsFoldersAreNeverOverwritten) {
  first_run();
  fs::remove(ck / "latest");
  const Snapshot before = snapshot_steps(ck);
  try {
    train::train(options(6, /*seed=*/99));
    FAIL() << "a new run started in a directory holding step folders";
  } catch (const train::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step_00000004"), std::string::npos) << e.what();
  }
  try {
    train::train(resume_options(6, /*seed=*/99));
    FAIL() << "resumed another run's checkpoint";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("seed"), std::string::npos) << e.what();
  }
  expect_unchanged(before, snapshot_steps(ck));
  EXPECT_EQ(snapshot_steps(ck).size(), before.size());  // nothing new either
  EXPECT_FALSE(fs::exists(ck / "latest"));
}

TEST_F(Resume, MissingDirectoryIsRefused) {
  try {
    train::train(resume_options(4));
    FAIL() << "resumed from a directory that does not exist";
  } catch (const train::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(ck));
}

TEST_F(Resume, EmptyDirectoryStartsFromStepZero) {
  fs::create_directories(ck);
  const auto rp = train::find_resume_point(ck.string());
  EXPECT_FALSE(rp.folder);
  EXPECT_TRUE(mentions(rp.notes, "starting from step 0")) << ::testing::PrintToString(rp.notes);
  auto r = train::train(resume_options(2));
  EXPECT_EQ(r.start_step, 0);
  EXPECT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(latest(), "step_00000002\n");
}

TEST_F(Resume, DanglingLatestWithoutFoldersIsRefused) {
  fs::create_directories(ck);
  std::ofstream(ck / "latest") << "step_00000010\n";
  EXPECT_THROW(train::find_resume_point(ck.string()), train::CheckpointError);
}

// ---- metrics of a resumed run ----

std::vector<int64_t> metric_steps(const fs::path& file) {
  std::vector<int64_t> steps;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return steps;
}

TEST_F(Resume, MetricsKeepStepsUpToTheResumedOneAndAppend) {
  auto o = options(6);
  o.checkpoint_every = 4;  // saves steps 4 and 6
  o.metrics = (tmp.path() / "m.jsonl").string();
  train::train(o);
  ASSERT_EQ(metric_steps(o.metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const std::string original = read_all(o.metrics);
  // As if killed after step 6's metrics line, before its checkpoint.
  fs::remove_all(ck / "step_00000006");
  std::ofstream(ck / "latest") << "step_00000004\n";
  auto r = resume_options(8);
  r.checkpoint_every = 4;
  r.metrics = o.metrics;
  EXPECT_EQ(train::train(r).start_step, 4);
  EXPECT_EQ(metric_steps(o.metrics), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(read_all(o.metrics + ".old"), original);
}

TEST_F(Resume, MetricsTrimDropsCutAndDuplicateLines) {
  const fs::path m = tmp.path() / "m.jsonl";
  std::ofstream(m) << "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":3,\"loss\":3}\n"
                      "{\"step\":2,\"loss\":4.5}\n{\"step\":3,\"loss\":3.5}\n{\"step\":4,\"lo";
  const std::string original = read_all(m);
  const auto t = train::trim_metrics_for_resume(m.string(), 3);
  EXPECT_EQ(t.kept, 3);
  EXPECT_EQ(t.dropped, 3);
  EXPECT_EQ(metric_steps(m), (std::vector<int64_t>{1, 2, 3}));
  // The later line of a step is the one kept (the run that went on from there wrote it).
  EXPECT_NE(read_all(m).find("\"loss\":4.5"), std::string::npos);
  EXPECT_EQ(read_all(t.backup), original);
  // Nothing to drop: untouched, no backup.
  fs::remove(t.backup);
  const auto again = train::trim_metrics_for_resume(m.string(), 3);
  EXPECT_EQ(again.dropped, 0);
  EXPECT_FALSE(fs::exists(t.backup));
}

// A line the strict reading refuses (a key given twice, io/json.h) is dropped as a cut line is,
// never read with its last value winning; its step is then missing.
TEST_F(Resume, MetricsTrimDropsALineWithAKeyGivenTwice) {
  const fs::path m = tmp.path() / "m.jsonl";
  std::ofstream(m) << "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4,\"step\":3}\n{\"step\":3,\"loss\":3}\n";
  const std::string original = read_all(m);
  const auto t = train::trim_metrics_for_resume(m.string(), 3);
  EXPECT_EQ(t.kept, 2);
  EXPECT_EQ(t.dropped, 1);
  EXPECT_EQ(t.duplicates, 0);
  EXPECT_EQ(t.missing, (std::vector<int64_t>{2}));
  EXPECT_EQ(metric_steps(m), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(read_all(t.backup), original);
}

// The steps a file lacks come from the source (a checkpoint's recorded line) where it has
// them; the rest are listed. Adding lines drops nothing, so no backup is written.
TEST_F(Resume, MetricsTrimRebuildsMissingLinesAndListsTheRest) {
  const fs::path m = tmp.path() / "m.jsonl";
  std::ofstream(m) << "{\"step\":1,\"loss\":5}\n{\"step\":4,\"loss\":2}";  // no newline at the end
  auto source = [](int64_t s) -> std::optional<std::string> {
    if (s == 3 || s == 5) return "{\"loss\":" + std::to_string(6 - s) + ",\"step\":" + std::to_string(s) + "}";
    return std::nullopt;
  };
  const auto t = train::trim_metrics_for_resume(m.string(), 5, source);
  EXPECT_EQ(t.kept, 2);
  EXPECT_EQ(t.dropped, 0);
  EXPECT_EQ(t.rebuilt, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(t.missing, (std::vector<int64_t>{2}));
  EXPECT_TRUE(t.backup.empty());
  EXPECT_EQ(metric_steps(m.string()), (std::vector<int64_t>{1, 3, 4, 5}));
  EXPECT_EQ(read_all(m.string()).back(), '\n');
  EXPECT_EQ(train::format_steps({1, 2, 3, 5, 7, 8}), "1-3, 5, 7-8");
  // An absent file is created from what the source has.
  const fs::path n = tmp.path() / "n.jsonl";
  const auto u = train::trim_metrics_for_resume(n.string(), 3, source);
  EXPECT_FALSE(u.existed);
  EXPECT_EQ(u.missing, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(metric_steps(n.string()), (std::vector<int64_t>{3}));
}

TEST_F(Resume, ResumeWithoutCheckpointKeepsTheOldMetrics) {
  fs::create_directories(ck);
  const fs::path m = tmp.path() / "m.jsonl";
  std::ofstream(m) << "{\"step\":1,\"loss\":99}\n{\"step\":2,\"loss\":98}\n";
  const std::string original = read_all(m);
  auto o = resume_options(2);
  o.metrics = m.string();
  train::train(o);
  EXPECT_EQ(read_all(m.string() + ".old"), original);
  EXPECT_EQ(metric_steps(m), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(read_all(m).find("\"loss\":9"), std::string::npos);  // the new run's lines
}

// ---- a diverged run ----

TEST(Diverged, OptimizerAppliesNothingOnANonFiniteNorm) {
  nn::Param p("w", {4});
  p.value.fill(1.f);
  p.grad.fill(0.5f);
  train::AdamW adam({&p}, {}, 1);
  adam.step(0);
  const std::vector<float> w(p.value.data(), p.value.data() + 4);
  const std::vector<float> m(adam.exp_avg()[0].data(), adam.exp_avg()[0].data() + 4);
  ASSERT_EQ(adam.updates(), 1);
  for (float bad : {std::nanf(""), INFINITY}) {
    p.grad.fill(0.5f);
    p.grad.data()[2] = bad;
    const double norm = adam.step(1);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(std::vector<float>(p.value.data(), p.value.data() + 4), w);
    EXPECT_EQ(std::vector<float>(adam.exp_avg()[0].data(), adam.exp_avg()[0].data() + 4), m);
    EXPECT_EQ(adam.updates(), 1);
  }
}

class DivergedRun : public Resume {};

// A learning rate of 1e30 is finite (accepted) and blows the weights up within a few steps.
TEST_F(DivergedRun, StopsNamingTheStepAndKeepsTheLastGoodCheckpoint) {
  for (int dp : {1, 2}) {
    fs::remove_all(ck);
    auto o = options(8);
    o.dp = dp;
    o.optim.lr = 1e30f;
    o.checkpoint_every = 1;
    std::string what;
    try {
      train::train(o);
      FAIL() << "dp " << dp << ": a run at lr 1e30 finished";
    } catch (const train::TrainingDiverged& e) {
      what = e.what();
    }
    // "training stopped at step N: ..." with N the step that went non-finite.
    const std::string head = "training stopped at step ";
    ASSERT_EQ(what.rfind(head, 0), 0u) << what;
    const int64_t bad_step = std::stoll(what.substr(head.size()));
    ASSERT_GE(bad_step, 1) << what;
    const auto folders = train::step_folders(ck.string());
    ASSERT_FALSE(folders.empty()) << what;
    const int64_t newest = folders.back().first;
    EXPECT_EQ(newest, bad_step - 1) << "dp " << dp << ": " << what;  // every good step saved, the bad one not
    EXPECT_EQ(latest(), train::step_folder_name(newest) + "\n");
    EXPECT_NE(what.find("stays " + train::step_folder_name(newest)), std::string::npos) << what;
    // The saved state is the good one: finite everywhere.
    const auto ckd = train::load_checkpoint(ck.string());
    for (const auto& [name, t] : ckd.model)
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(t.data()[i])) << name;
  }
}

// --checkpoint-every-s: a checkpoint whenever that many seconds passed since the last one, by
// world rank 0's clock, agreed by every rank at the step's end. An interval every step exceeds
// saves every step (at dp 2 x pp 2 too: the ranks must save together); one no step reaches saves
// only the end.
TEST_F(Resume, ATimedCadenceSavesWhenItsSecondsHavePassed) {
  auto steps_saved = [&](const fs::path& dir) {
    std::vector<int64_t> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("step_", 0) == 0) out.push_back(std::stoll(e.path().filename().string().substr(5)));
    std::sort(out.begin(), out.end());
    return out;
  };
  auto o = options(5);
  o.checkpoint_every = 0;
  o.checkpoint_every_s = 1e-9;
  train::train(o);
  EXPECT_EQ(steps_saved(ck), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  auto layout = options(5);
  layout.checkpoint_dir = (tmp.path() / "layout").string();
  layout.checkpoint_every = 0;
  layout.checkpoint_every_s = 1e-9;
  layout.dp = 2, layout.pp = 2, layout.microbatches = 2;
  train::train(layout);
  EXPECT_EQ(steps_saved(layout.checkpoint_dir), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  auto rare = options(5);
  rare.checkpoint_dir = (tmp.path() / "rare").string();
  rare.checkpoint_every = 0;
  rare.checkpoint_every_s = 1e6;
  train::train(rare);
  EXPECT_EQ(steps_saved(rare.checkpoint_dir), (std::vector<int64_t>{5}));
  auto bad = options(5);
  bad.checkpoint_every_s = -1;
  EXPECT_THROW(train::train(bad), std::invalid_argument);
}
