// The planner's cost and memory models (plan/cost.h) against what the code does:
//   - what a model says its layers save (ModelSpec::op_costs) is the tensor memory a stage's
//     forward in fact allocates and keeps (tensor_bytes_live_thread), for GPT and a CNN;
//   - its FLOPs are the model's own count (flops_per_sample);
//   - the memory model's peak per rank equals the peak tensor memory each rank of a real run
//     held (TrainResult::peak_tensor_bytes) at dp, ZeRO 1-3, tp, pp (GPipe, 1F1B), recomputation;
//   - the step-time model behaves as the schedules and collectives it replays do: the GPipe
//     bubble is (p - 1) / (m + p - 1) with free communication, faster hardware is faster,
//     ZeRO-3 costs more communication than ZeRO-0, data parallelism hides behind backward on a
//     device with room for it.
// Timing against a measured run is a benchmark (bench/plan_accuracy.sh), not a test: the suite
// runs on a loaded machine.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/model/spec.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/plan/cost.h"
#include "meshtrain/tensor/tensor.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/validate.h"
#include "temp_dir.h"
#include "train/cnn_runs.h"

using namespace meshtrain;

namespace {

// Hardware given by rates (no machine file): a device that computes beside its communication.
plan::Hardware device(double tflops = 100, int devices = 8) {
  plan::Hardware hw;
  hw.name = "test device";
  hw.nodes = 1, hw.devices_per_node = devices;
  hw.memory_bytes = 80e9;
  hw.peak_flops = hw.gemm_flops = hw.attention_flops = tflops * 1e12;
  hw.bytes_per_s = 1e12;
  hw.call_overhead_s = 1e-6;
  hw.intra = {2e-6, 1.0 / 100e9};
  hw.inter = {5e-6, 1.0 / 25e9};
  return hw;
}

// Tensor bytes a training forward of `stage` keeps (live after it minus before).
template <class Run>
int64_t kept_by_forward(Run run) {
  const int64_t before = tensor_bytes_live_thread();
  nn::Context ctx(1, true);
  run(ctx);
  const int64_t kept = tensor_bytes_live_thread() - before;
  ctx.clear();
  return kept;
}

}  // namespace

TEST(CostModel, GptSavedBytesAreWhatAForwardKeeps) {
  for (auto [layers, C, heads, V, rows, T] : std::vector<std::array<int64_t, 6>>{
           {2, 64, 4, 256, 3, 16}, {3, 96, 6, 97, 2, 24}, {1, 128, 4, 512, 5, 8}}) {
    model::GPTConfig cfg;
    cfg.n_layer = layers, cfg.n_embd = C, cfg.n_head = heads, cfg.vocab_size = V, cfg.block_size = 32;
    auto spec = model::gpt_spec(cfg);
    for (model::StageSpec st : {model::StageSpec::whole(), model::StageSpec{1, layers, false, true},
                                model::StageSpec{0, 1, true, false}}) {
      if (st.first_layer >= (st.end_layer < 0 ? layers : st.end_layer)) continue;
      auto stage = spec->make_stage(st, 1, {});
      std::vector<int32_t> tok(rows * T), tgt(rows * T);
      for (int64_t i = 0; i < rows * T; ++i) tok[i] = static_cast<int32_t>(i % V), tgt[i] = static_cast<int32_t>((i * 7) % V);
      model::MicroBatch mb{.tokens = tok.data(), .targets = tgt.data(), .rows = rows, .T = T};
      model::StageResult r;
      // The input (a received buffer) and the output are made inside and their handles
      // dropped: each counts when a layer keeps it.
      const int64_t kept = kept_by_forward([&](nn::Context& ctx) {
        Tensor x = st.embedding ? Tensor() : Tensor::zeros(stage->input_shape(rows, T));
        stage->forward(ctx, x, mb, &r, nullptr);
      });
      const auto ops = spec->op_costs(st, {rows, T, 1, false});
      EXPECT_EQ(static_cast<int64_t>(model::total_saved_bytes(ops)), kept)
          << "layers " << layers << " C " << C << " stage " << st.first_layer << ".." << st.end_layer;
    }
  }
}

TEST(CostModel, CnnSavedBytesAreWhatAForwardKeeps) {
  for (const char* name : {"cnn-small", "resnet-small"}) {
    auto spec = model::model_spec(name);
    const int64_t rows = 3;
    auto stage = spec->make_stage(model::StageSpec::whole(), 1, {});
    Tensor images = Tensor::zeros(stage->input_shape(rows, 1));
    std::vector<int32_t> labels(rows, 1);
    model::MicroBatch mb{.images = images.data(), .targets = labels.data(), .rows = rows};
    model::StageResult r;
    const int64_t kept = kept_by_forward([&](nn::Context& ctx) { stage->forward(ctx, Tensor(), mb, &r, nullptr); });
    const auto ops = spec->op_costs(model::StageSpec::whole(), {rows, 1, 1, false});
    EXPECT_NEAR(model::total_saved_bytes(ops), static_cast<double>(kept), 0.01 * static_cast<double>(kept)) << name;
  }
}

