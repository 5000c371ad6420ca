// Checkpoints, resume and divergence through the `meshtrain` program: exit codes (2 for bad
// input, 1 for failures while running) and the phrases of the sentences, step folders never
// overwritten, metrics without duplicate steps after a resume, and `generate` refusing a
// checkpoint whose tensors disagree with its index.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpoint.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace meshtrain;

namespace {

struct Result {
  int code;
  std::string output;
};

Result run(const std::string& args) {
  std::string cmd = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool has(const Result& r, const std::string& phrase) { return r.output.find(phrase) != std::string::npos; }

class ResumeCli : public ::testing::Test {
 protected:
  meshtrain::testing::TempDir tmp{"resume_cli"};
  fs::path ck = tmp.path() / "ckpt";
  std::string corpus() const {
    const std::string p = tmp.file("corpus.txt");
    if (!fs::exists(p)) {
      std::ofstream f(p);
      for (int i = 0; i < 2000; ++i) f << "to be or not to be, that is the question. ";
    }
    return p;
  }
  // A short gpt-tiny run; `extra` adds or overrides flags.
  Result train(const std::string& extra) const {
    return run("train --data " + corpus() + " --batch 4 --seq 16 --eval-batches 1 --warmup 2 --threads 1 "
               "--log-every 0 --checkpoint-dir " + ck.string() + " " + extra);
  }
};

std::vector<int64_t> metric_steps(const fs::path& file) {
  std::vector<int64_t> steps;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return steps;
}

}  // namespace

TEST_F(ResumeCli, DeletedLatestResumesTheNewestFolderAndKeepsTheOthers) {
  Result first = train("--steps 4 --checkpoint-every 2");
  ASSERT_EQ(first.code, 0) << first.output;
  fs::remove(ck / "latest");
  const std::string step2 = read_all(ck / "step_00000002" / "model-00000.safetensors");
  const std::string step4 = read_all(ck / "step_00000004" / "model-00000.safetensors");
  const auto t4 = fs::last_write_time(ck / "step_00000004" / "model-00000.safetensors");
  Result r = train("--steps 6 --checkpoint-every 2 --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "`latest` is missing")) << r.output;
  EXPECT_TRUE(has(r, "at step 4")) << r.output;
  EXPECT_EQ(read_all(ck / "step_00000002" / "model-00000.safetensors"), step2);
  EXPECT_EQ(read_all(ck / "step_00000004" / "model-00000.safetensors"), step4);
  EXPECT_TRUE(fs::last_write_time(ck / "step_00000004" / "model-00000.safetensors") == t4);
  EXPECT_EQ(read_all(ck / "latest"), "step_00000006\n");
}

TEST_F(ResumeCli, NewRunIntoAnotherRunsDirectoryExits2) {
  ASSERT_EQ(train("--steps 2 --checkpoint-every 2").code, 0);
  const std::string before = read_all(ck / "step_00000002" / "model-00000.safetensors");
  Result r = train("--steps 2 --checkpoint-every 2 --seed 7");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "already holds checkpoints")) << r.output;
  EXPECT_TRUE(has(r, "--resume")) << r.output;
  EXPECT_EQ(read_all(ck / "step_00000002" / "model-00000.safetensors"), before);
  // With --resume but another seed: another run's checkpoint, refused.
  Result other = train("--steps 4 --checkpoint-every 2 --seed 7 --resume");
  EXPECT_EQ(other.code, 2) << other.output;
  EXPECT_TRUE(has(other, "seed")) << other.output;
  EXPECT_EQ(read_all(ck / "step_00000002" / "model-00000.safetensors"), before);
}

