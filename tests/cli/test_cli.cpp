// The `meshtrain` program as a user meets it: bad input exits 2 with a sentence saying what
// to change; help works for every subcommand.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "temp_dir.h"

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

// One directory per test process: ctest runs the cases of this file side by side.
const meshtrain::testing::TempDir& scratch() {
  static meshtrain::testing::TempDir dir("cli");
  return dir;
}

std::string corpus() {
  std::string p = scratch().file("corpus.txt");
  if (!std::filesystem::exists(p)) {
    std::ofstream f(p);
    for (int i = 0; i < 2000; ++i) f << "to be or not to be, that is the question. ";
  }
  return p;
}

}  // namespace

TEST(Cli, HelpForEverySubcommand) {
  for (const char* sub : {"", "train ", "generate ", "bench ", "bench comm "}) {
    Result r = run(std::string(sub) + "--help");
    EXPECT_EQ(r.code, 0) << sub << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << sub;
  }
}

TEST(Cli, UnknownFlagExits2) {
  Result r = run("train --data x.txt --frobnicate 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--frobnicate"), std::string::npos) << r.output;
}

TEST(Cli, MissingDataFileExits2) {
  Result r = run("train --data /nonexistent/corpus.txt --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/corpus.txt"), std::string::npos) << r.output;
}

TEST(Cli, UnknownModelExits2) {
  Result r = run("train --model gpt-enormous --data " + corpus() + " --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("gpt-tiny"), std::string::npos) << "should list the known models: " << r.output;
}

TEST(Cli, BatchZeroExits2) {
  Result r = run("train --data " + corpus() + " --batch 0 --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--batch"), std::string::npos) << r.output;
}

TEST(Cli, ImpossibleLayoutExits2) {
  Result r = run("train --data " + corpus() + " --microbatches 5 --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--microbatches"), std::string::npos) << r.output;
}

TEST(Cli, TrainsAndWritesMetrics) {
  std::filesystem::path metrics = scratch().file("metrics.jsonl");
  Result r = run("train --data " + corpus() + " --batch 4 --seq 16 --steps 3 --eval-batches 2 --metrics " +
                 metrics.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("validation loss"), std::string::npos) << r.output;
  std::ifstream f(metrics);
  std::string line;
  int lines = 0;
  while (std::getline(f, line)) {
    ++lines;
    for (const char* key : {"\"step\"", "\"loss\"", "\"tokens_per_s\"", "\"step_ms\"", "\"lr\"", "\"mfu\"", "\"peak_rss_mb\""})
      EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
  }
  EXPECT_EQ(lines, 3);
}

TEST(Cli, GenerateSamplesFromACheckpoint) {
  std::filesystem::path dir = scratch().path() / "gen";
  std::filesystem::remove_all(dir);
  Result t = run("train --data " + corpus() + " --batch 4 --seq 16 --steps 2 --eval-batches 1 --quiet "
                 "--checkpoint-dir " + dir.string() + " --checkpoint-every 2");
  ASSERT_EQ(t.code, 0) << t.output;
  Result g = run("generate --checkpoint " + dir.string() + " --prompt Hello --tokens 40 --seed 3");
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_EQ(g.output.rfind("Hello", 0), 0u) << g.output;  // the prompt, then the sample
  EXPECT_GE(g.output.size(), 5u + 40u);
  Result again = run("generate --checkpoint " + dir.string() + " --prompt Hello --tokens 40 --seed 3");
  EXPECT_EQ(again.output, g.output);  // sampling is seeded
  Result missing = run("generate --checkpoint " + (dir / "nope").string() + " --prompt x");
  EXPECT_EQ(missing.code, 2) << missing.output;
  std::filesystem::remove_all(dir);
}

TEST(Cli, UnknownPrecisionExits2) {
  Result r = run("train --data " + corpus() + " --precision fp16 --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--precision must be fp32 or bf16"), std::string::npos) << r.output;
}

TEST(Cli, Bf16SaysWhatRunsItsProducts) {
  // Either oneDNN's bf16 kernels (AMX or AVX512-BF16) or, on a CPU with neither, a note saying
  // the products are emulated; the run trains in both cases.
  Result r = run("train --model gpt-tiny --data " + corpus() + " --precision bf16 --steps 2 --batch 2 --seq 16 --eval-every 0");
  EXPECT_EQ(r.code, 0) << r.output;
  const bool native = r.output.find("float32 accumulation on avx512_core_") != std::string::npos;
  const bool emulated = r.output.find("note: --precision bf16:") != std::string::npos &&
                        r.output.find("on emulated") != std::string::npos;
  EXPECT_TRUE(native != emulated) << r.output;
  // Without AMX (AVX512-BF16 only) the program says so.
  if (r.output.find("on avx512_core_bf16") != std::string::npos) {
    EXPECT_NE(r.output.find("note: --precision bf16: this CPU has no AMX tiles"), std::string::npos) << r.output;
  }
}

TEST(Cli, CommDtypeWithoutDataParallelExits2) {
  Result r = run("train --data " + corpus() + " --comm-dtype bf16 --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--comm-dtype bf16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--dp 2 or --tp 2"), std::string::npos) << r.output;
  r = run("train --data " + corpus() + " --dp 2 --comm-dtype int8 --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--comm-dtype must be fp32 or bf16"), std::string::npos) << r.output;
}