TEST(CostModel, FlopsAreTheModelsOwnCount) {
  for (const char* name : {"gpt-tiny", "gpt-small", "cnn-small", "resnet-small", "inception-small"}) {
    auto spec = model::model_spec(name);
    const int64_t T = spec->default_seq(), rows = 4;
    const double ops = model::total_flops(spec->op_costs(model::StageSpec::whole(), {rows, T, 1, false}));
    // GPT's flops_per_token counts 6 per parameter, the biases and norms too; the ops count the
    // products: within 2%.
    EXPECT_NEAR(ops, spec->flops_per_sample(T) * rows, 0.02 * spec->flops_per_sample(T) * rows) << name;
    // Split over tp 2 every rank does half the products (GPT).
    if (spec->gpt()) {
      const double half = model::total_flops(spec->op_costs(model::StageSpec::whole(), {rows, T, 2, false}));
      const double embed_head_replicated = 0.02 * ops;
      EXPECT_NEAR(half, ops / 2, embed_head_replicated) << name;
    }
  }
}

TEST(CostModel, GpipeBubbleIsTheFormulaWithFreeCommunication) {
  auto spec = model::model_spec("gpt-tiny");  // 4 blocks: equal stages at pp 2 and 4 need no head/embedding cost
  plan::Hardware hw = device();
  hw.call_overhead_s = 0, hw.intra = {0, 0};
  for (int pp : {2, 4})
    for (int m : {1, 4, 8}) {
      plan::Layout l;
      l.pp = pp, l.microbatches = m, l.schedule = "gpipe", l.batch = 8 * m, l.seq = 64;
      const plan::Prediction p = plan::predict(*spec, l, hw);
      // Stages are unequal only by the embedding and head: compare the idle share of the
      // middle ranks with the formula loosely, and check the step is at least the ideal.
      const double formula = static_cast<double>(pp - 1) / (m + pp - 1);
      EXPECT_NEAR(p.bubble, formula, 0.12) << "pp " << pp << " m " << m;
      EXPECT_GT(p.step_s, 0);
    }
}

TEST(CostModel, FasterHardwareIsFasterAndZero3CommunicatesMore) {
  auto spec = model::model_spec("gpt-small");
  plan::Layout l;
  l.dp = 4, l.batch = 16, l.seq = 256;
  const plan::Prediction slow = plan::predict(*spec, l, device(50));
  const plan::Prediction fast = plan::predict(*spec, l, device(200));
  EXPECT_LT(fast.compute_s, slow.compute_s);
  plan::Layout z3 = l;
  z3.zero = 3;
  const plan::Prediction p0 = plan::predict(*spec, l, device(50));
  const plan::Prediction p3 = plan::predict(*spec, z3, device(50));
  EXPECT_GT(p3.step_s, p0.step_s);
  EXPECT_LT(p3.peak_bytes, p0.peak_bytes);
  // Data parallelism on a device that computes beside its communication: the buckets hide
  // behind backward, so the exposed part is at most one bucket's.
  EXPECT_LT(p0.dp_comm_s, 0.05 * p0.step_s);
  // Tensor parallelism costs all-reduces on the critical path.
  plan::Layout t2 = l;
  t2.dp = 2, t2.tp = 2;
  EXPECT_GT(plan::predict(*spec, t2, device(50)).tp_comm_s, 0);
}

TEST(CostModel, BadLayoutsAreRefusedWithASentence) {
  auto spec = model::model_spec("gpt-small");  // 6 heads, 6 blocks
  plan::Layout l;
  l.batch = 8, l.seq = 256;
  l.tp = 4;
  EXPECT_THROW(plan::predict(*spec, l, device()), std::invalid_argument);
  l.tp = 1, l.dp = 3;
  EXPECT_THROW(plan::predict(*spec, l, device()), std::invalid_argument);  // 8 rows over dp 3
  l.dp = 1, l.pp = 8;
  EXPECT_THROW(plan::predict(*spec, l, device()), std::invalid_argument);  // 6 blocks, 8 stages
  // A CNN's splits: resnet-small's 32 channels do not divide by 3; cnn-small's 7 x 7 maps
  // have too few rows for 8 bands; both divide by 2.
  auto resnet = model::model_spec("resnet-small"), cnn = model::model_spec("cnn-small");
  plan::Layout c;
  c.batch = 32, c.tp = 3;
  try {
    plan::predict(*resnet, c, device());
    ADD_FAILURE() << "resnet-small at tp 3 was predicted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("do not divide by 3"), std::string::npos) << e.what();
  }
  c.tp = 8, c.split = plan::Layout::Split::spatial;
  EXPECT_THROW(plan::predict(*cnn, c, device()), std::invalid_argument);
  c.tp = 2;
  EXPECT_NO_THROW(plan::predict(*cnn, c, device()));
  c.split = plan::Layout::Split::tensor;
  EXPECT_NO_THROW(plan::predict(*resnet, c, device()));
}

