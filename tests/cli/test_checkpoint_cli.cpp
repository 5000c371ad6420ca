// `meshtrain checkpoint convert --to-single`: a checkpoint written by a 2 x 2 x 2 ZeRO-3 run
// becomes one safetensors file in the Hugging Face GPT-2 layout — the names, shapes and dtype
// below are written out by hand from GPT-2's state dict (GPT2Model: wte, wpe, h.<i>.ln_1,
// attn.c_attn / c_proj as Conv1D (in, out), ln_2, mlp.c_fc / c_proj, ln_f), not taken from
// meshtrain — with the checkpoint's values; bad input exits 2 with a sentence.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_run.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "temp_dir.h"

using meshtrain::testing::run_cli;
namespace train = meshtrain::train;

namespace {

// GPT-2's tensors for n_layer layers of width C, vocabulary V and P positions.
std::map<std::string, std::vector<int64_t>> gpt2_layout(int n_layer, int64_t C, int64_t V, int64_t P) {
  std::map<std::string, std::vector<int64_t>> t{
      {"wte.weight", {V, C}}, {"wpe.weight", {P, C}}, {"ln_f.weight", {C}}, {"ln_f.bias", {C}}};
  for (int i = 0; i < n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    t[h + "ln_1.weight"] = {C};
    t[h + "ln_1.bias"] = {C};
    t[h + "attn.c_attn.weight"] = {C, 3 * C};
    t[h + "attn.c_attn.bias"] = {3 * C};
    t[h + "attn.c_proj.weight"] = {C, C};
    t[h + "attn.c_proj.bias"] = {C};
    t[h + "ln_2.weight"] = {C};
    t[h + "ln_2.bias"] = {C};
    t[h + "mlp.c_fc.weight"] = {C, 4 * C};
    t[h + "mlp.c_fc.bias"] = {4 * C};
    t[h + "mlp.c_proj.weight"] = {4 * C, C};
    t[h + "mlp.c_proj.bias"] = {C};
  }
  return t;
}

}  // namespace

TEST(CheckpointCli, ConvertToSingleGivesTheGpt2Layout) {
  meshtrain::testing::TempDir dir("checkpoint_cli");
  {
    std::ofstream f(dir.file("corpus.txt"));
    for (int i = 0; i < 400; ++i) f << "It is a truth universally acknowledged, that a single man\n";
  }
  const std::string ck = dir.file("ck");
  const auto trained = run_cli("train --model gpt-tiny --data " + dir.file("corpus.txt") +
                               " --batch 8 --seq 32 --steps 2 --eval-every 0 --eval-batches 1 --threads 1 --quiet"
                               " --dp 2 --tp 2 --pp 2 --zero 3 --microbatches 2 --checkpoint-every 2 --checkpoint-dir " +
                               ck);
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string out = dir.file("gpt2.safetensors");
  const auto r = run_cli("checkpoint convert --to-single " + ck + " " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2"), std::string::npos) << r.output;

  // gpt-tiny: 4 layers, C = 128, V = 256, 64 positions.
  const auto expected = gpt2_layout(4, 128, 256, 64);
  const auto header = train::read_safetensors_header(out);
  ASSERT_EQ(header.size(), expected.size());
  for (const train::SafetensorsEntry& e : header) {
    ASSERT_TRUE(expected.count(e.name)) << "not a GPT-2 tensor: " << e.name;
    EXPECT_EQ(e.shape, expected.at(e.name)) << e.name;
    EXPECT_EQ(e.dtype, "F32") << e.name;
  }
  EXPECT_EQ(train::read_safetensors_metadata(out).at("format"), "pt");
  EXPECT_EQ(train::read_safetensors_metadata(out).at("writer"), "meshtrain");  // a later convert may replace it
  // Never into the checkpoint it reads: a rank file as OUT is refused, the checkpoint unchanged.
  const std::string rank_file = ck + "/step_00000002/model-00000.safetensors";
  const auto digest = train::file_digest(rank_file);
  const auto into = run_cli("checkpoint convert --to-single " + ck + " " + rank_file);
  EXPECT_EQ(into.code, 2) << into.output;
  EXPECT_NE(into.output.find("lies inside the checkpoint"), std::string::npos) << into.output;
  EXPECT_EQ(train::file_digest(rank_file).crc32, digest.crc32);
  // The values are the checkpoint's.
  const train::CheckpointData saved = train::load_checkpoint_model(ck);
  std::map<std::string, const meshtrain::Tensor*> by_name;
  for (auto& [name, t] : saved.model) by_name[name] = &t;
  for (auto& [name, t] : train::read_safetensors(out)) {
    ASSERT_TRUE(by_name.count(name)) << name;
    const meshtrain::Tensor& s = *by_name.at(name);
    ASSERT_EQ(s.numel(), t.numel()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t[i], s[i]) << name << "[" << i << "]";
  }
}

TEST(CheckpointCli, BadInputExits2WithASentence) {
  meshtrain::testing::TempDir dir("checkpoint_cli");
  struct Case {
    std::string args, phrase;
  };
  std::filesystem::create_directories(dir.file("empty"));
  for (const Case& c : {Case{"convert --to-single " + dir.file("missing") + " " + dir.file("o.st"), "does not exist"},
                        Case{"convert " + dir.file("empty") + " " + dir.file("o.st"), "--to-single"},
                        Case{"convert --to-single " + dir.file("empty") + " " + dir.file("no/o.st"), "does not exist"},
                        Case{"convert --to-single " + dir.file("empty") + " " + dir.file("o.st"), "no step folder"},
                        Case{"convert --to-single " + dir.file("empty") + " " + dir.file("empty"), "is a directory"},
                        Case{"", "convert"}}) {
    const auto r = run_cli("checkpoint " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.phrase), std::string::npos) << c.args << "\n" << r.output;
  }
}
