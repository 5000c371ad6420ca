// The output policy of train/outputs.h: outputs are compared with inputs and with each other
// as the file system resolves them (symbolic and hard links seen through), files meshtrain did
// not write are kept unless --overwrite, and unusable paths are refused before anything runs.
// Each refusal is checked to name both paths, and the files involved are checked unchanged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "meshtrain/pipeline/svg.h"
#include "meshtrain/train/outputs.h"
#include "temp_dir.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The refusal's sentence, or "" when check() passes.
std::string refusal(const train::PathPlan& plan) {
  try {
    plan.check();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(OutputPolicy, AnOutputThatIsAnInputIsRefusedThroughLinks) {
  meshtrain::testing::TempDir d("outputs");
  const std::string data = d.file("corpus.txt");
  write(data, "the corpus");
  fs::create_symlink(data, d.file("soft.txt"));
  ASSERT_EQ(::link(data.c_str(), d.file("hard.txt").c_str()), 0);
  for (const std::string& out : {data, d.file("soft.txt"), d.file("hard.txt"), d.file("./x/../corpus.txt")}) {
    if (out.find("/x/") != std::string::npos) fs::create_directories(d.file("x"));
    train::PathPlan plan;
    plan.input_file("--data", data);
    plan.output_file("--metrics", out, train::OutputKind::metrics);
    const std::string why = refusal(plan);
    EXPECT_NE(why.find("--metrics " + out + " is the same file as --data " + data), std::string::npos) << why;
  }
  EXPECT_EQ(read(data), "the corpus");
}

TEST(OutputPolicy, TwoOutputsOfOneFileAreRefused) {
  meshtrain::testing::TempDir d("outputs");
  train::PathPlan plan;
  plan.output_file("--metrics", d.file("a.jsonl"), train::OutputKind::metrics);
  plan.output_file("--trace", d.file("a.jsonl"), train::OutputKind::trace);
  EXPECT_NE(refusal(plan).find("is the same file as --metrics"), std::string::npos) << refusal(plan);
  train::PathPlan distinct;
  distinct.output_file("--metrics", d.file("a.jsonl"), train::OutputKind::metrics);
  distinct.output_file("--trace", d.file("b.json"), train::OutputKind::trace);
  EXPECT_EQ(refusal(distinct), "");
}

TEST(OutputPolicy, NothingIsWrittenInsideADirectoryBeingRead) {
  meshtrain::testing::TempDir d("outputs");
  fs::create_directories(d.file("ck/step_00000002"));
  write(d.file("ck/step_00000002/index.json"), "{}");
  for (const std::string& out : {d.file("ck/step_00000002/index.json"), d.file("ck/latest"), d.file("ck/new.bin")}) {
    train::PathPlan plan;
    plan.input_tree("the checkpoint", d.file("ck"));
    plan.output_file("the output", out, train::OutputKind::safetensors);
    EXPECT_NE(refusal(plan).find("lies inside the checkpoint"), std::string::npos) << out << ": " << refusal(plan);
  }
  train::PathPlan beside;
  beside.input_tree("the checkpoint", d.file("ck"));
  beside.output_file("the output", d.file("ck.safetensors"), train::OutputKind::safetensors);
  EXPECT_EQ(refusal(beside), "");
}

TEST(OutputPolicy, ACheckpointDirectorysManagedNamesAreNotOutputsOrInputs) {
  meshtrain::testing::TempDir d("outputs");
  for (const char* name : {"latest", "step_00000004", "step_00000004/model-00000.safetensors"}) {
    train::PathPlan plan;
    plan.output_checkpoint_dir("--checkpoint-dir", d.file("ck"));
    plan.input_file("--data", d.file(std::string("ck/") + name));
    EXPECT_NE(refusal(plan).find("lies among the files --checkpoint-dir"), std::string::npos) << name;
  }
  fs::create_directories(d.file("ck"));
  train::PathPlan other;  // a file of its own in the checkpoint directory is left alone
  other.output_checkpoint_dir("--checkpoint-dir", d.file("ck"));
  other.output_file("--metrics", d.file("ck/metrics.jsonl"), train::OutputKind::metrics);
  EXPECT_EQ(refusal(other), "");
}

TEST(OutputPolicy, FilesMeshtrainDidNotWriteAreKeptUnlessOverwrite) {
  meshtrain::testing::TempDir d("outputs");
  const std::string mine = d.file("notes.txt"), ours = d.file("run.jsonl"), svg = d.file("lane.svg");
  write(mine, "my notes\n");
  write(ours, "{\"step\":1,\"loss\":5.5}\n");
  write(svg, std::string("<?xml version=\"1.0\"?>\n<svg>\n") + pipeline::kSvgMark + "\n</svg>\n");
  EXPECT_FALSE(train::written_by_meshtrain(mine, train::OutputKind::metrics));
  EXPECT_TRUE(train::written_by_meshtrain(ours, train::OutputKind::metrics));
  EXPECT_TRUE(train::written_by_meshtrain(svg, train::OutputKind::svg));
  EXPECT_FALSE(train::written_by_meshtrain(ours, train::OutputKind::svg));
  EXPECT_TRUE(train::written_by_meshtrain(d.file("absent"), train::OutputKind::trace));

  train::PathPlan keep;
  keep.output_file("--metrics", mine, train::OutputKind::metrics);
  EXPECT_NE(refusal(keep).find("was not written by meshtrain"), std::string::npos);
  EXPECT_NE(refusal(keep).find("--overwrite"), std::string::npos);
  train::PathPlan replace(/*overwrite=*/true);
  replace.output_file("--metrics", mine, train::OutputKind::metrics);
  EXPECT_EQ(refusal(replace), "");
  train::PathPlan own;
  own.output_file("--metrics", ours, train::OutputKind::metrics);
  own.output_file("--trace's swimlane", svg, train::OutputKind::svg);
  EXPECT_EQ(refusal(own), "");
  EXPECT_EQ(read(mine), "my notes\n");
}

TEST(OutputPolicy, UnusablePathsAreRefusedBeforeAnythingIsWritten) {
  meshtrain::testing::TempDir d("outputs");
  const std::string long_name(300, 'n');
  std::string deep = d.path().string();
  while (deep.size() < 5000) deep += "/" + std::string(200, 'd');
  fs::create_symlink(d.file("nowhere"), d.file("dangling"));
  const std::pair<std::string, std::string> cases[] = {
      {d.file(long_name), "NAME_MAX"},
      {deep, "PATH_MAX"},
      {d.file("dangling/ck"), "which does not exist"},
      {d.file("dangling"), "which does not exist"},
  };
  for (const auto& [path, why] : cases) {
    train::PathPlan plan;
    plan.output_checkpoint_dir("--checkpoint-dir", path);
    EXPECT_NE(refusal(plan).find(why), std::string::npos) << path.substr(0, 80) << ": " << refusal(plan);
  }
  EXPECT_FALSE(fs::exists(d.file("nowhere")));
}
