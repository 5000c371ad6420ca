// --comm-dtype bf16: data-parallel gradient buckets travel as bf16 and are summed in float32.
// Measured here on one real step of gpt-tiny at dp 2 (different rows per rank): the bytes the
// dp communicator sent are half of float32's; every rank ends with the same gradient bit for
// bit (the owner of a slice takes the bf16 of its own sum, as the others do); and each gradient
// is within the rounding bound of the float32 average:
//   g = bf16( (bf16(g0) + bf16(g1)) / 2 ): |g - (g0 + g1)/2| <= 2^-8 (|g0| + |g1|)/2 + 2^-8 |g| (+ float32 round-off)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/data/data.h"
#include "meshtrain/model/stage.h"
#include "meshtrain/nn/context.h"
#include "meshtrain/parallel/data/data_parallel.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/parallel/tensor/tp_regions.h"

using namespace meshtrain;

namespace {

struct Synced {
  std::vector<std::vector<float>> grads;  // per rank, every parameter's gradient in order
  std::vector<std::vector<float>> local;  // per rank, its own gradient before the sync
  uint64_t bytes_sent = 0;                // rank 0's dp communicator
};

Synced one_step(int zero, bool bf16_wire) {
  const int dp = 2;
  const model::GPTConfig cfg = model::gpt_config("gpt-tiny");
  std::vector<uint16_t> t;
  for (int i = 0; i < 20000; ++i) t.push_back(static_cast<uint16_t>((i * 31 + i / 7) % 256));
  const train::TokenDataset data = train::TokenDataset::from_tokens(std::move(t), 0.1);
  const int64_t B = 8, T = 32, rows = B / dp;
  Synced out;
  out.grads.resize(dp), out.local.resize(dp);
  comm::run_threads(dp, [&](comm::Communicator& world) {
    parallel::DeviceMesh mesh(world, {dp, 1, 1});
    const int r = mesh.rank();
    auto gpt = parallel::build_gpt(cfg, 1337, nullptr, {});
    std::vector<parallel::Unit> units;
    std::vector<nn::Param*> root;
    for (nn::Param* p : gpt->params())
      if (p->name.rfind("h.", 0) != 0) root.push_back(p);
    units.push_back({&gpt->stage(), root});
    for (auto& b : gpt->stage().h) units.push_back({b.get(), b->params()});
    parallel::DataParallel ddp(std::move(units), mesh.dp_ptr(),
                               {.zero = zero, .bucket_bytes = 64 * 1024, .bf16_wire = bf16_wire});
    std::vector<int32_t> tok(rows * T), tgt(rows * T);
    data.batch(train::Split::train, train::DataOrder::random, 1337, 0, B, T, r * rows, (r + 1) * rows, tok.data(),
               tgt.data());
    const uint64_t sent0 = mesh.dp_group().stats().bytes_sent;
    ddp.begin_step();
    // The local gradient first (no sync), then the same backward with the sync.
    for (bool sync : {false, true}) {
      if (sync) ddp.begin_step();
      ddp.set_sync(sync);
      nn::Context ctx(1);
      ctx.hooks = ddp.hooks();
      gpt->forward(ctx, tok.data(), tgt.data(), rows, T);
      gpt->backward(ctx);
      if (sync) ddp.finish_grad_sync();
      auto& dst = sync ? out.grads[r] : out.local[r];
      for (nn::Param* p : gpt->params()) dst.insert(dst.end(), p->grad.data(), p->grad.data() + p->grad.numel());
    }
    if (r == 0) out.bytes_sent = mesh.dp_group().stats().bytes_sent - sent0;
  });
  return out;
}

}  // namespace

TEST(CommDtype, Bf16GradientsHalveTheBytesAndKeepReplicasIdentical) {
  const Synced f32 = one_step(0, false), b16 = one_step(0, true);
  ASSERT_GT(f32.bytes_sent, 0u);
  const double ratio = static_cast<double>(b16.bytes_sent) / static_cast<double>(f32.bytes_sent);
  EXPECT_NEAR(ratio, 0.5, 0.001) << b16.bytes_sent << " vs " << f32.bytes_sent;
  ASSERT_EQ(b16.grads[0].size(), b16.grads[1].size());
  EXPECT_EQ(b16.grads[0], b16.grads[1]) << "replicas must hold the same gradient";
  const auto& g0 = b16.local[0];
  const auto& g1 = b16.local[1];
  ASSERT_EQ(g0, f32.local[0]) << "the local gradients do not depend on the wire";
  int64_t rounded = 0;
  for (size_t i = 0; i < g0.size(); ++i) {
    const double want = (double(g0[i]) + g1[i]) / 2, got = b16.grads[0][i];
    const double bound = 0x1p-8 * (std::fabs(g0[i]) + std::fabs(g1[i])) / 2 + 0x1p-8 * std::fabs(got) + 1e-7 * std::fabs(want);
    ASSERT_LE(std::fabs(got - want), bound + 1e-30) << "element " << i << ": " << got << " vs " << want;
    rounded += got != f32.grads[0][i];
    ASSERT_EQ(kernels::round_bf16(b16.grads[0][i]), b16.grads[0][i]) << "the synced gradient is a bf16 value";
  }
  EXPECT_GT(rounded, static_cast<int64_t>(g0.size() / 2)) << "most gradients differ from float32's";
}