// The optimizer's state continues only with the optimizer that saved it.
TEST_F(ResumeCli, AnotherOptimizerExits2) {
  ASSERT_EQ(train("--steps 2 --optimizer sgd --lr 0.05").code, 0);
  const std::string before = read_all(ck / "step_00000002" / "optimizer-00000.safetensors");
  Result lamb = train("--steps 4 --optimizer lamb --resume");
  EXPECT_EQ(lamb.code, 2) << lamb.output;
  EXPECT_TRUE(has(lamb, "--optimizer sgd")) << lamb.output;
  Result plain = train("--steps 4 --optimizer sgd --lr 0.05 --momentum 0 --resume");
  EXPECT_EQ(plain.code, 2) << plain.output;
  EXPECT_TRUE(has(plain, "momentum")) << plain.output;
  EXPECT_EQ(read_all(ck / "step_00000002" / "optimizer-00000.safetensors"), before);
  Result same = train("--steps 4 --optimizer sgd --lr 0.05 --resume");
  EXPECT_EQ(same.code, 0) << same.output;
  EXPECT_TRUE(has(same, "at step 2")) << same.output;
}

TEST_F(ResumeCli, MissingDirectoryExits2) {
  Result r = train("--steps 2 --checkpoint-every 2 --resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "does not exist")) << r.output;
  EXPECT_FALSE(fs::exists(ck));
}

TEST_F(ResumeCli, EmptyDirectoryStartsFromStepZeroWithANote) {
  fs::create_directories(ck);
  Result r = train("--steps 2 --checkpoint-every 2 --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "starting from step 0")) << r.output;
  EXPECT_TRUE(fs::is_directory(ck / "step_00000002"));
}

TEST_F(ResumeCli, NoValidFolderExits2) {
  ASSERT_EQ(train("--steps 2 --checkpoint-every 2").code, 0);
  fs::resize_file(ck / "step_00000002" / "optimizer-00000.safetensors", 10);
  Result r = train("--steps 4 --checkpoint-every 2 --resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "is a valid checkpoint")) << r.output;
  EXPECT_TRUE(has(r, "step_00000002 is corrupt")) << r.output;
}

TEST_F(ResumeCli, MetricsHaveNoDuplicateStepsAfterResume) {
  const std::string m = tmp.file("m.jsonl");
  ASSERT_EQ(train("--steps 6 --checkpoint-every 4 --metrics " + m).code, 0);
  // As if killed after writing step 6's metrics line but before saving its checkpoint.
  fs::remove_all(ck / "step_00000006");
  Result r = train("--steps 8 --checkpoint-every 4 --resume --metrics " + m);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "at step 4")) << r.output;
  EXPECT_EQ(metric_steps(m), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(metric_steps(m + ".old"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(has(r, m + ".old")) << r.output;
}

TEST_F(ResumeCli, ResumeWithoutCheckpointKeepsTheMetricsFileAsOld) {
  fs::create_directories(ck);
  const std::string m = tmp.file("m.jsonl");
  std::ofstream(m) << "{\"step\":1,\"loss\":9.5}\n";
  Result r = train("--steps 2 --checkpoint-every 2 --resume --metrics " + m);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_all(m + ".old"), "{\"step\":1,\"loss\":9.5}\n");
  EXPECT_EQ(metric_steps(m), (std::vector<int64_t>{1, 2}));
}

// A run that diverges (lr 1e30 is finite, so accepted) stops with exit 1 naming the step; the
// last good checkpoint stays `latest`. Data parallel: every rank stops (no hang).
TEST_F(ResumeCli, DivergedRunExits1NamingTheStep) {
  for (const char* layout : {"--dp 1", "--dp 2"}) {
    fs::remove_all(ck);
    Result r = train(std::string(layout) + " --steps 8 --checkpoint-every 1 --lr 1e30");
    EXPECT_EQ(r.code, 1) << layout << ": " << r.output;
    const std::string head = "training stopped at step ";
    const size_t at = r.output.find(head);
    ASSERT_NE(at, std::string::npos) << r.output;
    const int64_t step = std::stoll(r.output.substr(at + head.size()));
    const std::string good = train::step_folder_name(step - 1);
    EXPECT_TRUE(has(r, "stays " + good)) << r.output;
    EXPECT_EQ(read_all(ck / "latest"), good + "\n") << layout;
    EXPECT_FALSE(fs::exists(ck / train::step_folder_name(step))) << layout;
  }
}

TEST_F(ResumeCli, DivergedParameterServerRunExits1) {
  Result r = run("train --data " + corpus() + " --batch 4 --seq 16 --eval-batches 1 --warmup 2 --threads 1 "
                 "--log-every 0 --dp 2 --ps-servers 1 --steps 8 --lr 1e30");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(has(r, "training stopped at step")) << r.output;
  EXPECT_TRUE(has(r, "not pushed")) << r.output;
}

// A save that fails while running (here `latest` cannot be written; a full disk does the
// same) is a failure of the run: exit 1. The complete step folder is then resumed.
TEST_F(ResumeCli, CheckpointWriteFailureExits1AndTheFolderIsResumed) {
  fs::create_directories(ck / "latest.tmp");
  Result r = train("--steps 4 --checkpoint-every 2");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(has(r, "cannot save checkpoint")) << r.output;
  fs::remove(ck / "latest.tmp");
  Result again = train("--steps 4 --checkpoint-every 2 --resume");
  EXPECT_EQ(again.code, 0) << again.output;
  EXPECT_TRUE(has(again, "at step 2")) << again.output;
}

// ---- generate and checkpoints that disagree with their index ----

class GenerateCli : public ResumeCli {
 protected:
  train::CheckpointData good;
  void SetUp() override {
    ASSERT_EQ(train("--steps 1 --checkpoint-every 1").code, 0);
    good = train::load_checkpoint(ck.string());
  }
  // Saves `d` (valid CRCs: written by save_checkpoint) and runs generate on it.
  Result generate(const train::CheckpointData& d) const {
    const fs::path dir = tmp.path() / "bad";
    fs::remove_all(dir);
    train::save_checkpoint(dir.string(), d);
    return run("generate --checkpoint " + dir.string() + " --prompt Hi --tokens 4");
  }
};

TEST_F(GenerateCli, TheGoodCheckpointSamples) {
  Result r = generate(good);
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(GenerateCli, IndexSaysMoreLayersThanSaved) {
  auto d = good;
  d.config["model"]["n_layer"] = 8;  // 4 saved
  Result r = generate(d);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "h.4.ln_1.weight")) << r.output;
}

TEST_F(GenerateCli, WteOfTheWrongShape) {
  auto d = good;
  for (auto& [name, t] : d.model)
    if (name == "wte.weight") t = Tensor({t.dim(1), t.dim(0)});  // same element count, transposed shape
  Result r = generate(d);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "wte.weight")) << r.output;
  EXPECT_TRUE(has(r, "shape")) << r.output;
}

