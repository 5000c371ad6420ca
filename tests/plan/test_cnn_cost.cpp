// The cost model of convolutional networks (model/cnn_cost.h, plan/cost.h, plan/cnn_memory.h):
//   - a convolution is priced at the machine file's convolution rows (its format's), each of its
//     three calls at its own rate, and the other layers at their measured calls;
//   - an old machine file (no convolution rows) still predicts, with a note;
//   - the filter/channel split's collectives are exactly what parallel/tensor/cnn_tp.h sends,
//     the row bands' halos appear where a window reads beyond its band, the branch split's
//     join is an all-gather, and a slower link makes each split's step slower;
//   - the memory model's peak per rank of a split CNN is what each rank of a real run held.
// Quantities only: no timing is measured here (the suite runs loaded).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "meshtrain/model/spec.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor/cnn_tp.h"
#include "meshtrain/plan/cost.h"
#include "meshtrain/train/trainer.h"
#include "train/cnn_runs.h"

using namespace meshtrain;

namespace {

constexpr double kConvNchw = 50, kConvBlocked = 80;  // GFLOP/s of the test machine's convolutions

// A machine file with one row of each kind: every convolution of a format gets that row's rates
// (forward, data, weights: r, r / 2, r / 4), every CNN layer its one size.
plan::MachineProfile machine(double nchw = kConvNchw, double blocked = kConvBlocked) {
  plan::MachineProfile m;
  m.mode = "quick", m.host = "test", m.cpu_model = "Test CPU", m.cores = 2;
  m.call_overhead_s = 1e-6;
  m.gemm = {{"square_1024", 1024, 1024, 1024, "float32", 1, 100}};
  m.elementwise = {{"add", 1 << 20, 1, 1e10}};
  m.conv = {{"nchw", 16, 32, 64, 3, 1, 14, 1, nchw, nchw / 2, nchw / 4},
            {"blocked", 16, 32, 64, 3, 1, 14, 1, blocked, blocked / 2, blocked / 4}};
  for (const char* op : {"batchnorm", "batchnorm_relu", "relu", "add", "add_relu", "maxpool", "avgpool", "global_pool",
                         "concat", "flatten"})
    for (const char* f : {"nchw", "blocked"}) m.cnn_layers.push_back({op, f, 1 << 20, 1, 1e-3, 2e-3});
  m.links = {{"threads", "all_reduce", 2, 1e-5, 1e-10, 0, {{8, 1e-5}, {1 << 20, 1.1e-4}}},
             {"threads", "sendrecv", 2, 5e-6, 1e-10, 0, {{8, 5e-6}, {1 << 20, 1.1e-4}}}};
  return m;
}

plan::Layout layout(int64_t batch, int tp = 1, plan::Layout::Split split = plan::Layout::Split::tensor) {
  plan::Layout l;
  l.batch = batch, l.tp = tp, l.split = split, l.threads = 1;
  return l;
}

// Seconds of every convolution of `spec` at rows `rows` (one rank), each call at its rate.
double conv_seconds(const model::ModelSpec& spec, int64_t rows, double rate, int tp = 1,
                    model::CostQuery::Split split = model::CostQuery::Split::tensor) {
  model::CostQuery q(rows, 1, tp);
  q.split = split;
  double s = 0;
  for (const model::OpCost& o : spec.op_costs(model::StageSpec::whole(), q))
    if (o.cls == model::OpClass::conv)
      s += o.fwd_flops / (rate * 1e9) + (o.input_grad ? o.fwd_flops / (rate / 2 * 1e9) : 0) + o.fwd_flops / (rate / 4 * 1e9);
  return s;
}

}  // namespace

