// Convolutions split by filters and channels (parallel/tensor/cnn_tp.h), one micro-batch at a time: at
// tp 2 and 4 each named CNN gives the single rank's loss and, gathered over the ranks, its
// gradients; each rank holds its share of the split tensors; and the bytes the tp communicator
// sent equal the analytic count of the layout's all-reduces and all-gathers.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/cnn_layout.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor/cnn_tp.h"
#include "tp_test_util.h"

using namespace meshtrain;

namespace {

constexpr int64_t kRows = 4;

struct Pass {
  float loss = 0;
  int64_t correct = 0;
};

model::MicroBatch batch_of(const Tensor& images, const std::vector<int32_t>& targets) {
  model::MicroBatch mb;
  mb.images = images.data();
  mb.targets = targets.data();
  mb.rows = kRows;
  return mb;
}

Tensor images_for(const model::CNNConfig& cfg) {
  return tp_test::randn({kRows, cfg.channels, cfg.height, cfg.width}, "images");
}

std::vector<int32_t> targets_for(const model::CNNConfig& cfg) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < kRows; ++i) t.push_back(static_cast<int32_t>((3 * i + 1) % cfg.classes));
  return t;
}

// One forward and backward of the whole model as one stage, with `layout` (null: one rank).
Pass run_pass(model::CNNStage& stage, const model::CNNConfig& cfg) {
  const Tensor images = images_for(cfg);
  const std::vector<int32_t> targets = targets_for(cfg);
  nn::Context ctx(1);
  model::StageResult res;
  stage.forward(ctx, Tensor(), batch_of(images, targets), &res, nullptr);
  stage.backward(ctx, Tensor(), 1.0f, nullptr);
  return {res.loss, res.correct};
}

const std::vector<std::string> kModels = {"cnn-small", "resnet-small", "inception-small"};

}  // namespace

class CnnTensorParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CnnTensorParallel, GivesTheSingleRankLossAndGradientsAndSendsTheAnalyticBytes) {
  const auto& [name, p] = GetParam();
  const model::CNNConfig cfg = model::cnn_config(name);
  model::CNNStage one(cfg, 11, 0, -1, true, true);
  const Pass want = run_pass(one, cfg);
  std::map<std::string, Tensor> want_grads;
  for (nn::Param* q : one.params()) want_grads[q->name] = q->grad.clone();