TEST(CommDtype, AtZeroTwoTheReduceScatterHalves) {
  // ZeRO-2: the gradients' reduce-scatter travels as bf16 and the owner keeps its float32 sum
  // (this step runs no optimizer, so no parameter all-gather, which stays float32: a whole
  // trainer step at ZeRO-2 sends three quarters of float32's bytes).
  const Synced f32 = one_step(2, false), b16 = one_step(2, true);
  ASSERT_GT(f32.bytes_sent, 0u);
  const double ratio = static_cast<double>(b16.bytes_sent) / static_cast<double>(f32.bytes_sent);
  EXPECT_NEAR(ratio, 0.5, 0.001) << b16.bytes_sent << " vs " << f32.bytes_sent;
}

// Tensor parallelism's regions under TPWireScope(true): the all-reduce of a row-parallel output,
// the all-gather and reduce-scatter of sequence parallelism, each against its float32 form.
TEST(CommDtype, TensorParallelRegionsCarryBf16AndSumInFloat32) {
  const int p = 2;
  const int64_t B = 2, T = 8, C = 12;  // (B, T, C), T divides over p
  std::vector<std::vector<float>> x(p);
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < B * T * C; ++i) x[r].push_back(std::sin(0.37 * i + r) * (1 + r));
  struct Got {
    std::vector<float> reduced, gathered, scattered;
    uint64_t bytes = 0;
  };
  auto run = [&](bool bf16) {
    std::vector<Got> got(p);
    comm::run_threads(p, [&](comm::Communicator& tp) {
      const parallel::TPWireScope wire(bf16);
      const int r = tp.rank();
      const uint64_t b0 = tp.stats().bytes_sent;
      Tensor t = Tensor::empty({B, T, C});
      std::copy(x[r].begin(), x[r].end(), t.data());
      Tensor sum = parallel::ReduceFromTP::forward(tp, t.clone());
      Tensor shard = parallel::ReduceScatterToSP::forward(tp, t);    // (B, T/p, C): own rows of the sum
      Tensor full = parallel::GatherFromSP::forward(tp, shard);      // back to (B, T, C)
      got[r].reduced.assign(sum.data(), sum.data() + sum.numel());
      got[r].scattered.assign(shard.data(), shard.data() + shard.numel());
      got[r].gathered.assign(full.data(), full.data() + full.numel());
      got[r].bytes = tp.stats().bytes_sent - b0;
    });
    return got;
  };
  const auto f32 = run(false), b16 = run(true);
  EXPECT_NEAR(double(b16[0].bytes) / double(f32[0].bytes), 0.5, 0.02) << b16[0].bytes << " vs " << f32[0].bytes;
  for (int r = 1; r < p; ++r) {
    EXPECT_EQ(b16[r].reduced, b16[0].reduced) << "every rank holds the same all-reduced activation";
    EXPECT_EQ(b16[r].gathered, b16[0].gathered);
  }
  for (size_t i = 0; i < b16[0].reduced.size(); ++i) {
    // The bf16 of the float32 sum of the bf16 inputs.
    float s = 0;
    for (int r = 0; r < p; ++r) s += kernels::round_bf16(x[r][i]);
    ASSERT_EQ(b16[0].reduced[i], kernels::round_bf16(s)) << i;
  }
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < b16[r].scattered.size(); ++i) {
      // The owner keeps the float32 sum of the bf16 inputs (no second rounding).
      const size_t g = r * b16[r].scattered.size() + i;
      float s = 0;
      for (int q = 0; q < p; ++q) s += kernels::round_bf16(x[q][g]);
      ASSERT_EQ(b16[r].scattered[i], s) << "rank " << r << " element " << i;
      ASSERT_EQ(b16[0].gathered[g], kernels::round_bf16(s)) << g;
    }
}