// cnn-small keeps NCHW activations (its max pools take no other layout): its convolutions are
// priced at the nchw row, and doubling that row's rates takes exactly half their time off the
// step; the blocked row does not touch it. resnet-small keeps the blocked layout.
TEST(CnnCostModel, ConvolutionsUseTheCalibratedRowOfTheirFormat) {
  const int64_t batch = 16;
  {
    auto spec = model::model_spec("cnn-small");
    const plan::Hardware a = plan::hardware_from_machine(machine(), 0);
    const plan::Hardware faster = plan::hardware_from_machine(machine(2 * kConvNchw, kConvBlocked), 0);
    const plan::Hardware other = plan::hardware_from_machine(machine(kConvNchw, 2 * kConvBlocked), 0);
    const double convs = conv_seconds(*spec, batch, kConvNchw);
    ASSERT_GT(convs, 0);
    const double t = plan::predict(*spec, layout(batch), a).compute_s;
    EXPECT_NEAR(t - plan::predict(*spec, layout(batch), faster).compute_s, convs / 2, 1e-9 * t);
    EXPECT_NEAR(plan::predict(*spec, layout(batch), other).compute_s, t, 1e-12 * t);
    EXPECT_TRUE(plan::predict(*spec, layout(batch), a).notes.empty());
  }
  {
    auto spec = model::model_spec("resnet-small");
    const plan::Hardware a = plan::hardware_from_machine(machine(), 0);
    const plan::Hardware faster = plan::hardware_from_machine(machine(kConvNchw, 2 * kConvBlocked), 0);
    const double t = plan::predict(*spec, layout(batch), a).compute_s;
    EXPECT_LT(plan::predict(*spec, layout(batch), faster).compute_s, t - 0.1 * conv_seconds(*spec, batch, kConvBlocked));
    // Split over tp 2, each rank's share of 32, 64 and 128 channels is whole blocks: the split
    // keeps the blocked layout, so the blocked row prices it and the nchw row does not touch it.
    const plan::Hardware nchw_faster = plan::hardware_from_machine(machine(2 * kConvNchw, kConvBlocked), 0);
    const double tp2 = plan::predict(*spec, layout(batch, 2), a).compute_s;
    EXPECT_LT(plan::predict(*spec, layout(batch, 2), faster).compute_s, tp2);
    EXPECT_NEAR(plan::predict(*spec, layout(batch, 2), nchw_faster).compute_s, tp2, 1e-12 * tp2);
  }
}

// The CNN layer rows are measured in the caches. A stage that does not fit its share of the
// last-level cache runs every layer at those times times the "add" rows' in-cache over
// from-memory ratio (2.5 here); the convolutions keep their rows. Each layer row of the test
// machine is 1 ms forward and 2 ms backward per 2^20 elements (one size: a line through 0).
TEST(CnnCostModel, LayersOfAStageBeyondTheCacheRunAtTheRatesFromMemory) {
  const int64_t batch = 64;
  auto spec = model::model_spec("resnet-small");
  double layers = 0;  // the layer ops' seconds from the rows, forward and backward
  double bytes = 0;   // what the other ops (the classifier's product) read and write at "add"'s rate
  for (const model::OpCost& o : spec->op_costs(model::StageSpec::whole(), model::CostQuery(batch, 1, 1))) {
    if (o.cls == model::OpClass::layer) layers += 3e-3 * static_cast<double>(o.elements) / (1 << 20);
    else if (o.cls != model::OpClass::conv) bytes += o.fwd_bytes + o.bwd_bytes;
  }
  ASSERT_GT(layers, 0);
  auto with = [&](int64_t llc, double cold_add) {
    plan::MachineProfile m = machine();
    m.llc_bytes = llc;
    m.elementwise = {{"add", 1 << 20, 1, 1e10}, {"add", 1 << 25, 1, cold_add}};
    return plan::predict(*spec, layout(batch), plan::hardware_from_machine(m, 0)).compute_s;
  };
  // resnet-small at batch 64 keeps ~60 MiB of activations: beyond a 1 MiB cache, within 1 GiB.
  const double hot = with(int64_t{1} << 30, 4e9), cold = with(int64_t{1} << 20, 4e9), cold_same = with(int64_t{1} << 20, 1e10);
  EXPECT_NEAR(hot, cold_same, 1e-9 * hot) << "with equal rates in and beyond the cache, nothing changes";
  EXPECT_NEAR(cold - cold_same, 1.5 * layers + bytes * (1 / 4e9 - 1 / 1e10), 1e-9 * cold)
      << "every layer op 2.5x its in-cache time";
}