  comm::run_threads(p, [&](comm::Communicator& world) {
    parallel::DeviceMesh mesh(world, {1, p, 1});
    comm::Communicator& tp = mesh.tp_group();
    model::CNNStage stage(cfg, 11, 0, -1, true, true, parallel::cnn_tp_layout(mesh.tp_ptr()));
    int64_t split = 0;
    for (nn::Param* q : stage.params()) {
      if (!q->shard.is_split()) continue;
      ++split;
      Shape local = q->global_shape;
      local[q->shard.dim] /= p;
      EXPECT_EQ(q->value.shape(), local) << q->name << " holds 1/" << p << " of dim " << q->shard.dim;
    }
    EXPECT_GT(split, 3) << "the layout splits the convolutions and their batch norms";
    const uint64_t sent0 = tp.stats().bytes_sent;
    const Pass got = run_pass(stage, cfg);
    const uint64_t sent = tp.stats().bytes_sent - sent0;
    EXPECT_EQ(sent, parallel::cnn_tp_bytes_per_microbatch(cfg, p, kRows)) << "bytes rank " << tp.rank() << " sent";
    EXPECT_NEAR(got.loss, want.loss, 2e-6 * std::fabs(want.loss));
    for (nn::Param* q : stage.params()) {
      const Tensor full = tp_test::full_grad(*q, tp);
      EXPECT_TRUE(tp_test::close(full, want_grads.at(q->name), 2e-5f, q->name));
    }
    // The split batch norms' running statistics are the single rank's, channel for channel.
    for (nn::Param* b : stage.buffers()) {
      nn::Param* ref = nullptr;
      for (nn::Param* r : one.buffers())
        if (r->name == b->name) ref = r;
      ASSERT_NE(ref, nullptr) << b->name;
      EXPECT_TRUE(tp_test::close(parallel::full_tensor(*b, tp), ref->value, 1e-6f, b->name));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Models, CnnTensorParallel,
                         ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// The analytic count itself, by hand for cnn-small at tp 2 and 4 rows: conv1 (1 -> 32, filter
// split, the model's first layer: no dx) sends nothing; conv2 (32 -> 64 on 14 x 14, channel
// split) all-reduces its (4, 64, 14, 14) partial output: 2 (p-1)/p of 50176 floats; the
// classifier's pair, fc1 (3136 -> 128, columns) all-reduces its input gradient (4, 3136) and
// fc2 (128 -> 10, rows) its partial output (4, 10).
TEST(CnnTensorParallelBytes, CnnSmallByHand) {
  const double floats = 4.0 * 64 * 14 * 14 + 4.0 * 3136 + 4.0 * 10;
  EXPECT_EQ(parallel::cnn_tp_bytes_per_microbatch(model::cnn_config("cnn-small"), 2, 4),
            static_cast<uint64_t>(2 * 0.5 * floats * 4));
  EXPECT_EQ(parallel::cnn_tp_bytes_per_microbatch(model::cnn_config("cnn-small"), 4, 4),
            static_cast<uint64_t>(2 * 0.75 * floats * 4));
  EXPECT_EQ(parallel::cnn_tp_bytes_per_microbatch(model::cnn_config("cnn-small"), 1, 4), 0u);
}

TEST(CnnTensorParallelBytes, ChannelCountsTheRanksDoNotDivideAreRefusedWithTheOnesThatWork) {
  try {
    parallel::validate_cnn_tp(model::cnn_config("inception-small"), 3);
    FAIL() << "tp 3 accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    // The stem (conv1, one image channel) runs replicated (filter_split_pays), so the first
    // count tp must divide is a branch's.
    EXPECT_NE(m.find("--tp 3 cannot split inception-small's convolutions: inception1.branch2.0.conv (16 output channels)"),
              std::string::npos)
        << m;
    // inception-small's split counts: 16, 16, 24, 8, 12, 12 (inception1), ... : gcd 4.
    EXPECT_NE(m.find("--tp 2, 4 divide every split channel count"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(parallel::validate_cnn_tp(model::cnn_config("resnet-small"), 4));
}

// Which unpaired convolutions a filter split pays for, worked by hand (FLOPs saved per output
// value against the bytes a rank sends per output value, bound kFilterSplitFlopsPerByte = 32):
//   the stem, 1 -> 32, 3x3, no input gradient, tp 2: saves 1/2 x 2 passes x 2 x 9 = 18 FLOPs,
//     sends 1/2 x 4 bytes (its gather share) = 2: 9 per byte, replicated;
//   resnet's projection 32 -> 64, 1x1, stride 2, tp 2: saves 1/2 x 3 x 2 x 32 = 96, sends
//     1/2 x 4 x (1 + 2 x 32 x 4 / 64) = 10: 9.6 per byte, replicated;
//   a 3x3 convolution 32 -> 32 with its input gradient: saves 864, sends 6: 144 per byte, split.
TEST(CnnTensorParallelBytes, AFilterSplitOfAFullConvolutionIsMadeOnlyWhereItPays) {
  EXPECT_FALSE(model::filter_split_pays(1, 32, 3, 1, false, 2));
  EXPECT_FALSE(model::filter_split_pays(32, 64, 1, 2, true, 2));
  EXPECT_TRUE(model::filter_split_pays(32, 32, 3, 1, true, 2));
  EXPECT_FALSE(model::filter_split_pays(32, 32, 3, 1, true, 1));  // one rank: nothing to split
  // At the bound: 3 passes x 2 x in x 9 x 1/2 = 32 x 4 x 1/2 x (1 + 2 in / out) with in = 8,
  // out = 128: 216 against 32 x 2 x 1.125 = 72, split; with in = 1, out = 1: 27 against 192, not.
  EXPECT_TRUE(model::filter_split_pays(8, 128, 3, 1, true, 2));
  EXPECT_FALSE(model::filter_split_pays(1, 1, 3, 1, true, 2));
  // resnet-small at tp 2 sends no gather for its stem and projections: its bytes per micro-batch
  // are those of its three pairs alone (each: the input gradient of conv1 and conv2's partial
  // sums, 2 x 1/2 x n floats each), counted here from the shapes: layer1 at 28 x 28 x 32, layer2
  // 28 x 28 x 32 in, 14 x 14 x 64 out, layer3 14 x 14 x 64 in, 7 x 7 x 128 out.
  const double rows = 4, share = 0.5;
  const double floats = 2 * share * rows * ((32 * 28 * 28 + 32 * 28 * 28) + (32 * 28 * 28 + 64 * 14 * 14) +
                                            (64 * 14 * 14 + 128 * 7 * 7));
  EXPECT_EQ(parallel::cnn_tp_bytes_per_microbatch(model::cnn_config("resnet-small"), 2, 4),
            static_cast<uint64_t>(floats * 4 + 0.5));
}
