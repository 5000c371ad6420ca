// The CNN family (model/cnn.h): shapes and PyTorch names of the named models, a model cut into
// stages computing exactly what the whole model computes, synchronised batch norm over two
// halves of a batch giving the whole batch's loss and gradients, and a few SGD steps that
// lower the loss on a fixed batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/kernels/layout.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/tensor/rng.h"
#include "temp_dir.h"

using namespace meshtrain;

namespace {

struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};

Batch random_batch(const model::CNNConfig& cfg, int64_t rows, uint64_t seed) {
  Batch b;
  b.images.resize(rows * cfg.channels * cfg.height * cfg.width);
  fill_normal(b.images.data(), static_cast<int64_t>(b.images.size()), stream_key(seed, "images"), 0, 1.0f);
  for (int64_t i = 0; i < rows; ++i) b.labels.push_back(static_cast<int32_t>((i * 7 + seed) % cfg.classes));
  return b;
}

model::MicroBatch micro(const Batch& b, int64_t first, int64_t rows, const model::CNNConfig& cfg) {
  const int64_t per = cfg.channels * cfg.height * cfg.width;
  return {.images = b.images.data() + first * per, .targets = b.labels.data() + first, .rows = rows};
}

std::map<std::string, std::vector<float>> grads_of(model::Stage& s) {
  std::map<std::string, std::vector<float>> g;
  for (nn::Param* p : s.params()) g[p->name].assign(p->grad.data(), p->grad.data() + p->grad.numel());
  return g;
}

// The whole model's forward and backward on the batch's first 4 rows: its result and gradients.
std::pair<model::StageResult, std::map<std::string, std::vector<float>>> whole_model(const model::CNNConfig& cfg,
                                                                                     const Batch& b) {
  model::CNNStage whole(cfg, 5, 0, -1, true, true);
  nn::Context ctx(2);
  model::StageResult r;
  whole.forward(ctx, Tensor(), micro(b, 0, 4, cfg), &r, nullptr);
  whole.backward(ctx, Tensor(), 1.f, nullptr);
  return {r, grads_of(whole)};
}

// The gradients of two stages, by name (each parameter is on one of them).
std::map<std::string, std::vector<float>> grads_of(model::Stage& a, model::Stage& z) {
  auto got = grads_of(a);
  for (auto& [n, g] : grads_of(z)) got[n] = g;
  return got;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1e-6, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
  return diff / scale;
}

}  // namespace

TEST(Cnn, NamedModelsHavePyTorchNamesAndShrinkingShapes) {
  const model::CNNConfig small = model::cnn_config("cnn-small");
  const auto params = model::cnn_param_shapes(small);
  ASSERT_FALSE(params.empty());
  EXPECT_EQ(params[0].first, "conv1.weight");
  EXPECT_EQ(params[0].second, (Shape{32, 1, 3, 3}));
  const auto shapes = model::cnn_unit_shapes(small);
  ASSERT_EQ(shapes.size(), 4u);
  EXPECT_EQ(shapes[1], (Shape{32, 14, 14}));
  EXPECT_EQ(shapes[2], (Shape{64, 7, 7}));
  EXPECT_EQ(shapes[3], (Shape{10}));
  const auto buffers = model::cnn_buffer_shapes(small);
  EXPECT_NE(std::find_if(buffers.begin(), buffers.end(), [](const auto& b) { return b.first == "bn2.running_var"; }),
            buffers.end());
  const auto resnet = model::cnn_param_shapes(model::cnn_config("resnet-small"));
  EXPECT_NE(std::find_if(resnet.begin(), resnet.end(),
                         [](const auto& p) { return p.first == "layer2.0.downsample.0.weight" && p.second == Shape{64, 32, 1, 1}; }),
            resnet.end());
  const auto inception = model::cnn_unit_shapes(model::cnn_config("inception-small"));
  EXPECT_EQ(inception[2], (Shape{64, 14, 14}));  // 16 + 24 + 12 + 12 channels
  EXPECT_EQ(inception[3], (Shape{128, 14, 14}));
  EXPECT_THROW(model::cnn_config("alexnet"), std::invalid_argument);
}

