// Bad input to `meshtrain` is refused before anything runs: exit 2 and one sentence that names
// the flag, config field or file. One table, one row per kind of bad input (DESIGN "Interfaces",
// the error contract in docs/architecture.md). Every row must finish without training: the hang
// guard of each run is far shorter than a training run of the same arguments would take.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::run_cli;

struct Case {
  const char* name;
  std::string args;  // {D}: scratch directory, {C}: a good text corpus, {T}/{R}: over the caps
  int code;
  std::vector<std::string> phrases;  // each must appear in the output
  std::string absent = "";           // must not appear (a misleading flag name)
  int mpi_np = 0;                    // > 0: started by mpirun with this many processes
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name << ": " << c.args; }

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

template <class T>
void append(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// An llm.c token file: a 256 x int32 header (magic, version, count) and `tokens` uint16 tokens.
std::string llmc(int32_t version, int32_t count, int tokens) {
  std::string s;
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = version, header[2] = count;
  for (int32_t h : header) append(s, h);
  for (int i = 0; i < tokens; ++i) append(s, static_cast<uint16_t>(i % 200));
  return s;
}

std::string config(const std::string& fields) { return "{" + fields + "}"; }
const std::string kShape = R"("n_embd": 128, "n_head": 4, "vocab_size": 256, "block_size": 64)";

// The input files of every row, written once per test process.
const meshtrain::testing::TempDir& scratch() {
  static meshtrain::testing::TempDir dir = [] { return meshtrain::testing::TempDir("cli_refusals"); }();
  static bool written = [] {
    const fs::path d = dir.path();
    std::string text;
    for (int i = 0; i < 2000; ++i) text += "to be or not to be, that is the question. ";
    write(d / "corpus.txt", text);
    write(d / "empty.txt", "");
    write(d / "short.txt", "abc");
    write(d / "odd.bin", "abc");
    std::string vocab;
    for (int i = 0; i < 4000; ++i) append(vocab, static_cast<uint16_t>(i % 300));  // ids up to 299
    write(d / "vocab.bin", vocab);
    write(d / "llmc_v2.bin", llmc(2, 2000, 2000));
    write(d / "llmc_count.bin", llmc(1, 5000, 2000));
    write(d / "llmc_short.bin", llmc(1, 0, 0).substr(0, 100));
    write(d / "empty.json", "{}");
    write(d / "blank.json", "");
    write(d / "array.json", "[1, 2]");
    write(d / "malformed.json", "{\"n_layer\": 4,\n \"n_embd\": 128,,}");
    write(d / "unknown_key.json", config(R"("n_lyer": 4, "n_layer": 4, )" + kShape));
    write(d / "fraction.json", config(R"("n_layer": 2.7, )" + kShape));
    write(d / "string.json", config(R"("n_layer": "four", )" + kShape));
    write(d / "list.json", config(R"("n_layer": [4], )" + kShape));
    write(d / "huge_layer.json", config(R"("n_layer": 1e30, )" + kShape));
    write(d / "zero_layer.json", config(R"("n_layer": 0, )" + kShape));
    write(d / "long_seq.json", config(R"("n_layer": 4, "seq": 128, )" + kShape));
    write(d / "name.json", config(R"("name": 7, "n_layer": 4, )" + kShape));
    write(d / "heads.json", config(R"("n_layer": 4, "n_embd": 130, "n_head": 4, "vocab_size": 256, "block_size": 64)"));
    write(d / "vocab1.json", config(R"("n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 1, "block_size": 64)"));
    write(d / "wide.json", config(R"("n_layer": 4, "n_embd": 1000000000, "n_head": 4, "vocab_size": 256, "block_size": 64)"));
    write(d / "deep.json", config(R"("n_layer": 1000000, )" + kShape));
    fs::create_directories(d / "config_dir.json");
    return true;
  }();
  (void)written;
  return dir;
}

// Values over the thread caps of train/validate.h on this machine, and at least the issue's.
int64_t cores() { return std::max(1u, std::thread::hardware_concurrency()); }

std::string expand(std::string s) {
  auto replace = [&](const std::string& key, const std::string& value) {
    for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + value.size()))
      s.replace(at, key.size(), value);
  };
  const std::string d = scratch().path().string();
  replace("{C}", d + "/corpus.txt");
  replace("{D}", d);
  replace("{T}", std::to_string(std::max<int64_t>(300, 4 * cores() + 1)));
  replace("{R}", std::to_string(std::max<int64_t>(1000, 16 * cores() + 1)));
  return s;
}

