// Data parallelism and ZeRO reproduce the single-rank loss curve (DESIGN decision 1): the same
// seed gives the same global batches, the ranks take slices, and gradients are averaged, so
// any dp and ZeRO stage must match the one-rank run to float32 round-off (1e-5 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "layout_fixture.h"
#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/parallel/data/data_parallel.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/tensor/tensor.h"
#include "meshtrain/train/trainer.h"
#include "temp_dir.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

train::TrainOptions options(int dp, int zero, int microbatches, int64_t bucket_bytes = 64 * 1024) {
  train::TrainOptions o = meshtrain::testing::layout_options(dp);
  o.zero = zero;
  o.microbatches = microbatches;
  o.bucket_bytes = bucket_bytes;
  return o;
}

const std::vector<float>& reference_curve() {
  static std::vector<float> curve = [] {
    auto r = train::train(options(1, 0, 1));
    std::vector<float> c;
    for (auto& s : r.steps) c.push_back(s.loss);
    return c;
  }();
  return curve;
}

void expect_same_curve(const train::TrainOptions& o) {
  const auto& ref = reference_curve();
  auto r = train::train(o);
  ASSERT_EQ(r.steps.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double rel = std::fabs(r.steps[i].loss - ref[i]) / std::fabs(ref[i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << "dp " << o.dp << " zero " << o.zero << " microbatches "
                         << o.microbatches << ": step " << i << " loss " << r.steps[i].loss
                         << " vs single-rank " << ref[i];
  }
  // The curve must actually move, or equality would prove nothing.
  EXPECT_LT(ref.back(), ref.front() - 0.5f);
}

}  // namespace

class DataParallelParity : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DataParallelParity, MatchesSingleRank) {
  auto [dp, zero] = GetParam();
  expect_same_curve(options(dp, zero, 1));
}

INSTANTIATE_TEST_SUITE_P(DpByZero, DataParallelParity,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_zero" +
                                  std::to_string(std::get<1>(info.param));
                         });

class GradientAccumulationParity : public ::testing::TestWithParam<int> {};

TEST_P(GradientAccumulationParity, MatchesSingleRank) {
  expect_same_curve(options(2, GetParam(), 3));
}