// Ranks that compute at once share the node: two ranks of one thread get together what one
// rank of two threads gets, as measured. On a machine whose two threads run 1.5x one thread
// (every row), resnet-small at dp 2 (32 samples a rank, one thread each) is predicted as slow as
// one rank of two threads on all 64 (each op's time is linear in the samples here); taking
// each rank's one-thread rate alone would predict it 25% faster. Where two threads run 2x one,
// both rules agree.
TEST(CnnCostModel, RanksComputingAtOnceShareTheNodesMeasuredRate) {
  auto spec = model::model_spec("resnet-small");
  const auto with_two_threads = [](double speedup) {
    plan::MachineProfile m = machine();
    m.call_overhead_s = 1e-12;
    const auto twice = [speedup](auto rows, auto faster) {
      const size_t n = rows.size();
      for (size_t i = 0; i < n; ++i) {
        auto r = rows[i];
        r.threads = 2;
        faster(r, speedup);
        rows.push_back(r);
      }
      return rows;
    };
    m.gemm = twice(m.gemm, [](plan::GemmRate& r, double x) { r.gflops *= x; });
    m.elementwise = twice(m.elementwise, [](plan::ElementwiseRate& r, double x) { r.bytes_per_s *= x; });
    m.conv = twice(m.conv, [](plan::ConvRate& r, double x) {
      r.fwd_gflops *= x, r.bwd_data_gflops *= x, r.bwd_weights_gflops *= x;
    });
    m.cnn_layers = twice(m.cnn_layers, [](plan::LayerRate& r, double x) { r.fwd_s /= x, r.bwd_s /= x; });
    return plan::hardware_from_machine(m, 0);
  };
  const auto compute = [&](const plan::Hardware& hw, int dp) {
    plan::Layout l = layout(64);
    l.dp = dp, l.threads = 2 / dp;
    return plan::predict(*spec, l, hw).compute_s;
  };
  for (const double speedup : {1.5, 2.0}) {
    const plan::Hardware hw = with_two_threads(speedup);
    EXPECT_NEAR(compute(hw, 2), compute(hw, 1), 0.02 * compute(hw, 1)) << "two threads at " << speedup << "x one";
  }
}

// A machine file from before version 4 (no convolutions, no CNN layers) still predicts a CNN,
// convolutions as GEMMs, and says so.
TEST(CnnCostModel, AnOldMachineFileFallsBackWithANote) {
  plan::MachineProfile m = machine();
  m.version = 3, m.conv.clear(), m.cnn_layers.clear();
  auto spec = model::model_spec("resnet-small");
  const plan::Prediction p = plan::predict(*spec, layout(16), plan::hardware_from_machine(m, 0));
  EXPECT_GT(p.step_s, 0);
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("no measured convolutions"), std::string::npos) << p.notes[0];
  // A transformer needs none of it.
  EXPECT_TRUE(plan::predict(*model::model_spec("gpt-tiny"), [] {
                plan::Layout l;
                l.batch = 4, l.seq = 64;
                return l;
              }(), plan::hardware_from_machine(m, 0))
                  .notes.empty());
}

// The filter/channel split's collectives, as the op list states them (whole tensors: an
// all-reduce sends 2 (p - 1) / p of its bytes per rank on a ring, an all-gather (p - 1) / p), are
// exactly the bytes parallel/tensor/cnn_tp.h counts per micro-batch.
TEST(CnnCostModel, FilterSplitCollectivesAreWhatTheSplitSends) {
  for (const char* name : {"cnn-small", "resnet-small", "inception-small"})
    for (int p : {2, 4}) {
      if (std::string(name) == "inception-small" && p == 4) continue;  // its 12-channel branches
      auto spec = model::model_spec(name);
      const int64_t rows = 8;
      const auto ops = spec->op_costs(model::StageSpec::whole(), model::CostQuery(rows, 1, p));
      double sent = 0;
      for (const model::OpCost& o : ops)
        sent += (o.tp_fwd_bytes + o.tp_bwd_bytes) * 2.0 * (p - 1) / p +
                (o.tp_fwd_gather_bytes + o.tp_bwd_gather_bytes) * (p - 1.0) / p;
      EXPECT_NEAR(sent, static_cast<double>(parallel::cnn_tp_bytes_per_microbatch(*spec->cnn(), p, rows)), 1.0)
          << name << " tp " << p;
    }
}