// plan and train decide with one check: over the named models, every split of the intra-layer
// axis and a range of tp and pp, train's start-up validation accepts a layout exactly when
// plan::check_layout does (before, plan took tp 3 for resnet-small, whose channels train
// refuses to split by 3).
TEST(CostModel, TrainAndPlanAcceptTheSameLayouts) {
  train::Machine big;
  big.cores = 64, big.memory_bytes = int64_t{1} << 42, big.memory_source = "test";
  meshtrain::testing::TempDir dir("layout_check");
  const std::string text = dir.file("corpus.txt");
  std::ofstream(text) << "to be or not to be";
  int accepted = 0, refused = 0;
  for (const std::string name : {"gpt-tiny", "gpt-small", "cnn-small", "resnet-small", "inception-small"}) {
    const auto spec = model::model_spec(name);
    const bool cnn = spec->cnn() != nullptr;
    std::vector<train::IntraSplit> splits{train::IntraSplit::tensor};
    if (cnn) splits.push_back(train::IntraSplit::spatial);
    if (name == "inception-small") splits.push_back(train::IntraSplit::branch);
    for (train::IntraSplit split : splits)
      for (int tp = 1; tp <= 8; ++tp)
        for (int pp = 1; pp <= 4; ++pp) {
          if (split != train::IntraSplit::tensor && tp == 1) continue;
          train::TrainOptions o;
          o.model = name, o.tp = tp, o.pp = pp, o.intra = split, o.microbatches = pp, o.batch = 48;
          o.seq = cnn ? 1 : spec->default_seq();
          o.threads = 1, o.steps = 10, o.optim.decay_steps = 10;
          o.data = cnn ? "fashion-mnist" : text;
          if (!cnn) o.pad_vocab = true;
          bool train_ok = true, plan_ok = true;
          std::string train_why, plan_why;
          try {
            if (cnn) train::validate_image_options(o, *spec, big);
            else train::validate_options(o, *spec->gpt(), big);
          } catch (const std::invalid_argument& e) {
            train_ok = false, train_why = e.what();
          }
          try {
            plan::check_layout(*spec, train::plan_layout(o, {}));
          } catch (const std::invalid_argument& e) {
            plan_ok = false, plan_why = e.what();
          }
          EXPECT_EQ(train_ok, plan_ok) << name << " tp " << tp << " pp " << pp << " split "
                                       << train::intra_flag(split) << ": train '" << train_why << "', plan '"
                                       << plan_why << "'";
          (plan_ok ? accepted : refused) += 1;
        }
  }
  EXPECT_GT(accepted, 20);  // both outcomes are exercised
  EXPECT_GT(refused, 20);
}