// Every named CNN cut into two stages after each possible unit computes the whole model's loss
// and gradients.
TEST(Cnn, StagesComputeWhatTheWholeModelComputes) {
  for (const std::string& name : model::cnn_config_names()) {
    const model::CNNConfig cfg = model::cnn_config(name);
    const Batch b = random_batch(cfg, 4, 3);
    const auto [r, want] = whole_model(cfg, b);
    const int64_t units = model::cnn_num_units(cfg);
    for (int64_t cut = 1; cut < units; ++cut) {
      SCOPED_TRACE(name + " cut after unit " + std::to_string(cut));
      model::CNNStage a(cfg, 5, 0, cut, true, false), z(cfg, 5, cut, -1, false, true);
      nn::Context ca(2), cz(2);
      Tensor x = a.forward(ca, Tensor(), micro(b, 0, 4, cfg), nullptr, nullptr);
      EXPECT_EQ(x.shape(), a.output_shape(4, 1));
      EXPECT_EQ(z.input_shape(4, 1), a.output_shape(4, 1));
      model::StageResult rz;
      z.forward(cz, x, micro(b, 0, 4, cfg), &rz, nullptr);
      EXPECT_EQ(rz.loss, r.loss);
      EXPECT_EQ(rz.correct, r.correct);
      Tensor dx = z.backward(cz, Tensor(), 1.f, nullptr);
      a.backward(ca, dx, 1.f, nullptr);
      auto got = grads_of(a, z);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [n, g] : want) EXPECT_EQ(got[n], g) << n;
    }
  }
}

// A residual network without units (examples/models/resnet-cut.json) cut after every unit, so
// in either residual block too: the stages pass the skip crossing the cut by hand as the
// executor would (portal.out of the first into portal.in of the second, the gradient back),
// and give the whole model's loss and every gradient, bit for bit; the skip's shape is the
// stages' portal_shape.
TEST(Cnn, AResidualBlockCutAnywhereComputesWhatTheWholeModelComputes) {
  const model::CNNConfig cfg = model::cnn_config(std::make_shared<const model::Graph>(
      model::read_graph_file(std::string(MESHTRAIN_SOURCE_DIR) + "/examples/models/resnet-cut.json")));
  const Batch b = random_batch(cfg, 4, 3);
  const auto [r, want] = whole_model(cfg, b);
  const std::vector<int> skips = model::unit_skips(*cfg.graph);
  int crossed = 0;
  for (int64_t cut = 1; cut < model::cnn_num_units(cfg); ++cut) {
    SCOPED_TRACE("cut after unit " + std::to_string(cut));
    model::CNNStage a(cfg, 5, 0, cut, true, false), z(cfg, 5, cut, -1, false, true);
    const bool skip = skips[static_cast<size_t>(cut)] != model::kNoSkip;
    EXPECT_EQ(a.sends_portal(), skip);
    EXPECT_EQ(z.takes_portal(), skip);
    crossed += skip;
    nn::Context ca(2), cz(2);
    nn::Portal pa, pz;
    Tensor x = a.forward(ca, Tensor(), micro(b, 0, 4, cfg), nullptr, &pa);
    EXPECT_EQ(pa.out.numel() > 0, skip);
    if (skip) {
      EXPECT_EQ(pa.out.shape(), a.portal_shape(4, 1));
      EXPECT_EQ(pa.out.shape(), z.portal_shape(4, 1));
    }
    pz.in = pa.out;
    model::StageResult rz;
    z.forward(cz, x, micro(b, 0, 4, cfg), &rz, &pz);
    EXPECT_EQ(rz.loss, r.loss);
    Tensor dx = z.backward(cz, Tensor(), 1.f, &pz);
    EXPECT_EQ(pz.out.numel() > 0, skip);
    pa.in = pz.out;
    a.backward(ca, dx, 1.f, &pa);
    auto got = grads_of(a, z);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [n, g] : want) EXPECT_EQ(got[n], g) << n;
  }
  EXPECT_EQ(crossed, 12);  // stem.relu crosses 5 cuts, b1.relu 5, b2.bn2 2
}