INSTANTIATE_TEST_SUITE_P(Dp2Micro3, GradientAccumulationParity, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

TEST(DataParallel, SingleRankAccumulationAndDefaultBucket) {
  expect_same_curve(options(1, 0, 4));
  expect_same_curve(options(4, 0, 1, 0));  // one default-size bucket
}

namespace {

// What each rank really holds after a step, counted by the tensor allocator: the rank thread
// builds the model, the data-parallel engine and AdamW, runs one step (forward, backward,
// gradient sync, update, all-gather), drops the step's activations, and reads the live bytes
// of the storage it allocated. A stage that kept what it should free (full gradients at
// ZeRO-2, a gathered unit at ZeRO-3, full optimizer state at ZeRO-1) shows up here, whatever
// DataParallel::memory() reports.
struct RankBytes {
  int64_t held = 0;      // live bytes allocated by the rank after the step
  int64_t leaked = 0;    // live bytes left after everything was destroyed
  int64_t buckets = 0;   // bucket count, for the uneven-slice tolerance
};

std::vector<RankBytes> measure_rank_bytes(const model::GPTConfig& cfg, int dp, int zero) {
  static const train::TokenDataset data = [] {
    std::vector<uint16_t> t;
    for (int i = 0; i < 20000; ++i) t.push_back(static_cast<uint16_t>((i * 31 + i / 7) % 256));
    return train::TokenDataset::from_tokens(std::move(t), 0.1);
  }();
  const int64_t B = 8, T = 32, rows = B / dp;
  std::vector<RankBytes> out(dp);
  comm::run_threads(dp, [&](comm::Communicator& world) {
    parallel::DeviceMesh mesh(world, {dp, 1, 1});
    const int r = mesh.rank();
    const int64_t before = tensor_bytes_live_thread();
    {
      auto gpt = parallel::build_gpt(cfg, 1337, nullptr, {});
      std::vector<parallel::Unit> units;
      std::vector<nn::Param*> root;
      for (nn::Param* p : gpt->params())
        if (p->name.rfind("h.", 0) != 0) root.push_back(p);
      units.push_back({&gpt->stage(), root});  // the stage runs the hooks of the whole model
      for (auto& b : gpt->stage().h) units.push_back({b.get(), b->params()});
      const int64_t n_units = static_cast<int64_t>(units.size());
      parallel::DataParallel ddp(std::move(units), mesh.dp_ptr(), {.zero = zero, .bucket_bytes = 64 * 1024});
      train::AdamW adam(ddp.optimizer_params(), {}, 1);
      std::vector<int32_t> tok(rows * T), tgt(rows * T);
      data.batch(train::Split::train, train::DataOrder::random, 1337, 0, B, T, r * rows,
                 (r + 1) * rows, tok.data(), tgt.data());
      ddp.begin_step();
      {
        nn::Context ctx(1);
        ctx.hooks = ddp.hooks();
        gpt->forward(ctx, tok.data(), tgt.data(), rows, T);
        gpt->backward(ctx);
      }
      ddp.finish_grad_sync();
      adam.step(0, [&](double local) { return ddp.reduce_grad_sq(local); });
      ddp.finish_optimizer_step();
      out[r].held = tensor_bytes_live_thread() - before;
      // Buckets: stage 3 has one per unit; below, at most one per 64 KiB of values plus one.
      out[r].buckets = zero == 3 ? n_units : 4 * static_cast<int64_t>(cfg.num_params()) / (64 * 1024) + 1;
    }
    out[r].leaked = tensor_bytes_live_thread() - before;
  });
  return out;
}

}  // namespace

TEST(DataParallel, ZeroStateBytesFollowTheFormulas) {
  // Per-rank persistent bytes at dp 4: params, grads, optimizer state (float32 Adam, 4 + 4 + 8
  // bytes per parameter), each divided by dp from its stage on. Uneven slices differ from the
  // exact quotient by less than one element (16 bytes of state) per bucket.
  const auto cfg = model::gpt_config("gpt-tiny");
  const int dp = 4;
  const double n = static_cast<double>(cfg.num_params());
  for (int zero = 0; zero <= 3; ++zero) {
    const double p = 4 * n / (zero >= 3 ? dp : 1), g = 4 * n / (zero >= 2 ? dp : 1),
                 s = 8 * n / (zero >= 1 ? dp : 1);
    auto ranks = measure_rank_bytes(cfg, dp, zero);
    for (int r = 0; r < dp; ++r) {
      const double tol = 16.0 * static_cast<double>(ranks[r].buckets);
      EXPECT_NEAR(static_cast<double>(ranks[r].held), p + g + s, tol)
          << "zero " << zero << " rank " << r << " holds " << ranks[r].held
          << " bytes after a step; the formula gives params " << p << " + grads " << g
          << " + optimizer " << s << " = " << p + g + s << " (excess "
          << static_cast<double>(ranks[r].held) - (p + g + s) << ")";
      EXPECT_EQ(ranks[r].leaked, 0) << "zero " << zero << " rank " << r;
    }
    // The trainer's per-rank report (printed with --zero) agrees with what is held.
    auto o = options(dp, zero, 1);
    o.steps = 1;
    auto rep = train::train(o).state_bytes;
    EXPECT_NEAR(static_cast<double>(rep.params + rep.grads + rep.optimizer),
                static_cast<double>(ranks[0].held), 16.0 * static_cast<double>(ranks[0].buckets))
        << "zero " << zero;
  }
}

TEST(DataParallel, BadLayoutsAreRefused) {
  auto o = options(5, 0, 1);  // 12 rows do not split over 5 ranks
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, 0, 4);  // 6 rows per rank do not split into 4 micro-batches
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(2, 4, 1);
  EXPECT_THROW(train::train(o), std::invalid_argument);
}

// A checkpoint saved at dp 2 with ZeRO-2 resumes at dp 1 (pieces of named logical tensors), and the
// resumed curve continues the uninterrupted one.
TEST(DataParallel, CheckpointResumesOnAnotherLayout) {
  meshtrain::testing::TempDir tmp("dp_ckpt");
  const fs::path dir = tmp.path() / "ck";
  const auto& ref = reference_curve();
  auto first = options(2, 2, 1);
  first.steps = 10;
  first.optim.decay_steps = 30;
  first.checkpoint_dir = dir.string();
  first.checkpoint_every = 10;
  train::train(first);
  for (auto [dp, zero] : {std::pair{1, 0}, std::pair{4, 3}}) {
    // Each resume from its own copy of the step-10 checkpoint (a resumed run saves its end).
    const fs::path copy = tmp.path() / ("ck_dp" + std::to_string(dp));
    fs::copy(dir, copy, fs::copy_options::recursive);
    auto second = options(dp, zero, 1);
    second.checkpoint_dir = copy.string();
    second.resume = true;
    auto r = train::train(second);
    ASSERT_EQ(r.start_step, 10);
    ASSERT_EQ(r.steps.size(), 20u);
    for (size_t i = 0; i < r.steps.size(); ++i)
      EXPECT_LT(std::fabs(r.steps[i].loss - ref[10 + i]) / ref[10 + i], 1e-5)
          << "dp " << dp << " zero " << zero << " step " << 10 + i;
  }
}

