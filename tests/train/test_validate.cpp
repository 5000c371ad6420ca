// The validation pass of train/validate.h: every flag's range, the cross-option rules, the
// thread and rank caps against a given machine, the memory estimate against the model's real
// parameters, and the output-path checks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/model/gpt.h"
#include "meshtrain/train/validate.h"
#include "temp_dir.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

const train::Machine kMachine{.cores = 2, .memory_bytes = int64_t{1} << 40, .memory_source = "a test machine"};

train::TrainOptions good_options() {
  train::TrainOptions o;
  o.model = "gpt-tiny";
  o.data = "corpus.txt";  // not opened by validate_options
  o.batch = 12;
  o.seq = 64;
  o.steps = 10;
  return o;
}

const model::GPTConfig& tiny() {
  static model::GPTConfig c = model::gpt_config("gpt-tiny");
  return c;
}

// The message validate_options throws for `o` (fails the test if it accepts).
std::string refusal(const train::TrainOptions& o, const train::Machine& m = kMachine) {
  try {
    train::validate_options(o, tiny(), m);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Validate, GoodOptionsPass) {
  EXPECT_NO_THROW(train::validate_options(good_options(), tiny(), kMachine));
  auto o = good_options();
  o.dp = 2, o.zero = 2, o.microbatches = 2, o.threads = 4, o.bucket_bytes = 1 << 20;
  EXPECT_NO_THROW(train::validate_options(o, tiny(), kMachine));
}

TEST(Validate, EveryFlagOutsideItsRangeIsNamed) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  constexpr auto sgd = train::OptimizerKind::sgd, lamb = train::OptimizerKind::lamb;
  constexpr auto step = train::LrSchedule::step;
  struct Bad {
    const char* flag;
    std::function<void(train::TrainOptions&)> set;
  };
  const std::vector<Bad> cases = {
      {"--data", [](auto& o) { o.data.clear(); }},
      {"--steps", [](auto& o) { o.steps = 0; }},
      {"--batch", [](auto& o) { o.batch = -5; }},
      {"--seq", [](auto& o) { o.seq = -7; }},
      {"--seq", [](auto& o) { o.seq = 65; }},
      {"--lr", [](auto& o) { o.optim.lr = 0; }},
      {"--lr", [=](auto& o) { o.optim.lr = static_cast<float>(inf); }},
      {"--lr", [=](auto& o) { o.optim.lr = static_cast<float>(nan); }},
      {"--min-lr", [](auto& o) { o.optim.min_lr = -1; }},
      {"--warmup", [](auto& o) { o.optim.warmup_steps = -5; }},
      {"--weight-decay", [](auto& o) { o.optim.weight_decay = -100; }},
      {"--weight-decay", [=](auto& o) { o.optim.weight_decay = static_cast<float>(nan); }},
      {"--beta2", [](auto& o) { o.optim.beta2 = 2; }},
      {"--beta2", [](auto& o) { o.optim.beta2 = 1; }},
      {"--beta2", [](auto& o) { o.optim.beta2 = -0.1f; }},
      {"--beta2", [](auto& o) { o.optim.kind = lamb, o.optim.beta2 = 1; }},
      {"--momentum", [](auto& o) { o.optim.kind = sgd, o.optim.momentum = 1; }},
      {"--momentum", [=](auto& o) { o.optim.kind = sgd, o.optim.momentum = static_cast<float>(nan); }},
      {"--nesterov", [](auto& o) { o.optim.kind = sgd, o.optim.momentum = 0, o.optim.nesterov = true; }},
      {"--lr-step-every", [](auto& o) { o.optim.schedule = step; }},
      {"--lr-step-gamma", [](auto& o) { o.optim.schedule = step, o.optim.step_every = 5, o.optim.step_gamma = 0; }},
      {"--lr-step-gamma", [=](auto& o) { o.optim.schedule = step, o.optim.step_every = 5, o.optim.step_gamma = 1.5f; }},
      {"--grad-clip", [](auto& o) { o.optim.grad_clip = -1; }},
      {"--grad-clip", [=](auto& o) { o.optim.grad_clip = static_cast<float>(inf); }},
      {"--val-fraction", [](auto& o) { o.val_fraction = 0; }},
      {"--val-fraction", [](auto& o) { o.val_fraction = 1; }},
      {"--val-fraction", [=](auto& o) { o.val_fraction = nan; }},
      {"--eval-every", [](auto& o) { o.eval_every = -1; }},
      {"--eval-batches", [](auto& o) { o.eval_batches = 0; }},
      {"--checkpoint-every", [](auto& o) { o.checkpoint_every = -1; }},
      {"--keep-checkpoints", [](auto& o) { o.keep_checkpoints = -1; }},
      {"--log-every", [](auto& o) { o.log_every = -1; }},
      {"--threads", [](auto& o) { o.threads = -3; }},
      {"--dp", [](auto& o) { o.dp = 0; }},
      {"--microbatches", [](auto& o) { o.microbatches = 0; }},
      {"--microbatches", [](auto& o) { o.microbatches = 5; }},
      {"--dp", [](auto& o) { o.dp = 5; }},
      {"--zero", [](auto& o) { o.zero = 4; }},
      {"--schedule", [](auto& o) { o.schedule = "sideways"; }},
      {"--ps-servers", [](auto& o) { o.ps_servers = -1; }},
      {"--staleness", [](auto& o) { o.staleness = -2; }},
      {"--slow-worker", [](auto& o) { o.slow_worker_factor = 3; }},  // without --ps-servers
      {"--slow-worker", [=](auto& o) { o.ps_servers = 1, o.dp = 2, o.slow_worker_factor = inf; }},
      {"--ps-servers", [](auto& o) { o.ps_servers = 1, o.dp = 2, o.zero = 1; }},
      {"--ps-servers", [](auto& o) { o.ps_servers = 1, o.dp = 2, o.tp = 2; }},
      {"--backend", [](auto& o) { o.backend = "carrier-pigeon"; }},
      {"--checkpoint-dir", [](auto& o) { o.checkpoint_every = 5; }},
      {"--tp", [](auto& o) { o.tp = 3; }},
      {"--pp", [](auto& o) { o.pp = 5; }},  // 5 stages for gpt-tiny's 4 blocks
      {"--pp-balance", [](auto& o) { o.pp = 2, o.pp_balance = "3,2"; }},
      {"--pp-balance", [](auto& o) { o.pp = 2, o.pp_balance = "4,x"; }},
      {"--pp-balance", [](auto& o) { o.pp_balance = "2,2"; }},  // without --pp
      {"--chunks", [](auto& o) { o.pp = 2, o.schedule = "interleaved", o.chunks = 3, o.microbatches = 2; }},
      {"--chunks", [](auto& o) { o.pp = 2, o.schedule = "interleaved"; }},
      {"--chunks", [](auto& o) { o.pp = 2, o.chunks = 2; }},  // 1f1b runs one chunk
      {"--bucket-mb", [](auto& o) { o.dp = 2, o.bucket_bytes = -1; }},
  };
  for (const Bad& b : cases) {
    auto o = good_options();
    b.set(o);
    std::string m = refusal(o);
    EXPECT_TRUE(contains(m, b.flag)) << b.flag << ": " << m;
  }
}