// Row bands: a 3 x 3 convolution reads a row beyond its band (a halo each way), a 1 x 1 one and
// a 2 x 2 pool over even bands none; batch norms all-reduce their statistics; the flatten of a
// feature map gathers it. Branches: the concat of the split block gathers, its input's gradient
// is all-reduced, and each rank computes only its branches (fewer FLOPs than one rank's).
TEST(CnnCostModel, SpatialAndBranchSplitsAddTheirExchanges) {
  auto cnn = model::model_spec("cnn-small");
  model::CostQuery q(8, 1, 2);
  q.split = model::CostQuery::Split::spatial;
  const auto ops = cnn->op_costs(model::StageSpec::whole(), q);
  bool conv2 = false, pool = false, flatten = false, bn = false;
  for (const model::OpCost& o : ops) {
    if (o.name == "conv2") {
      conv2 = true;
      EXPECT_DOUBLE_EQ(o.halo_fwd_bytes, 4.0 * 8 * 32 * 14) << "one row of 32 x 14";
    }
    if (o.name == "pool1") {
      pool = true;
      EXPECT_EQ(o.halo_fwd_bytes, 0);
    }
    if (o.name == "flatten") {
      flatten = true;
      EXPECT_DOUBLE_EQ(o.tp_fwd_gather_bytes, 4.0 * 8 * 64 * 7 * 7);
    }
    if (o.name == "bn1") {
      bn = true;
      EXPECT_GT(o.tp_fwd_bytes, 0);
    }
  }
  EXPECT_TRUE(conv2 && pool && flatten && bn);

  auto inc = model::model_spec("inception-small");
  const double one = model::total_flops(inc->op_costs(model::StageSpec::whole(), model::CostQuery(8)));
  double gathered = 0, reduced = 0;
  for (int r = 0; r < 2; ++r) {
    model::CostQuery b(8, 1, 2);
    b.split = model::CostQuery::Split::branch, b.tp_rank = r;
    const auto rops = inc->op_costs(model::StageSpec::whole(), b);
    EXPECT_LT(model::total_flops(rops), 0.9 * one) << "rank " << r;
    for (const model::OpCost& o : rops) gathered += o.tp_fwd_gather_bytes, reduced += o.tp_bwd_bytes;
  }
  EXPECT_GT(gathered, 0);
  EXPECT_GT(reduced, 0);
}

// Every split pays its exchanges: on a link 100 times slower the step of each is slower by
// at least its communication's share, and one rank's does not change.
TEST(CnnCostModel, SlowerLinksSlowEverySplit) {
  plan::MachineProfile slow = machine();
  for (plan::LinkFit& f : slow.links) f.alpha_s *= 100, f.beta_s_per_byte *= 100;
  const plan::Hardware fast_hw = plan::hardware_from_machine(machine(), 0), slow_hw = plan::hardware_from_machine(slow, 0);
  struct Case {
    const char* model;
    plan::Layout::Split split;
  };
  for (const Case& c : {Case{"resnet-small", plan::Layout::Split::tensor}, Case{"cnn-small", plan::Layout::Split::spatial},
                        Case{"inception-small", plan::Layout::Split::branch}}) {
    auto spec = model::model_spec(c.model);
    const plan::Prediction fast = plan::predict(*spec, layout(16, 2, c.split), fast_hw);
    EXPECT_GT(fast.tp_comm_s, 0) << c.model;
    EXPECT_GT(plan::predict(*spec, layout(16, 2, c.split), slow_hw).step_s, fast.step_s + 50 * fast.tp_comm_s) << c.model;
  }
  auto spec = model::model_spec("resnet-small");
  EXPECT_DOUBLE_EQ(plan::predict(*spec, layout(16), slow_hw).step_s, plan::predict(*spec, layout(16), fast_hw).step_s);
}