// Activations kept in oneDNN's blocked layout between resnet-small's layers (the single-rank
// layout's activation_block) against the same model on NCHW (a layout that says 0): the unit
// outputs are the same values, permuted, and the loss and every gradient agree to float32
// round-off (the batch-norm sums may differ in their last bits).
TEST(Cnn, BlockedActivationsComputeWhatNchwComputes) {
  struct Nchw : model::CNNLayout {
    int activation_block(int64_t) const override { return 0; }
  };
  const int block = kernels::conv_activation_block();
  if (block == 0) GTEST_SKIP() << "oneDNN's convolutions prefer NCHW on this machine: nothing is kept blocked";
  const model::CNNConfig cfg = model::cnn_config("resnet-small");
  const Batch b = random_batch(cfg, 6, 4);
  auto nchw = std::make_shared<const Nchw>();
  // The stem alone: its output is the NCHW one in the blocked layout.
  {
    model::CNNStage blocked(cfg, 5, 0, 1, true, false), plain(cfg, 5, 0, 1, true, false, nchw);
    nn::Context ca(2), cb(2);
    const Tensor yb = blocked.forward(ca, Tensor(), micro(b, 0, 6, cfg), nullptr, nullptr);
    const Tensor yp = plain.forward(cb, Tensor(), micro(b, 0, 6, cfg), nullptr, nullptr);
    ASSERT_EQ(yb.shape(), yp.shape());
    std::vector<float> back(yb.numel());
    kernels::from_activation_layout(back.data(), yb.data(), yb.dim(0), yb.dim(1), yb.dim(2) * yb.dim(3), block);
    EXPECT_NE(0, std::memcmp(yb.data(), yp.data(), back.size() * sizeof(float)));  // really blocked
    EXPECT_EQ(0, std::memcmp(back.data(), yp.data(), back.size() * sizeof(float)));
  }
  model::CNNStage blocked(cfg, 5, 0, -1, true, true), plain(cfg, 5, 0, -1, true, true, nchw);
  nn::Context ca(2), cb(2);
  model::StageResult ra, rb;
  blocked.forward(ca, Tensor(), micro(b, 0, 6, cfg), &ra, nullptr);
  plain.forward(cb, Tensor(), micro(b, 0, 6, cfg), &rb, nullptr);
  EXPECT_NEAR(ra.loss, rb.loss, 1e-6 * std::fabs(rb.loss));
  blocked.backward(ca, Tensor(), 1.f, nullptr);
  plain.backward(cb, Tensor(), 1.f, nullptr);
  const auto ga = grads_of(blocked), gb = grads_of(plain);
  ASSERT_EQ(ga.size(), gb.size());
  for (const auto& [n, g] : gb) EXPECT_LT(max_rel_diff(g, ga.at(n)), 1e-5) << n;
}

// Two ranks on halves of a batch, batch-norm statistics summed between them: the whole batch's
// mean loss and the summed gradients equal one rank on the whole batch (float32 round-off).
TEST(Cnn, SynchronisedBatchNormOverTwoHalvesIsTheWholeBatch) {
  for (const std::string& name : {std::string("cnn-small"), std::string("resnet-small")}) {
    SCOPED_TRACE(name);
    const model::CNNConfig cfg = model::cnn_config(name);
    const Batch b = random_batch(cfg, 6, 9);
    model::CNNStage whole(cfg, 1, 0, -1, true, true);
    nn::Context c(1);
    model::StageResult r;
    whole.forward(c, Tensor(), micro(b, 0, 6, cfg), &r, nullptr);
    whole.backward(c, Tensor(), 1.f, nullptr);

    // Two "ranks" as threads; the reduction sums each call's values over both.
    model::CNNStage half[2] = {{cfg, 1, 0, -1, true, true}, {cfg, 1, 0, -1, true, true}};
    std::mutex mu;
    std::condition_variable cv;
    std::vector<double> sum;
    int arrived = 0, generation = 0, left = 0;
    auto reduce = [&](std::span<double> v) {
      std::unique_lock<std::mutex> lock(mu);
      const int gen = generation;
      if (arrived == 0) sum.assign(v.size(), 0.0);
      for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
      if (++arrived == 2) {
        arrived = 0, left = 2, ++generation;
        cv.notify_all();
      } else {
        cv.wait(lock, [&] { return generation != gen; });
      }
      std::copy(sum.begin(), sum.end(), v.begin());
      --left;
      cv.notify_all();
      cv.wait(lock, [&] { return left == 0; });
    };
    model::StageResult rh[2];
    std::vector<std::thread> ranks;
    for (int k = 0; k < 2; ++k)
      ranks.emplace_back([&, k] {
        half[k].set_batch_stats_reduce(reduce);
        nn::Context ctx(1);
        half[k].forward(ctx, Tensor(), micro(b, 3 * k, 3, cfg), &rh[k], nullptr);
        // Each rank's loss is the mean over its 3 rows; the whole batch's gradient is their
        // average, as data parallelism averages it.
        half[k].backward(ctx, Tensor(), 0.5f, nullptr);
      });
    for (auto& t : ranks) t.join();
    EXPECT_NEAR((rh[0].loss + rh[1].loss) / 2, r.loss, 1e-5 * std::fabs(r.loss));
    EXPECT_EQ(rh[0].correct + rh[1].correct, r.correct);
    const auto want = grads_of(whole), g0 = grads_of(half[0]), g1 = grads_of(half[1]);
    for (const auto& [n, g] : want) {
      std::vector<float> both(g.size());
      for (size_t i = 0; i < g.size(); ++i) both[i] = g0.at(n)[i] + g1.at(n)[i];
      EXPECT_LT(max_rel_diff(g, both), 1e-4) << n;
    }
    // The running statistics moved identically on both ranks and as on the whole batch.
    std::vector<nn::Param*> bw = whole.buffers(), b0 = half[0].buffers(), b1 = half[1].buffers();
    ASSERT_EQ(bw.size(), b0.size());
    for (size_t i = 0; i < bw.size(); ++i) {
      for (int64_t j = 0; j < bw[i]->value.numel(); ++j) {
        EXPECT_EQ(b0[i]->value[j], b1[i]->value[j]) << bw[i]->name;
        EXPECT_NEAR(b0[i]->value[j], bw[i]->value[j], 1e-5) << bw[i]->name;
      }
    }
  }
}

