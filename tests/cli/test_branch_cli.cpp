// `meshtrain train --branch-parallel 2`: the header names each Inception block's assignment, and
// `checkpoint convert --to-single` of the checkpoint it writes (each branch's tensors by the rank
// owning the branch) yields every tensor of inception-small with the checkpoint's values; bad
// --branch-balance exits 2 with a sentence. Images: tests/data/idx_files.h.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "cli_run.h"
#include "data/idx_files.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/model/cnn.h"
#include "temp_dir.h"

using meshtrain::testing::run_cli;
namespace train = meshtrain::train;

TEST(BranchCli, ConvertOfABranchParallelCheckpointYieldsEveryTensor) {
  meshtrain::testing::TempDir d("branch_cli");
  meshtrain::testing::write_bar_image_set(d.path().string(), 128, 32, false);
  const std::string ck = d.file("ck");
  const auto t = run_cli("train --model inception-small --data " + d.path().string() +
                         " --steps 2 --batch 16 --microbatches 2 --eval-every 0 --eval-batches 1 --threads 1"
                         " --branch-parallel 2 --branch-balance 0,1,1,0 --checkpoint-every 2 --checkpoint-dir " + ck);
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("layout: Inception branches over 2 ranks by --branch-balance 0,1,1,0 (the rank of each "
                          "branch): inception1 0,1,1,0; inception2 0,1,1,0 | cost share rank 0"),
            std::string::npos)
      << t.output;
  const std::string out = d.file("inception.safetensors");
  const auto r = run_cli("checkpoint convert --to-single " + ck + " " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto cfg = meshtrain::model::cnn_config("inception-small");
  std::map<std::string, std::vector<int64_t>> expected;
  for (const auto& [name, shape] : meshtrain::model::cnn_param_shapes(cfg)) expected[name] = shape;
  for (const auto& [name, shape] : meshtrain::model::cnn_buffer_shapes(cfg)) expected[name] = shape;
  const auto header = train::read_safetensors_header(out);
  ASSERT_EQ(header.size(), expected.size());
  for (const train::SafetensorsEntry& e : header) ASSERT_TRUE(expected.count(e.name)) << e.name;
  // The values are the checkpoint's (branch 2's tensors from rank 1, branch 1's from rank 0).
  const train::CheckpointData saved = train::load_checkpoint_model(ck);
  std::map<std::string, const meshtrain::Tensor*> by_name;
  for (auto& [name, tensor] : saved.model) by_name[name] = &tensor;
  for (const char* name : {"inception1.branch1.conv.weight", "inception1.branch2.1.conv.weight",
                           "inception2.branch3.2.bn.running_var", "inception2.branch4.1.bn.weight"})
    ASSERT_TRUE(by_name.count(name)) << name;
  for (auto& [name, tensor] : train::read_safetensors(out)) {
    if (name.rfind("inception", 0) != 0 || name.find("conv.weight") == std::string::npos) continue;
    const meshtrain::Tensor& s = *by_name.at(name);
    ASSERT_EQ(s.numel(), tensor.numel()) << name;
    for (int64_t i = 0; i < tensor.numel(); ++i) ASSERT_EQ(tensor[i], s[i]) << name << "[" << i << "]";
  }
}

TEST(BranchCli, BadBalanceExits2WithASentence) {
  meshtrain::testing::TempDir d("branch_cli_bad");
  meshtrain::testing::write_bar_image_set(d.path().string(), 64, 16, false);
  const auto r = run_cli("train --model inception-small --data " + d.path().string() +
                         " --steps 1 --batch 16 --threads 1 --branch-parallel 2 --branch-balance 1,1,1,1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--branch-balance 1,1,1,1 leaves rank 0 of --branch-parallel 2 without a branch"),
            std::string::npos)
      << r.output;
}