const std::string kTrain = "train --data {C} --steps 1 ";

const Case kCases[] = {
    // ---- flags the parser refuses ----
    {"UnknownFlag", kTrain + "--frobnicate 3", 2, {"--frobnicate"}},
    {"NonNumericSteps", kTrain + "--steps abc", 2, {"--steps", "abc"}},
    {"NonNumericLr", kTrain + "--lr fast", 2, {"--lr"}},
    {"FractionalSteps", kTrain + "--steps 2.5", 2, {"--steps", "whole number"}},
    {"StepsOverflow", kTrain + "--steps 99999999999999999999999", 2, {"--steps", "out of range"}},
    {"NegativeSeed", kTrain + "--seed -1", 2, {"--seed", "out of range"}},
    {"NegativeBatch", kTrain + "--batch -5", 2, {"--batch"}},
    {"ZeroBatch", kTrain + "--batch 0", 2, {"--batch"}},
    {"NegativeSeq", kTrain + "--seq -7", 2, {"--seq"}},
    {"ZeroSteps", "train --data {C} --steps 0", 2, {"--steps"}},
    {"NegativeWarmup", kTrain + "--warmup -5", 2, {"--warmup"}},
    {"NegativeKeepCheckpoints", kTrain + "--keep-checkpoints -1", 2, {"--keep-checkpoints"}},
    {"NegativeThreads", kTrain + "--threads -3", 2, {"--threads"}},
    {"ZeroEvalBatches", kTrain + "--eval-batches 0", 2, {"--eval-batches"}},
    {"UnknownModel", kTrain + "--model gpt-enormous", 2, {"gpt-enormous", "gpt-tiny"}},
    {"UnknownDataOrder", kTrain + "--data-order shuffled", 2, {"shuffled", "sequential"}},
    {"BadStaleness", kTrain + "--dp 2 --batch 4 --ps-servers 1 --staleness soon", 2, {"--staleness", "soon"}},
    // ---- ranges and finiteness ----
    {"SeqLongerThanModel", kTrain + "--seq 65", 2, {"--seq", "64"}},
    {"Beta2AboveOne", kTrain + "--beta2 2", 2, {"--beta2"}},
    {"Beta2One", kTrain + "--beta2 1", 2, {"--beta2"}},
    {"NegativeGradClip", kTrain + "--grad-clip -1", 2, {"--grad-clip"}},
    {"NegativeWeightDecay", kTrain + "--weight-decay -100", 2, {"--weight-decay"}},
    {"InfiniteLr", kTrain + "--lr inf", 2, {"--lr", "finite"}},
    {"NanLr", kTrain + "--lr nan", 2, {"--lr", "finite"}},
    {"ZeroLr", kTrain + "--lr 0", 2, {"--lr"}},
    {"NegativeMinLr", kTrain + "--min-lr -1", 2, {"--min-lr"}},
    // ---- the optimizer and its schedule: each flag in range, and only with what reads it ----
    {"UnknownOptimizer", kTrain + "--optimizer adam", 2, {"--optimizer", "'adam'", "adamw, sgd or lamb"}},
    {"MomentumWithAdamw", kTrain + "--momentum 0.5", 2, {"--momentum", "--optimizer sgd", "adamw"}},
    {"NesterovWithLamb", kTrain + "--optimizer lamb --nesterov", 2, {"--nesterov", "--optimizer sgd", "lamb"}},
    {"Beta2WithSgd", kTrain + "--optimizer sgd --beta2 0.9", 2, {"--beta2", "adamw or lamb"}},
    {"MomentumOne", kTrain + "--optimizer sgd --momentum 1", 2, {"--momentum", "below 1"}},
    {"NanMomentum", kTrain + "--optimizer sgd --momentum nan", 2, {"--momentum"}},
    {"NegativeMomentum", kTrain + "--optimizer sgd --momentum -0.5", 2, {"--momentum"}},
    {"NesterovWithoutMomentum", kTrain + "--optimizer sgd --momentum 0 --nesterov", 2, {"--nesterov", "momentum"}},
    {"UnknownLrSchedule", kTrain + "--lr-schedule linear", 2, {"--lr-schedule", "'linear'"}},
    {"StepEveryWithCosine", kTrain + "--lr-step-every 10", 2, {"--lr-step-every", "--lr-schedule step"}},
    {"StepGammaWithCosine", kTrain + "--lr-step-gamma 0.5", 2, {"--lr-step-gamma", "--lr-schedule step"}},
    {"StepScheduleWithoutEvery", kTrain + "--lr-schedule step", 2, {"--lr-step-every"}},
    {"ZeroStepEvery", kTrain + "--lr-schedule step --lr-step-every 0", 2, {"--lr-step-every"}},
    {"StepGammaAboveOne", kTrain + "--lr-schedule step --lr-step-every 5 --lr-step-gamma 2", 2,
     {"--lr-step-gamma", "at most 1"}},
    {"NanStepGamma", kTrain + "--lr-schedule step --lr-step-every 5 --lr-step-gamma nan", 2, {"--lr-step-gamma"}},
    {"MinLrWithStepSchedule", kTrain + "--lr-schedule step --lr-step-every 5 --min-lr 0.0001", 2,
     {"--min-lr", "cosine"}},
    {"NegativeWeightDecayForSgd", kTrain + "--optimizer sgd --weight-decay -1", 2, {"--weight-decay"}},
    {"EmptyOptimizer", kTrain + "--optimizer ''", 2, {"--optimizer", "empty"}},
    {"NanBucket", kTrain + "--dp 2 --batch 4 --bucket-mb nan", 2, {"--bucket-mb", "nan"}, "must be positive"},
    {"InfiniteBucket", kTrain + "--dp 2 --batch 4 --bucket-mb inf", 2, {"--bucket-mb", "inf"}, "must be positive"},
    {"HugeBucket", kTrain + "--dp 2 --batch 4 --bucket-mb 1e30", 2, {"--bucket-mb", "1 TiB"}, "must be positive"},
    {"NegativeBucket", kTrain + "--dp 2 --batch 4 --bucket-mb -1", 2, {"--bucket-mb"}},
    {"ZeroValFraction", kTrain + "--val-fraction 0", 2, {"--val-fraction"}},
    {"ValFractionOne", kTrain + "--val-fraction 1", 2, {"--val-fraction"}},
    {"ValFractionTooSmall", kTrain + "--val-fraction 0.0001", 2, {"validation"}},
    {"ZeroSlowWorker", kTrain + "--dp 2 --batch 4 --ps-servers 1 --slow-worker 0.5", 2, {"--slow-worker"}},
    {"SlowWorkerWithoutServer", kTrain + "--slow-worker 3", 2, {"--slow-worker", "--ps-servers"}},
    // ---- layout rules ----
    {"BatchNotDivisibleByDp", kTrain + "--batch 5 --dp 2", 2, {"--batch 5", "--dp 2"}},
    {"RowsNotDivisibleByMicrobatches", kTrain + "--microbatches 5", 2, {"--microbatches"}},
    {"HeadsNotDivisibleByTp", kTrain + "--tp 3", 2, {"--tp 3"}},
    {"ZeroWithParameterServer", kTrain + "--dp 2 --batch 4 --ps-servers 1 --zero 1", 2, {"ZeRO", "--ps-servers"}},
    {"ZeroStageFour", kTrain + "--zero 4", 2, {"--zero"}},
    {"MoreStagesThanLayers", kTrain + "--pp 5", 2, {"4 blocks", "--pp"}},
    {"PpBalanceWrongSum", kTrain + "--pp 2 --pp-balance 3,2", 2, {"--pp-balance", "sum to 4"}},
    {"PpBalanceNotANumber", kTrain + "--pp 2 --pp-balance 2,two", 2, {"--pp-balance", "'two'"}},
    {"InterleavedLayersNotDivisible", kTrain + "--pp 2 --schedule interleaved --chunks 3 --microbatches 2", 2, {"--chunks", "6 equal stages"}},
    {"InterleavedWithoutChunks", kTrain + "--pp 2 --schedule interleaved", 2, {"--chunks 2"}},
    {"InterleavedMicrobatches", kTrain + "--pp 2 --schedule interleaved --chunks 2 --microbatches 3", 2, {"--microbatches 3", "multiple of 2"}},
    {"MicrobatchesNotDividingPipelineRows", kTrain + "--pp 2 --microbatches 5", 2, {"--microbatches"}},

    {"UnknownSchedule", kTrain + "--schedule sideways", 2, {"--schedule", "sideways"}},
    {"UnknownBackend", kTrain + "--backend carrier-pigeon", 2, {"--backend"}},
    {"SequenceParallelWithoutTp", kTrain + "--sequence-parallel", 2, {"--sequence-parallel", "--tp"}},
    {"CheckpointEveryWithoutDir", kTrain + "--checkpoint-every 1", 2, {"--checkpoint-dir"}},
    {"ParameterServerCheckpoints", kTrain + "--dp 2 --batch 4 --ps-servers 1 --checkpoint-dir {D}/ps --checkpoint-every 1",
     2, {"parameter server", "checkpoint"}},
    // ---- threads and ranks against the cores ----
    {"ThreadsOverCap", kTrain + "--threads {T}", 2, {"--threads", "core"}},
    {"ThreadsHuge", kTrain + "--threads 100000", 2, {"--threads", "core"}},
    {"DpOverRankCap", "train --data {C} --steps 1 --dp {R} --batch {R}", 2, {"ranks", "core"}},
    {"ParameterServersOverRankCap", kTrain + "--dp 2 --batch 4 --ps-servers {R}", 2, {"--ps-servers", "core"}},
    // ---- memory against the machine ----
    {"BatchOverMemory", kTrain + "--batch 100000000", 2, {"memory", "available"}},
    {"WideModelOverMemory", kTrain + "--config {D}/wide.json", 2, {"memory", "available"}},
    {"DeepModelOverMemory", kTrain + "--config {D}/deep.json", 2, {"memory", "available"}},
    // ---- output paths ----
    {"MetricsInMissingDirectory", kTrain + "--metrics {D}/missing/m.jsonl", 2, {"--metrics", "does not exist"}},
    {"MetricsIsDirectory", kTrain + "--metrics {D}", 2, {"--metrics", "directory"}},
    {"TraceInMissingDirectory", kTrain + "--trace {D}/missing/t.json", 2, {"--trace", "does not exist"}},
    {"CheckpointDirIsFile", kTrain + "--checkpoint-dir {C} --checkpoint-every 1", 2, {"--checkpoint-dir", "file"}},
    {"CheckpointDirUnderFile", kTrain + "--checkpoint-dir {C}/ck --checkpoint-every 1", 2, {"--checkpoint-dir", "file"}},
    // ---- data files ----
    {"MissingDataArgument", "train --steps 1", 2, {"--data"}},
    {"MissingDataFile", "train --data {D}/nonexistent.txt --steps 1", 2, {"nonexistent.txt", "does not exist"}},
    {"EmptyDataFile", "train --data {D}/empty.txt --steps 1", 2, {"empty.txt", "empty"}},
    {"DataFileIsDirectory", "train --data {D} --steps 1", 2, {"directory"}},
    {"TooShortDataFile", "train --data {D}/short.txt --steps 1", 2, {"short.txt", "too short"}},
    {"OddLengthBin", "train --data {D}/odd.bin --steps 1", 2, {"odd.bin", "odd size"}},
    {"OutOfVocabularyBin", "train --data {D}/vocab.bin --steps 1", 2, {"vocab.bin", "299", "vocab_size"}},
    {"LlmcVersion2", "train --data {D}/llmc_v2.bin --steps 1", 2, {"llmc_v2.bin", "version 2"}},
    {"LlmcCountMismatch", "train --data {D}/llmc_count.bin --steps 1", 2, {"llmc_count.bin", "5000"}},
    {"LlmcTruncatedHeader", "train --data {D}/llmc_short.bin --steps 1", 2, {"llmc_short.bin", "header"}},
    // ---- model config files ----
    {"ConfigMissing", kTrain + "--config {D}/none.json", 2, {"none.json"}},
    {"ConfigIsDirectory", kTrain + "--config {D}/config_dir.json", 2, {"config_dir.json", "directory"}},
    {"ConfigMalformed", kTrain + "--config {D}/malformed.json", 2, {"malformed.json", "line 2"}, "json.exception"},
    {"ConfigBlank", kTrain + "--config {D}/blank.json", 2, {"blank.json", "empty"}, "json.exception"},
    {"ConfigNotObject", kTrain + "--config {D}/array.json", 2, {"array.json", "object"}},
    {"ConfigEmptyObject", kTrain + "--config {D}/empty.json", 2, {"empty.json", "missing", "n_layer"}},
    {"ConfigUnknownKey", kTrain + "--config {D}/unknown_key.json", 2, {"unknown_key.json", "n_lyer"}},
    {"ConfigFraction", kTrain + "--config {D}/fraction.json", 2, {"fraction.json", "n_layer", "2.7"}},
    {"ConfigString", kTrain + "--config {D}/string.json", 2, {"string.json", "n_layer", "four"}, "type_error"},
    {"ConfigList", kTrain + "--config {D}/list.json", 2, {"list.json", "n_layer"}, "type_error"},
    {"ConfigHugeLayer", kTrain + "--config {D}/huge_layer.json", 2, {"huge_layer.json", "n_layer", "2147483647"},
     "at least 1"},
    {"ConfigZeroLayer", kTrain + "--config {D}/zero_layer.json", 2, {"zero_layer.json", "n_layer"}},
    {"ConfigSeqLongerThanBlock", kTrain + "--config {D}/long_seq.json", 2, {"long_seq.json", "\"seq\"", "block_size"},
     "--seq"},
    {"ConfigNameNotString", kTrain + "--config {D}/name.json", 2, {"name.json", "\"name\""}},
    {"ConfigHeadsNotDividing", kTrain + "--config {D}/heads.json", 2, {"heads.json", "n_head"}},
    {"ConfigVocabularyOne", kTrain + "--config {D}/vocab1.json", 2, {"vocab1.json", "vocab_size"}},
    // ---- generate ----
    {"GenerateZeroThreads", "generate --checkpoint {D}/none --threads 0", 2, {"--threads"}},
    {"GenerateNegativeThreads", "generate --checkpoint {D}/none --threads -2", 2, {"--threads"}},
    {"GenerateHugeThreads", "generate --checkpoint {D}/none --threads 100000", 2, {"--threads", "core"}},
    {"GenerateNegativeTokens", "generate --checkpoint {D}/none --tokens -5", 2, {"--tokens"}},
    {"GenerateNanTemperature", "generate --checkpoint {D}/none --temperature nan", 2, {"--temperature"}},
    {"GenerateMissingCheckpoint", "generate --checkpoint {D}/none", 2, {"none"}},
    // ---- bench comm ----
    {"BenchWorldZero", "bench comm --world 0 --sizes 4K", 2, {"--world"}},
    {"BenchWorldNegative", "bench comm --world -3 --sizes 4K", 2, {"--world"}},
    {"BenchWorldOverRankCap", "bench comm --world 100000 --sizes 4K", 2, {"--world", "core"}},
    {"BenchIterationsZero", "bench comm --iters 0 --sizes 4K", 2, {"--iters"}},
    {"BenchBadSize", "bench comm --sizes 4Q", 2, {"--sizes", "4Q"}},
    // ---- mpirun ----
    {"MpiBackendWithoutMpirun", kTrain + "--backend mpi", 2, {"--backend mpi"}},
    {"MpirunWorldNotLayout", kTrain + "--dp 2 --batch 4", 2, {"mpirun started 3", "-np"}, "", 3},
};