// A few plain gradient steps on one batch lower its loss (the gradients point downhill).
TEST(Cnn, GradientStepsLowerTheLoss) {
  for (const std::string& name : model::cnn_config_names()) {
    SCOPED_TRACE(name);
    const model::CNNConfig cfg = model::cnn_config(name);
    const Batch b = random_batch(cfg, 8, 4);
    model::CNNStage s(cfg, 2, 0, -1, true, true);
    float first = 0, last = 0;
    for (int step = 0; step < 10; ++step) {
      s.zero_grad();
      nn::Context ctx(2);
      model::StageResult r;
      s.forward(ctx, Tensor(), micro(b, 0, 8, cfg), &r, nullptr);
      s.backward(ctx, Tensor(), 1.f, nullptr);
      for (nn::Param* p : s.params())
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value[i] -= 0.02f * p->grad[i];
      (step == 0 ? first : last) = r.loss;
      if (step == 0) {
        EXPECT_NEAR(r.loss, std::log(10.0f), 1.0f);  // near chance at the start
      }
    }
    EXPECT_LT(last, first - 0.15f);  // measured: cnn-small 2.35 -> 0.19, resnet 2.45 -> 1.34, inception 2.40 -> 2.21
  }
}

// A CNN config's "scale": the named architecture on images k times larger each way (its unit
// shapes and classifier follow); a scale outside 1..16 is refused naming the field.
TEST(CnnConfigFile, ScaleTakesLargerImages) {
  meshtrain::testing::TempDir dir("cnn_config");
  const std::string path = dir.file("r.json");
  auto write = [&](const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  write(R"({"family": "cnn", "name": "cnn-small", "scale": 4})");
  const auto spec = model::model_spec_from_file(path);
  EXPECT_EQ(spec->sample_shape(), (Shape{1, 112, 112}));
  const auto shapes = model::cnn_unit_shapes(*spec->cnn());
  EXPECT_EQ(shapes[2], (Shape{64, 28, 28}));
  bool fc1 = false;
  for (const auto& [name, shape] : spec->param_shapes()) {
    if (name != "fc1.weight") continue;
    fc1 = true;
    EXPECT_EQ(shape, (Shape{64 * 28 * 28, 128}));
  }
  EXPECT_TRUE(fc1);
  for (const char* bad : {R"({"family": "cnn", "name": "cnn-small", "scale": 0})",
                          R"({"family": "cnn", "name": "cnn-small", "scale": 2.5})"}) {
    write(bad);
    try {
      model::model_spec_from_file(path);
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("\"scale\" must be an integer 1..16"), std::string::npos) << e.what();
    }
  }
}

// Branch costs for --branch-parallel's placement: inception-small's two blocks, four timed
// branches each (positive seconds); no such block in the other CNNs.
TEST(CnnBranchCosts, MeasuredPerBranchOfEachInceptionBlock) {
  const auto costs = model::measure_branch_costs(model::cnn_config("inception-small"), 4, 1, 1);
  ASSERT_EQ(costs.size(), 2u);
  for (const char* block : {"inception1", "inception2"}) {
    ASSERT_EQ(costs.count(block), 1u) << block;
    ASSERT_EQ(costs.at(block).size(), 4u) << block;
    for (double s : costs.at(block)) EXPECT_GT(s, 0.0) << block;
  }
  EXPECT_EQ(model::cnn_branch_blocks(model::cnn_config("inception-small")),
            (std::map<std::string, size_t>{{"inception1", 4}, {"inception2", 4}}));
  EXPECT_TRUE(model::measure_branch_costs(model::cnn_config("resnet-small"), 4, 1, 1).empty());
  EXPECT_TRUE(model::cnn_branch_blocks(model::cnn_config("cnn-small")).empty());
}