// ---- tensor parallelism through the trainer (the layers' own parity tests: test_tp_*.cpp) ----

TEST(TrainerLayouts, TensorParallelMatchesSingleRank) {
  for (auto [dp, tp, sp] : {std::tuple{1, 2, false}, std::tuple{1, 4, true}, std::tuple{2, 2, false}}) {
    auto o = options(dp, 0, 1);
    o.tp = tp;
    o.sequence_parallel = sp;
    SCOPED_TRACE("dp " + std::to_string(dp) + " tp " + std::to_string(tp) + (sp ? " sp" : ""));
    expect_same_curve(o);
  }
}

// Saved at tp 2, resumed at dp 2 (and the reverse is the same code path): pieces of named logical tensors.
TEST(TrainerLayouts, CheckpointFromTensorParallelResumesOnDataParallel) {
  meshtrain::testing::TempDir tmp("tp_ckpt");
  const fs::path dir = tmp.path() / "ck";
  const auto& ref = reference_curve();
  auto first = options(1, 0, 1);
  first.tp = 2;
  first.steps = 10;
  first.optim.decay_steps = 30;
  first.checkpoint_dir = dir.string();
  first.checkpoint_every = 10;
  train::train(first);
  auto second = options(2, 1, 1);
  second.checkpoint_dir = dir.string();
  second.resume = true;
  auto r = train::train(second);
  ASSERT_EQ(r.steps.size(), 20u);
  for (size_t i = 0; i < r.steps.size(); ++i)
    EXPECT_LT(std::fabs(r.steps[i].loss - ref[10 + i]) / ref[10 + i], 1e-5) << "step " << 10 + i;
}

// A vocabulary tp does not divide (257): refused without --pad-vocab; with it, trained at tp 2
// and saved, the checkpoint holds the (257, C) table and resumes at tp 1 on the single-rank curve.
TEST(TrainerLayouts, PaddedVocabularyTrainsAndResumesAtTp1) {
  meshtrain::testing::TempDir tmp("pad_ckpt");
  const fs::path dir = tmp.path();
  const fs::path cfg = dir / "tiny-v257.json";
  std::ofstream(cfg) << R"({"name": "tiny-v257", "n_layer": 4, "n_embd": 128, "n_head": 4,)"
                     << R"( "vocab_size": 257, "block_size": 64})";
  auto base = options(1, 0, 1);
  base.config_file = cfg.string();
  base.steps = 12;
  auto o = base;
  o.tp = 2;
  EXPECT_THROW(train::train(o), std::invalid_argument);  // no --pad-vocab
  const auto ref = train::train(base);  // tp 1: no padding
  auto first = base;
  first.tp = 2;
  first.pad_vocab = true;
  first.steps = 6;
  first.optim.decay_steps = 12;
  first.checkpoint_dir = (dir / "ck").string();
  first.checkpoint_every = 6;
  const auto a = train::train(first);
  auto second = base;
  second.checkpoint_dir = first.checkpoint_dir;
  second.resume = true;
  const auto b = train::train(second);
  ASSERT_EQ(a.steps.size(), 6u);
  ASSERT_EQ(b.start_step, 6);
  ASSERT_EQ(b.steps.size(), 6u);
  for (size_t i = 0; i < 12; ++i) {
    const float got = i < 6 ? a.steps[i].loss : b.steps[i - 6].loss, want = ref.steps[i].loss;
    EXPECT_LT(std::fabs(got - want) / want, 1e-5) << "step " << i;
  }
}

TEST(TrainerLayouts, ImpossibleTensorParallelLayoutsAreRefused) {
  auto o = options(1, 0, 1);
  o.tp = 3;  // gpt-tiny has 4 heads
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o.tp = 8;  // more ranks than heads
  EXPECT_THROW(train::train(o), std::invalid_argument);
  o = options(1, 0, 1);
  o.sequence_parallel = true;  // needs tp > 1
  EXPECT_THROW(train::train(o), std::invalid_argument);
}