TEST_F(GenerateCli, MissingLnF) {
  auto d = good;
  std::erase_if(d.model, [](const auto& nt) { return nt.first == "ln_f.weight"; });
  Result r = generate(d);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "lacks tensor ln_f.weight")) << r.output;
}

TEST_F(GenerateCli, ExtraTensor) {
  auto d = good;
  d.model.emplace_back("h.9.mlp.c_fc.weight", Tensor({2, 2}));
  Result r = generate(d);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "h.9.mlp.c_fc.weight")) << r.output;
}

// Valid CRCs (save_checkpoint wrote them) over a NaN weight: refused naming file and tensor.
TEST_F(GenerateCli, NonFiniteWeights) {
  auto d = good;
  for (auto& [name, t] : d.model)
    if (name == "ln_f.bias") t[3] = std::numeric_limits<float>::quiet_NaN();
  Result r = generate(d);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "model-00000.safetensors holds non-finite values (NaN or infinity) in tensor ln_f.bias")) << r.output;
}

TEST_F(GenerateCli, HugeEmbeddingWidthIsRefusedBeforeAllocating) {
  auto d = good;
  d.config["model"]["n_embd"] = 1000000000;
  d.config["model"]["n_head"] = 1;
  Result r = generate(d);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "wte.weight")) << r.output;
  EXPECT_FALSE(has(r, "bad_alloc")) << r.output;
}