TEST(Validate, ThreadsAreCappedAgainstTheCores) {
  auto o = good_options();
  o.threads = train::kThreadsPerCore * kMachine.cores;
  EXPECT_NO_THROW(train::validate_options(o, tiny(), kMachine));
  o.threads += 1;
  std::string m = refusal(o);
  EXPECT_TRUE(contains(m, "--threads")) << m;
  EXPECT_TRUE(contains(m, std::to_string(train::kThreadsPerCore * kMachine.cores))) << m;  // the cap is stated
  train::Machine bigger = kMachine;
  bigger.cores = 4;
  EXPECT_NO_THROW(train::validate_options(o, tiny(), bigger));
}

TEST(Validate, RanksAreCappedAgainstTheCores) {
  const int cap = train::kRanksPerCore * kMachine.cores;
  auto o = good_options();
  o.dp = cap, o.batch = cap;
  EXPECT_NO_THROW(train::validate_options(o, tiny(), kMachine));
  o.dp = cap + 1, o.batch = cap + 1;
  EXPECT_TRUE(contains(refusal(o), std::to_string(cap)));
  o = good_options();
  o.dp = 2, o.batch = 2, o.ps_servers = cap - 1;
  EXPECT_TRUE(contains(refusal(o), "--ps-servers"));
  // Ranks x kernel threads in one process.
  o = good_options();
  o.dp = 6, o.threads = train::kThreadsPerCore * kMachine.cores;  // 6 x 8 = 48 > 32
  std::string m = refusal(o);
  EXPECT_TRUE(contains(m, "--threads")) << m;
  EXPECT_THROW(train::check_ranks("--world", cap + 1, 0, kMachine), std::invalid_argument);
  EXPECT_NO_THROW(train::check_ranks("--world", cap, 0, kMachine));
  EXPECT_THROW(train::check_threads("--threads", 0, kMachine, /*zero_means_auto=*/false), std::invalid_argument);
  EXPECT_NO_THROW(train::check_threads("--threads", 0, kMachine, /*zero_means_auto=*/true));
}

TEST(Validate, MemoryEstimateCountsTheModelsRealParameters) {
  // Parameters as the built model holds them, not the estimate's own formula.
  model::GPT gpt(tiny(), 1);
  double numel = 0;
  for (nn::Param* p : gpt.params()) numel += static_cast<double>(p->numel());
  auto o = good_options();
  const auto spec = model::gpt_spec(tiny());
  train::MemoryEstimate e = train::estimate_memory(o, *spec);
  EXPECT_DOUBLE_EQ(e.params, 4 * numel);
  EXPECT_DOUBLE_EQ(e.grads, 4 * numel);
  EXPECT_DOUBLE_EQ(e.optimizer, 8 * numel);
  EXPECT_GE(e.activations, tiny().activation_bytes(o.batch, o.seq) * 0.9);
  // Two data-parallel ranks in one process: two replicas; ZeRO-1 shards the moments over them.
  o.dp = 2;
  train::MemoryEstimate dp2 = train::estimate_memory(o, *spec);
  EXPECT_DOUBLE_EQ(dp2.params, 2 * e.params);
  EXPECT_DOUBLE_EQ(dp2.optimizer, 2 * e.optimizer);
  o.zero = 1;
  EXPECT_DOUBLE_EQ(train::estimate_memory(o, *spec).optimizer, e.optimizer);
}