class CliRefusal : public ::testing::TestWithParam<Case> {};

TEST_P(CliRefusal, ExitsWithASentence) {
  const Case& c = GetParam();
  std::string prefix;
  if (c.mpi_np > 0) {
#ifndef MESHTRAIN_HAVE_MPI
    GTEST_SKIP() << "this build has no MPI backend";
#endif
    prefix = "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(c.mpi_np);
  }
  // Refusals come before any step; the guard only catches a run that started training.
  const auto r = run_cli(expand(c.args), /*timeout_s=*/c.mpi_np > 0 ? 120 : 60, prefix);
  EXPECT_EQ(r.code, c.code) << r.output;
  for (const std::string& phrase : c.phrases) {
    EXPECT_NE(r.output.find(expand(phrase)), std::string::npos) << "'" << phrase << "' missing in: " << r.output;
  }
  if (!c.absent.empty()) {
    EXPECT_EQ(r.output.find(c.absent), std::string::npos) << r.output;
  }
  // Never a crash or a library's raw text, and no training step.
  for (const char* raw : {"terminate called", "std::", "what()", "[json.exception", "bad_alloc", "step     1/"})
    EXPECT_EQ(r.output.find(raw), std::string::npos) << raw << " in: " << r.output;
}

INSTANTIATE_TEST_SUITE_P(Table, CliRefusal, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