// The memory model against the peak tensor memory each rank of a real run held.
TEST(MemoryModel, PredictsEachRanksPeakTensorMemory) {
  meshtrain::testing::TempDir dir("plan_memory");
  const std::string data = (dir.path() / "corpus.txt").string();
  {
    std::ofstream f(data);
    for (int i = 0; i < 4000; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  struct Case {
    int dp, tp, pp, m, zero;
    const char* schedule;
    bool recompute;
  };
  for (const Case& c : std::vector<Case>{{1, 1, 1, 1, 0, "1f1b", false},
                                         {1, 1, 1, 3, 0, "1f1b", false},
                                         {2, 1, 1, 1, 0, "1f1b", false},
                                         {2, 1, 1, 1, 1, "1f1b", false},
                                         {2, 1, 1, 1, 2, "1f1b", false},
                                         {2, 1, 1, 1, 3, "1f1b", false},
                                         {1, 2, 1, 1, 0, "1f1b", false},
                                         {1, 1, 2, 4, 0, "gpipe", false},
                                         {1, 1, 2, 4, 0, "1f1b", false},
                                         {1, 1, 4, 4, 0, "1f1b", false},
                                         {1, 1, 2, 4, 0, "1f1b", true}}) {
    train::TrainOptions o;
    o.model = "gpt-tiny", o.data = data, o.batch = 12, o.seq = 64, o.steps = 3;
    o.dp = c.dp, o.tp = c.tp, o.pp = c.pp, o.microbatches = c.m, o.zero = c.zero, o.schedule = c.schedule;
    o.recompute = c.recompute;
    o.eval_every = 0, o.eval_batches = 1, o.quiet = true, o.threads = 1;
    o.hardware = std::make_shared<const plan::Hardware>(device());
    const train::TrainResult r = train::train(o);
    ASSERT_TRUE(r.predicted.has_value());
    ASSERT_EQ(r.peak_tensor_bytes.size(), static_cast<size_t>(c.dp * c.tp * c.pp));
    for (size_t rank = 0; rank < r.peak_tensor_bytes.size(); ++rank) {
      const int pp = parallel::mesh_coord({c.dp, c.tp, c.pp}, static_cast<int>(rank)).pp;
      const double predicted = r.predicted->memory.at(static_cast<size_t>(pp)).total();
      const double measured = static_cast<double>(r.peak_tensor_bytes[rank]);
      EXPECT_NEAR(predicted, measured, 0.05 * measured)
          << "dp " << c.dp << " tp " << c.tp << " pp " << c.pp << " m " << c.m << " zero " << c.zero << " "
          << c.schedule << (c.recompute ? " recompute" : "") << " rank " << rank;
    }
  }
}

// The same for the CNNs: what their units keep and what they allocate for a while beyond it
// are measured on the layers (CNNSpec's probes), so the prediction holds within 1% at one rank
// and dp 2 and within 2.2% at pp 2 (measured; cnn-small's first stage 2.1% under), asserted
// within 5% as above. (Before the executor released a sent tensor when its send completed, a
// first stage held what it sent until the step's end: 4.0% and 5.3% more than predicted.)
TEST(MemoryModel, PredictsACnnsPeakTensorMemory) {
  for (const std::string model : {"cnn-small", "resnet-small", "inception-small"})
    for (auto [dp, pp] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
      train::TrainOptions o = meshtrain::testing::cnn_options(model, dp, pp, 0);
      o.steps = 3;
      o.hardware = std::make_shared<const plan::Hardware>(device());
      const train::TrainResult r = train::train(o);
      ASSERT_TRUE(r.predicted.has_value());
      ASSERT_EQ(r.peak_tensor_bytes.size(), static_cast<size_t>(dp * pp));
      for (size_t rank = 0; rank < r.peak_tensor_bytes.size(); ++rank) {
        const int stage = parallel::mesh_coord({dp, 1, pp}, static_cast<int>(rank)).pp;
        const double predicted = r.predicted->memory.at(static_cast<size_t>(stage)).total();
        const double measured = static_cast<double>(r.peak_tensor_bytes[rank]);
        EXPECT_NEAR(predicted, measured, 0.05 * measured)
            << model << " dp " << dp << " pp " << pp << " rank " << rank;
      }
    }
}

// PipeDream-2BW's prediction is its steady step: the three unrolled steps' time less one
// flushed 1F1B step, halved. Without the flush nothing waits in the steady state but for the
// slowest stage, so the step is that stage's work (its busy time over the unrolled steps, a
// third), which 1F1B's fill and drain exceed; its memory adds a copy of the stage's weights and
// of its gradients.
TEST(CostModel, PipeDream2BWPredictsTheSteadyStepWithoutTheFlush) {
  const auto spec = model::model_spec("gpt-small");
  plan::Layout l;
  l.pp = 4, l.microbatches = 4, l.batch = 16, l.seq = 256, l.threads = 1;
  l.schedule = "1f1b";
  const plan::Prediction sync = plan::predict(*spec, l, device());
  l.schedule = "pipedream-2bw";
  const plan::Prediction async = plan::predict(*spec, l, device());
  double slowest = 0;
  for (double b : async.timeline.busy) slowest = std::max(slowest, b / 3);
  EXPECT_NEAR(async.compute_s, slowest, 0.05 * slowest);
  EXPECT_GT(sync.compute_s, 1.2 * async.compute_s) << "1F1B's fill and drain are missing";
  const auto ms = plan::predict_memory(*spec, [&] { auto s = l; s.schedule = "1f1b"; return s; }());
  const auto ma = plan::predict_memory(*spec, l);
  for (size_t r = 0; r < ma.size(); ++r) {
    EXPECT_DOUBLE_EQ(ma[r].params, 2 * ms[r].params) << "rank " << r;
    EXPECT_DOUBLE_EQ(ma[r].grads, 2 * ms[r].grads) << "rank " << r;
  }
}