TEST(Validate, RunsThatCannotFitAreRefusedWithBothFigures) {
  auto o = good_options();
  const double need = train::estimate_memory(o, *model::gpt_spec(tiny())).total();
  train::Machine small = kMachine;
  small.memory_bytes = static_cast<int64_t>(need) - 1;
  std::string m = refusal(o, small);
  EXPECT_TRUE(contains(m, train::format_bytes(need))) << m;
  EXPECT_TRUE(contains(m, train::format_bytes(static_cast<double>(small.memory_bytes)))) << m;
  EXPECT_TRUE(contains(m, "a test machine")) << m;
  small.memory_bytes = static_cast<int64_t>(need) + 1;
  EXPECT_NO_THROW(train::validate_options(o, tiny(), small));
  small.memory_bytes = 0;  // unknown: no check
  o.batch = 1 << 24;
  EXPECT_NO_THROW(train::validate_options(o, tiny(), small));
  // A model whose parameter count overflows int64 is still measured (in double) and refused.
  model::GPTConfig wide = tiny();
  wide.n_embd = 1000000000, wide.n_head = 4;
  EXPECT_GT(train::estimate_memory(good_options(), *model::gpt_spec(wide)).total(), 1e19);
  EXPECT_THROW(train::validate_options(good_options(), wide, kMachine), std::invalid_argument);
}

TEST(Validate, MachineProbeReadsThisMachine) {
  train::Machine m = train::Machine::probe();
  EXPECT_GE(m.cores, 1);
  if (fs::exists("/proc/meminfo")) {
    EXPECT_GT(m.memory_bytes, 0);
  }
}

TEST(Validate, BucketSizeIsAFiniteRange) {
  EXPECT_EQ(train::bucket_bytes_from_mb(4), 4 << 20);
  for (double mb : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e30, 1e-9}) {
    try {
      train::bucket_bytes_from_mb(mb);
      ADD_FAILURE() << mb << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "--bucket-mb")) << e.what();
      EXPECT_FALSE(contains(e.what(), "must be positive")) << e.what();
    }
  }
}

TEST(Validate, OutputPathsAreCheckedUpFront) {
  meshtrain::testing::TempDir dir("validate");
  const std::string file = dir.file("a_file");
  std::ofstream(file) << "x";
  auto o = good_options();
  o.metrics = dir.file("metrics.jsonl");
  o.trace = dir.file("t.json");
  o.checkpoint_dir = dir.file("new/ckpt");  // created when needed
  EXPECT_NO_THROW(train::validate_options(o, tiny(), kMachine));
  auto with = [&](auto set) {
    auto b = good_options();
    set(b);
    return refusal(b);
  };
  EXPECT_TRUE(contains(with([&](auto& b) { b.metrics = dir.file("missing/m.jsonl"); }), "--metrics"));
  EXPECT_TRUE(contains(with([&](auto& b) { b.metrics = dir.path().string(); }), "directory"));
  EXPECT_TRUE(contains(with([&](auto& b) { b.trace = dir.file("missing/t.json"); }), "--trace"));
  EXPECT_TRUE(contains(with([&](auto& b) { b.checkpoint_dir = file; }), "--checkpoint-dir"));
  EXPECT_TRUE(contains(with([&](auto& b) { b.checkpoint_dir = file + "/below"; }), "--checkpoint-dir"));
  EXPECT_TRUE(contains(with([&](auto& b) { b.metrics = file + "/m.jsonl"; }), "--metrics"));
}

TEST(Validate, DatasetChecks) {
  auto o = good_options();
  o.seq = 16;
  std::vector<uint16_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 200);
  EXPECT_NO_THROW(train::validate_dataset(o, tiny(), train::TokenDataset::from_tokens(tokens, 0.1)));
  // No validation tokens: refused before step 1, naming the flag.
  std::string m;
  try {
    train::validate_dataset(o, tiny(), train::TokenDataset::from_tokens(tokens, 0.0));
  } catch (const std::invalid_argument& e) {
    m = e.what();
  }
  EXPECT_TRUE(contains(m, "--val-fraction")) << m;
  // Token ids beyond the model's vocabulary.
  tokens[7] = 300;
  EXPECT_THROW(train::validate_dataset(o, tiny(), train::TokenDataset::from_tokens(tokens, 0.1)), std::invalid_argument);
  // Sequential order needs one whole batch in the training split.
  tokens[7] = 1;
  o.data_order = train::DataOrder::sequential;
  o.batch = 200;
  EXPECT_THROW(train::validate_dataset(o, tiny(), train::TokenDataset::from_tokens(tokens, 0.1)), std::invalid_argument);
}
