#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <thread>
#include <vector>

#include "meshtrain/tensor/rng.h"
#include "meshtrain/tensor/tensor.h"

using namespace meshtrain;

TEST(Tensor, ShapeAndZeroFill) {
  Tensor t({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(shape_str(t.shape()), "(2, 3, 4)");
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], 0.f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
}

TEST(Tensor, CopySharesCloneIsDeepResizeKeepsCapacity) {
  Tensor a = Tensor::from({2, 2}, {1, 2, 3, 4});
  Tensor shared = a;
  shared[1] = 7;
  EXPECT_EQ(a[1], 7.f);
  Tensor b = a.clone();
  b[0] = 9;
  EXPECT_EQ(a[0], 1.f);
  float* p = a.data();
  a.resize({3});
  EXPECT_EQ(a.data(), p);
  EXPECT_EQ(a.numel(), 3);
  EXPECT_THROW(a.reshape({2, 2}), std::invalid_argument);
  EXPECT_THROW(Tensor::from({3}, {1, 2}), std::invalid_argument);
}

// Known-answer test from the Random123 distribution (kat_vectors, philox4x32_10).
// Live bytes: storage counts while any tensor or view shares it, is charged to the thread that
// allocated it, and is debited from that thread's count even when another thread frees it.
TEST(Tensor, LiveBytesFollowAllocationsPerThread) {
  const int64_t process0 = tensor_bytes_live(), mine0 = tensor_bytes_live_thread();
  Tensor a({10, 10});
  EXPECT_EQ(tensor_bytes_live_thread() - mine0, 400);
  Tensor v = Tensor::view(a, 10, {5});
  Tensor shared = a;
  a = Tensor();
  EXPECT_EQ(tensor_bytes_live_thread() - mine0, 400);  // still shared by the view and the copy
  shared.resize({2, 2});                                 // shrinking keeps the storage
  EXPECT_EQ(tensor_bytes_live_thread() - mine0, 400);
  shared = Tensor();
  v = Tensor();
  EXPECT_EQ(tensor_bytes_live_thread() - mine0, 0);

  Tensor from_other;
  int64_t other_after_alloc = -1, other_after_free = -1;
  std::thread([&] {
    from_other = Tensor::empty({25});
    other_after_alloc = tensor_bytes_live_thread();
  }).join();
  EXPECT_EQ(other_after_alloc, 100);
  EXPECT_EQ(tensor_bytes_live_thread() - mine0, 0);  // not this thread's
  EXPECT_EQ(tensor_bytes_live() - process0, 100);
  Tensor mine = from_other.clone();  // a clone is allocated here
  EXPECT_EQ(tensor_bytes_live_thread() - mine0, 100);
  std::thread([&] {
    Tensor local({3});
    from_other = Tensor();  // freed on a third thread, after its allocating thread ended
    other_after_free = tensor_bytes_live_thread();
  }).join();
  EXPECT_EQ(other_after_free, 12);  // only `local` was charged to the third thread
  EXPECT_EQ(tensor_bytes_live() - process0, 100);
  mine = Tensor();
  EXPECT_EQ(tensor_bytes_live() - process0, 0);
  EXPECT_EQ(tensor_bytes_live_thread() - mine0, 0);
}

TEST(Tensor, LargeStorageComesFromTheArenaAndIsReused) {
  const int64_t MiB = int64_t{1} << 20;
  // Below 1 MiB the C library serves it: the arena does not change.
  const int64_t extent0 = tensor_cache_extent_bytes(), hits0 = tensor_cache_hits();
  { Tensor small = Tensor::empty({1000}); }
  EXPECT_EQ(tensor_cache_extent_bytes(), extent0);
  EXPECT_EQ(tensor_cache_hits(), hits0);
  // An 8 MiB block, freed, serves the next 8 MiB tensor without new pages (below the extent).
  int64_t extent1 = 0;
  {
    Tensor a = Tensor::empty({2 * MiB});
    a.fill(1.f);
    extent1 = tensor_cache_extent_bytes();
    EXPECT_GE(tensor_cache_bytes() + tensor_bytes_live_thread(), 8 * MiB);
  }
  EXPECT_EQ(tensor_bytes_live_thread(), 0) << "a free block is not live";
  {
    const int64_t hits = tensor_cache_hits();
    Tensor b = Tensor::empty({2 * MiB});
    EXPECT_EQ(tensor_cache_hits(), hits + 1);
    Tensor z({2 * MiB});  // zero-initialised storage from the arena is zero all the same
    for (int64_t i = 0; i < z.numel(); i += 4099) ASSERT_EQ(z.data()[i], 0.f) << i;
    // A block of another size: split from the free space, 6 MiB where 8 were.
    Tensor c = Tensor::empty({6 * MiB / 4});
    EXPECT_GE(tensor_cache_peak_bytes(), 22 * MiB);
  }
  // The three blocks freed merge: one 22 MiB tensor fits where they were, no new pages.
  {
    const int64_t extent = tensor_cache_extent_bytes(), hits = tensor_cache_hits();
    Tensor d = Tensor::empty({22 * MiB / 4});
    EXPECT_EQ(tensor_cache_extent_bytes(), extent) << "the freed neighbours did not merge";
    EXPECT_EQ(tensor_cache_hits(), hits + 1);
  }
  EXPECT_GE(tensor_cache_extent_bytes(), extent1);
  // A hole between live blocks is used before new space.
  {
    Tensor p = Tensor::empty({2 * MiB}), q = Tensor::empty({2 * MiB}), r = Tensor::empty({2 * MiB});
    const float* hole = q.data();
    q = Tensor();
    const int64_t extent = tensor_cache_extent_bytes();
    Tensor s = Tensor::empty({2 * MiB});
    EXPECT_EQ(s.data(), hole);
    EXPECT_EQ(tensor_cache_extent_bytes(), extent);
  }
  EXPECT_GE(tensor_cache_largest_bytes(), 22 * MiB);
  // Blocks freed by another thread serve this one (one arena per process).
  const float* other = nullptr;
  std::thread([&] {
    Tensor t = Tensor::empty({6 * MiB / 4});
    other = t.data();
  }).join();
  EXPECT_EQ(Tensor::empty({6 * MiB / 4}).data(), other);
}

// Which free block serves a request: one of exactly its size if there is one, else the lowest
// that holds it (first fit), not the smallest (best fit), so that blocks in use stay packed
// towards the start. Holes of 40 and 20 MiB, the 40 below: 17 MiB comes from the 40 (best fit
// would take the 20); with holes of 40 and 17 MiB, 17 MiB comes from the 17 (exact).
TEST(Tensor, ArenaTakesAnExactFitElseTheLowestThatHolds) {
  const int64_t MiB4 = (int64_t{1} << 20) / 4;  // floats in a MiB
  for (const bool exact : {false, true}) {
    Tensor a = Tensor::empty({40 * MiB4}), fence1 = Tensor::empty({MiB4});
    Tensor b = Tensor::empty({(exact ? 17 : 20) * MiB4}), fence2 = Tensor::empty({MiB4});
    ASSERT_LT(a.data(), b.data());
    const float* low = a.data();
    const float* high = b.data();
    a = Tensor();
    b = Tensor();
    const int64_t extent = tensor_cache_extent_bytes();
    Tensor c = Tensor::empty({17 * MiB4});
    if (exact) {
      EXPECT_EQ(c.data(), high) << "the exact fit was not taken";
    } else {
      EXPECT_NE(c.data(), high) << "best fit, not first fit";
      EXPECT_LE(c.data(), low);  // the 40 MiB hole, or a free block below it
    }
    EXPECT_EQ(tensor_cache_extent_bytes(), extent);
  }
}

// A training step's shape: activations, then the logits (the peak), then the logits freed and
// more activation-sized gradients allocated in the backward pass. From the second step on,
// every allocation is served below the extent (no page is faulted in again), and the extent is
// the step's peak in use: the backward pass's blocks are split from the freed logits.
TEST(Tensor, ArenaServesARepeatedStepWithinItsPeak) {
  const int64_t MiB = int64_t{1} << 20;
  const int64_t act = 16 * MiB / 4, logits = 128 * MiB / 4;  // floats
  const int64_t extent0 = tensor_cache_extent_bytes(), free0 = tensor_cache_bytes();
  auto step = [&] {
    std::vector<Tensor> keep;
    for (int i = 0; i < 3; ++i) keep.push_back(Tensor::empty({act}));  // forward
    {
      Tensor l = Tensor::empty({logits});
      l.data()[0] = 1.f;
    }
    for (int i = 0; i < 2; ++i) keep.push_back(Tensor::empty({act}));  // backward
  };
  step();
  step();
  const int64_t extent = tensor_cache_extent_bytes();
  for (int s = 0; s < 3; ++s) {
    const int64_t before = tensor_cache_hits();
    step();
    EXPECT_EQ(tensor_cache_hits() - before, 6) << "step " << s << ": an allocation touched new pages";
    EXPECT_EQ(tensor_cache_extent_bytes(), extent) << "step " << s;
  }
  // The step's peak in use is 3 activations and the logits: 176 MiB. What the arena held free
  // before (earlier tests) may take part of it.
  EXPECT_LE(extent - extent0, 176 * MiB);
  EXPECT_GE(extent - extent0 + free0, 176 * MiB);
}

TEST(Rng, PhiloxKnownAnswer) {
  auto r = philox4x32({0, 0, 0, 0}, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  auto s = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffffffffffull);
  EXPECT_EQ(s[0], 0x408f276du);
  EXPECT_EQ(s[1], 0x41c83b0eu);
  EXPECT_EQ(s[2], 0xa20bc7c6u);
  EXPECT_EQ(s[3], 0x6d5451fdu);
}

TEST(Rng, NormalMomentsAndDistinctStreams) {
  uint64_t k = stream_key(1337, "wte.weight");
  EXPECT_NE(k, stream_key(1337, "wpe.weight"));
  EXPECT_NE(k, stream_key(1338, "wte.weight"));
  const int n = 200000;
  std::vector<float> x(n);
  fill_normal(x.data(), n, k, 0, 1.0f);
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= n;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
}

// A shard drawn on its own equals the same block of the whole tensor (decision 1).
TEST(Rng, BlockOfMatrixEqualsSliceOfWhole) {
  uint64_t k = stream_key(7, "h.0.mlp.c_fc.weight");
  const int R = 6, C = 10;
  std::vector<float> whole(R * C), block(3 * 4);
  fill_normal(whole.data(), R * C, k, 0, 0.02f);
  fill_normal_block(block.data(), 3, 4, 2, 5, C, k, 0.02f);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(block[r * 4 + c], whole[(2 + r) * C + 5 + c]);
}