// The peak tensor memory each rank of a split run held, against the memory model's (within 5%,
// as for the unsplit CNNs in test_cost.cpp): filters/channels, row bands, branches.
TEST(CnnMemoryModel, PredictsASplitCnnsPeakTensorMemory) {
  struct Case {
    const char* model;
    train::IntraSplit split;
  };
  for (const Case& c : {Case{"resnet-small", train::IntraSplit::tensor}, Case{"cnn-small", train::IntraSplit::tensor},
                        Case{"cnn-small", train::IntraSplit::spatial}, Case{"resnet-small", train::IntraSplit::spatial},
                        Case{"inception-small", train::IntraSplit::branch}}) {
    train::TrainOptions o = meshtrain::testing::cnn_options(c.model, 1, 1, 0);
    o.tp = 2, o.intra = c.split, o.steps = 3;
    if (c.split == train::IntraSplit::branch) o.branch_balance = "flops";
    o.hardware = std::make_shared<const plan::Hardware>(plan::hardware_from_machine(machine(), 0));
    const train::TrainResult r = train::train(o);
    ASSERT_TRUE(r.predicted.has_value()) << c.model;
    ASSERT_EQ(r.peak_tensor_bytes.size(), 2u);
    for (size_t rank = 0; rank < 2; ++rank) {
      const plan::RankMemory& m = r.predicted->memory.at(0);
      const double predicted = m.by_tp_rank.empty() ? m.total() : m.by_tp_rank.at(rank);
      const double measured = static_cast<double>(r.peak_tensor_bytes[rank]);
      EXPECT_NEAR(predicted, measured, 0.05 * measured)
          << c.model << " " << train::intra_flag(c.split) << " 2, rank " << rank;
    }
  }
}

// A skip connection crossing a pipeline cut travels in a portal; the stage that sends it posts
// the receive of its gradient for every micro-batch at the step's start. resnet-cut (a user's
// graph without units) cut at pp 2 under GPipe, 4 micro-batches: each rank's peak tensor memory
// against the memory model's, within 5%. Without those buffers rank 0 was 7.2% under.
TEST(CnnMemoryModel, CountsTheSkipGradientsAPipelineCutWaitsFor) {
  train::TrainOptions o = meshtrain::testing::cnn_options(std::string(MESHTRAIN_SOURCE_DIR) +
                                                              "/examples/models/resnet-cut.json",
                                                          1, 2, 0, "gpipe");
  o.batch = 64, o.microbatches = 4, o.steps = 3;
  o.hardware = std::make_shared<const plan::Hardware>(plan::hardware_from_machine(machine(), 0));
  const train::TrainResult r = train::train(o);
  ASSERT_TRUE(r.predicted.has_value());
  ASSERT_EQ(r.peak_tensor_bytes.size(), 2u);
  auto spec = model::model_spec(o.model);
  double skip = 0;  // the skip crossing the cut, for one micro-batch: it must be a residual cut
  for (int64_t u = 1; u < spec->num_units(); ++u) skip = std::max(skip, spec->skip_bytes(u, 16));
  ASSERT_GT(skip, 0);
  for (size_t rank = 0; rank < 2; ++rank) {
    const double predicted = r.predicted->memory.at(rank).total();
    const double measured = static_cast<double>(r.peak_tensor_bytes[rank]);
    EXPECT_NEAR(predicted, measured, 0.05 * measured) << "rank " << rank;
  }
}

// The ops `plan --layout --ops` prints are the step's: on one rank with one micro-batch (no
// pipeline, no collectives) the step's compute is their forward and backward times summed, and
// there is one per op the model lists.
TEST(CnnCostModel, TheOpsListedAddUpToTheStep) {
  for (const char* name : {"resnet-small", "inception-small", "gpt-tiny"}) {
    auto spec = model::model_spec(name);
    plan::Layout l = layout(16);
    if (spec->gpt()) l.seq = 64;
    const plan::Prediction p = plan::predict(*spec, l, plan::hardware_from_machine(machine(), 0));
    const model::CostQuery q(16, spec->gpt() ? 64 : 1, 1);
    EXPECT_EQ(p.ops.size(), spec->op_costs(model::StageSpec::whole(), q).size()) << name;
    double sum = 0;
    for (const plan::Prediction::OpTime& t : p.ops) {
      EXPECT_GE(t.fwd_s, 0) << name << " " << t.stage_op;
      EXPECT_EQ(t.comm_s, 0) << name << " " << t.stage_op;
      sum += t.fwd_s + t.bwd_s;
    }
    EXPECT_NEAR(sum, p.compute_s, 1e-6 * p.compute_s) << name;
  }
}

// A layout of several ranks on one node's cores, against one rank on the cores they use: the
// ratio of the two predicted steps, lower as the split's collectives get slower; nothing for one
// rank or for hardware whose ranks do not share cores (devices).
TEST(CnnCostModel, ALayoutIsSetAgainstOneRankOnTheSameCores) {
  auto spec = model::model_spec("resnet-small");
  const int64_t batch = 16;
  const plan::Hardware hw = plan::hardware_from_machine(machine(), 0);
  const plan::Layout tp2 = layout(batch, 2);
  const plan::Prediction p = plan::predict(*spec, tp2, hw);
  const auto a = plan::against_one_rank(*spec, tp2, hw, p.step_s);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->one_rank_threads, 2);  // two ranks of one thread: one rank of two
  plan::Layout one = layout(batch);
  one.threads = 2;
  EXPECT_DOUBLE_EQ(a->one_rank_step_s, plan::predict(*spec, one, hw).step_s);
  EXPECT_DOUBLE_EQ(a->speed, a->one_rank_step_s / p.step_s);
  // The same split over a link 1000 times slower: its step grows, one rank's does not.
  plan::MachineProfile slow = machine();
  for (plan::LinkFit& f : slow.links) {
    f.alpha_s *= 1000, f.beta_s_per_byte *= 1000;
    for (plan::LinkPoint& pt : f.points) pt.seconds *= 1000;
  }
  const plan::Hardware hw_slow = plan::hardware_from_machine(slow, 0);
  const plan::Prediction ps = plan::predict(*spec, tp2, hw_slow);
  const auto b = plan::against_one_rank(*spec, tp2, hw_slow, ps.step_s);
  ASSERT_TRUE(b.has_value());
  EXPECT_DOUBLE_EQ(b->one_rank_step_s, a->one_rank_step_s);
  EXPECT_LT(b->speed, a->speed);
  EXPECT_LT(b->speed, 0.9);
  // One rank has no peer; devices that do not share cores are not set against one.
  EXPECT_FALSE(plan::against_one_rank(*spec, layout(batch), hw, 1.0).has_value());
  plan::Hardware devices = hw;
  devices.cores = 0;
  EXPECT_FALSE(plan::against_one_rank(*spec, tp2, devices, p.step_s).has_value());
}

// Four pipeline stages of one thread on two cores: a stage whose input arrives waits for the
// rank on its core to end its action, or for the machine file's hand-over, whichever is
// shorter. A hand-over far longer than any action is capped (1 s and 10 s price the same step)
// and adds at most one action a message; a hand-over of a hundredth of an action adds at most
// that a message.
TEST(CnnCostModel, AStageWaitsForItsCoreAtMostTheRestOfAnAction) {
  auto spec = model::model_spec("resnet-small");
  const auto step = [&](double handoff) {
    plan::MachineProfile m = machine();
    m.oversubscribed_handoff_s = handoff;
    plan::Layout l = layout(64);
    l.pp = 4, l.microbatches = 4, l.schedule = "1f1b";
    return plan::predict(*spec, l, plan::hardware_from_machine(m, 0));
  };
  const plan::Prediction none = step(1e-12), second = step(1.0), ten = step(10.0);
  EXPECT_DOUBLE_EQ(second.compute_s, ten.compute_s);
  EXPECT_GT(second.timeline.makespan, none.timeline.makespan);
  double longest = 0;
  int messages = 0;
  for (const auto& rank : none.timeline.ranks)
    for (const pipeline::TimedAction& t : rank) {
      if (pipeline::is_compute(t.action.kind)) longest = std::max(longest, t.end - t.start);
      if (pipeline::is_recv(t.action.kind)) ++messages;
    }
  ASSERT_GT(messages, 0);
  EXPECT_LE(second.timeline.makespan - none.timeline.makespan, messages * longest);
  // A hand-over of a hundredth of the longest action adds at most that a message.
  const plan::Prediction small = step(longest / 100);
  EXPECT_GT(small.timeline.makespan, none.timeline.makespan);
  EXPECT_LE(small.timeline.makespan - none.timeline.makespan, messages * longest / 100 * (1 + 1e-9));
  EXPECT_LT(small.timeline.makespan, second.timeline.makespan);
}
