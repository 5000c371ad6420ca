// The layout search (plan/search.h): every enumerated layout is one the trainer can run on the
// cluster, the space covers what the header promises, the memory filter keeps exactly the
// layouts whose predicted need fits (recomputed here from predict_memory), the ranking is by
// step time as predict gives it, and the advice names the levers when nothing fits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "meshtrain/plan/search.h"

namespace {
using meshtrain::plan::Cluster;
using meshtrain::plan::Layout;
using meshtrain::plan::SearchOptions;
using nlohmann::json;

Cluster device_cluster(int nodes, int per_node, double memory_gb) {
  json j = json::parse(R"({
    "kind": "meshtrain cluster", "version": 1, "name": "test",
    "device": {"peak_tflops": 100, "gemm_tflops": 60, "attention_tflops": 30, "memory_gb": 16,
               "memory_bandwidth_gbps": 1000, "kernel_overhead_us": 5},
    "links": {"intra_node": {"bandwidth_gbps": 200, "latency_us": 2},
              "inter_node": {"bandwidth_gbps": 10, "latency_us": 8}}})");
  j["nodes"] = nodes, j["devices_per_node"] = per_node, j["device"]["memory_gb"] = memory_gb;
  return meshtrain::plan::cluster_from_json(j, "test.json", "");
}

// A CPU cluster: a measured machine of `cores` cores (rates made up, positive).
Cluster cpu_cluster(int cores, double memory_gb) {
  meshtrain::plan::MachineProfile p;
  p.mode = "quick", p.host = "h", p.cpu_model = "Test CPU", p.cores = cores, p.bf16_isa = "emulated";
  p.call_overhead_s = 2e-6;
  for (int t = 1; t <= cores; t *= 2) p.gemm.push_back({"square_1024", 1024, 1024, 1024, "float32", t, 100.0 * t});
  p.elementwise = {{"add", 1 << 20, 1, 2e10}};
  p.attention = {{2, 256, 384, 6, 1, 50}};
  p.links = {{"threads", "all_reduce", 2, 5e-6, 1e-10, 0.1, {{8, 5e-6}, {1 << 20, 1.1e-4}}},
             {"threads", "sendrecv", 2, 1e-6, 1e-10, 0.1, {{8, 1e-6}, {1 << 20, 1.1e-4}}}};
  Cluster c;
  c.name = "cpu";
  c.hardware = meshtrain::plan::hardware_from_machine(p, memory_gb * 1e9);
  c.hardware.devices_per_node = meshtrain::plan::kCpuRanksPerCore * cores;
  return c;
}

bool pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// The least and the most memory need of any enumerated layout, from predict_memory.
std::pair<double, double> need_range(const meshtrain::model::ModelSpec& spec, const Cluster& c, const SearchOptions& o) {
  double least = 1e300, most = 0;
  for (const Layout& l : meshtrain::plan::enumerate_layouts(spec, c, o)) {
    try {
      const double n = meshtrain::plan::memory_need(meshtrain::plan::predict_memory(spec, l), l, c.hardware);
      least = std::min(least, n), most = std::max(most, n);
    } catch (const std::invalid_argument&) {
    }
  }
  return {least, most};
}

// What the header promises of every layout, checked from the layout's own fields.
void expect_valid(const Layout& l, const meshtrain::model::ModelSpec& spec, const Cluster& c, const SearchOptions& o) {
  const std::string d = l.describe();
  const auto& hw = c.hardware;
  EXPECT_GE(l.dp, 1) << d;
  EXPECT_LE(l.world(), hw.devices()) << d;
  EXPECT_TRUE(hw.devices() <= meshtrain::plan::kSmallCluster || pow2(l.world()) || l.world() == hw.devices()) << d;
  EXPECT_EQ(o.batch % (int64_t{l.dp} * l.microbatches), 0) << d;
  EXPECT_LE(l.microbatches, o.max_microbatches) << d;
  EXPECT_LE(l.pp, spec.num_units()) << d;
  EXPECT_LE(l.tp, hw.devices_per_node) << d;
  if (const auto* g = spec.gpt()) {
    EXPECT_EQ(g->n_head % l.tp, 0) << d;
  } else {
    EXPECT_EQ(l.tp, 1) << d;
    EXPECT_FALSE(l.recompute) << d;
  }
  if (l.zero > 0) {
    EXPECT_GT(l.dp, 1) << d;
  }
  if (l.pp == 1) {
    EXPECT_EQ(l.chunks, 1) << d;
  }
  if (l.schedule == "interleaved") {
    EXPECT_EQ(l.chunks, 2) << d;
    EXPECT_EQ(spec.num_units() % (2 * l.pp), 0) << d;
    EXPECT_EQ(l.microbatches % l.pp, 0) << d;
  }
  EXPECT_EQ(l.batch, o.batch);
  EXPECT_EQ(l.seq, o.seq);
  EXPECT_EQ(l.optimizer_state, o.optimizer_state);
  if (c.cpu()) {
    // The trainer's rule: cores / ranks on the process, at least 1.
    EXPECT_EQ(l.threads, std::max(1, hw.cores / l.world())) << d;
  } else {
    EXPECT_EQ(l.threads, 1) << d;
  }
}

TEST(LayoutSearch, EveryEnumeratedLayoutIsValidAndTheSpaceIsCovered) {
  const auto spec = meshtrain::model::model_spec("gpt-small");  // 6 heads, 6 blocks
  for (const Cluster& c : {device_cluster(1, 8, 80), cpu_cluster(2, 8)}) {
    SearchOptions o;
    o.batch = 840, o.seq = 64;  // 840 divides by every data-parallel count from 1 to 8
    const auto layouts = meshtrain::plan::enumerate_layouts(*spec, c, o);
    ASSERT_FALSE(layouts.empty());
    std::set<int> worlds, tps, pps, zeros;
    std::set<std::string> schedules, seen;
    std::set<bool> recompute;
    for (const Layout& l : layouts) {
      expect_valid(l, *spec, c, o);
      worlds.insert(l.world()), tps.insert(l.tp), pps.insert(l.pp), zeros.insert(l.zero);
      recompute.insert(l.recompute);
      if (l.pp > 1) schedules.insert(l.schedule);
      EXPECT_TRUE(seen.insert(l.describe() + " t" + std::to_string(l.threads)).second) << "twice: " << l.describe();
    }
    // A small cluster: every world size up to its devices, and what divides 6 heads.
    for (int w = 1; w <= c.hardware.devices(); ++w) EXPECT_TRUE(worlds.count(w)) << "world " << w;
    EXPECT_EQ(tps, (std::set<int>{1, 2, 3, 6}));
    EXPECT_EQ(pps, (std::set<int>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(zeros, (std::set<int>{0, 1, 2, 3}));
    EXPECT_EQ(schedules, (std::set<std::string>{"gpipe", "1f1b", "interleaved", "zb"}));
    EXPECT_EQ(recompute.size(), 2u);
  }
}

TEST(LayoutSearch, ALargeClusterIsBoundedToPowersOfTwoInsideNodes) {
  const auto spec = meshtrain::model::model_spec("gpt2-124m");  // 12 heads, 12 blocks
  const Cluster c = device_cluster(384, 8, 80);
  SearchOptions o;
  o.batch = 1536, o.seq = 1024;
  const auto layouts = meshtrain::plan::enumerate_layouts(*spec, c, o);
  ASSERT_FALSE(layouts.empty());
  EXPECT_LT(layouts.size(), 100000u);
  std::set<int> worlds;
  for (const Layout& l : layouts) {
    expect_valid(l, *spec, c, o);
    EXPECT_TRUE(pow2(l.tp)) << l.describe();
    EXPECT_TRUE(pow2(l.pp)) << l.describe();
    worlds.insert(l.world());
  }
  EXPECT_TRUE(worlds.count(3072));  // all devices: dp 384 x tp 8, 1536 / 384 divides
  EXPECT_TRUE(worlds.count(1));
}

TEST(LayoutSearch, CnnsGetTensorParallelismOneAndNoRecomputation) {
  const auto spec = meshtrain::model::model_spec("resnet-small");
  const Cluster c = device_cluster(1, 8, 80);
  SearchOptions o;
  o.batch = 32;
  for (const Layout& l : meshtrain::plan::enumerate_layouts(*spec, c, o)) expect_valid(l, *spec, c, o);
}

// The memory filter keeps exactly what fits (need recomputed here), the ranking follows
// predict's step time, and the counts add up.
void check_search(const meshtrain::model::ModelSpec& spec, const Cluster& c, const SearchOptions& o,
                  int64_t* too_big_out) {
  const auto& hw = c.hardware;
  const auto r = meshtrain::plan::search_layouts(spec, c, o);
  const auto layouts = meshtrain::plan::enumerate_layouts(spec, c, o);
  EXPECT_EQ(r.tried, static_cast<int64_t>(layouts.size()));
  EXPECT_EQ(r.tried, r.refused + r.too_big + r.dominated + static_cast<int64_t>(r.ranked.size()));
  // What should rank: fits, and is not a recomputing twin of a layout that fits without it.
  std::map<std::string, double> need;
  for (const Layout& l : layouts) {
    try {
      need[l.describe()] = meshtrain::plan::memory_need(meshtrain::plan::predict_memory(spec, l), l, hw);
    } catch (const std::invalid_argument&) {
    }
  }
  std::set<std::string> expected;
  int64_t too_big = 0;
  for (const Layout& l : layouts) {
    auto it = need.find(l.describe());
    if (it == need.end()) continue;
    if (it->second > hw.memory_bytes) {
      ++too_big;
      continue;
    }
    if (l.recompute) {
      Layout plain = l;
      plain.recompute = false;
      auto twin = need.find(plain.describe());
      if (twin != need.end() && twin->second <= hw.memory_bytes) continue;
    }
    expected.insert(l.describe());
  }
  std::set<std::string> ranked;
  for (const auto& p : r.ranked) ranked.insert(p.layout.describe());
  EXPECT_EQ(ranked, expected);
  EXPECT_LE(r.too_big, too_big);  // twins of fitting layouts are not checked at all
  *too_big_out = r.too_big;
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const auto& p = r.ranked[i];
    EXPECT_LE(meshtrain::plan::memory_need(p.memory, p.layout, hw), hw.memory_bytes) << p.layout.describe();
    if (i > 0) {
      EXPECT_LE(r.ranked[i - 1].step_s, p.step_s) << i;
    }
  }
  // The first few as predict gives them, one by one.
  for (size_t i = 0; i < std::min<size_t>(5, r.ranked.size()); ++i) {
    const auto again = meshtrain::plan::predict(spec, r.ranked[i].layout, hw);
    EXPECT_DOUBLE_EQ(again.step_s, r.ranked[i].step_s) << r.ranked[i].layout.describe();
  }
}

TEST(LayoutSearch, RanksWhatFitsByStepTime) {
  const auto spec = meshtrain::model::model_spec("gpt-small");
  SearchOptions o;
  o.batch = 16, o.seq = 128;
  int64_t too_big = -1;
  check_search(*spec, device_cluster(1, 8, 80), o, &too_big);
  EXPECT_EQ(too_big, 0);
  check_search(*spec, cpu_cluster(2, 16), o, &too_big);
}

TEST(LayoutSearch, TinyMemoryDropsLayouts) {
  const auto spec = meshtrain::model::model_spec("gpt-small");
  SearchOptions o;
  o.batch = 16, o.seq = 128;
  // Between the least and the most any layout needs: some fit, some do not.
  const auto [least, most] = need_range(*spec, device_cluster(1, 8, 80), o);
  ASSERT_LT(least, most);
  const Cluster tight = device_cluster(1, 8, std::sqrt(least * most) / 1e9);
  int64_t too_big = 0;
  check_search(*spec, tight, o, &too_big);
  EXPECT_GT(too_big, 0);
  const auto r = meshtrain::plan::search_layouts(*spec, tight, o);
  EXPECT_FALSE(r.ranked.empty());
  EXPECT_GE(r.smallest_need, least);
}

TEST(LayoutSearch, CpuRanksOfANodeShareItsMemory) {
  const auto spec = meshtrain::model::model_spec("gpt-tiny");
  const Cluster c = cpu_cluster(2, 8);
  Layout one, two;
  one.batch = two.batch = 8, one.seq = two.seq = 32;
  two.dp = 2;
  double per_rank = 0;
  for (const auto& m : meshtrain::plan::predict_memory(*spec, two)) per_rank += m.total();
  EXPECT_DOUBLE_EQ(meshtrain::plan::memory_need(meshtrain::plan::predict_memory(*spec, two), two, c.hardware),
                   2 * per_rank);
  // A device cluster: the most one rank holds.
  const Cluster d = device_cluster(1, 8, 80);
  EXPECT_DOUBLE_EQ(meshtrain::plan::memory_need(meshtrain::plan::predict_memory(*spec, two), two, d.hardware),
                   per_rank);
}

TEST(LayoutSearch, AdviceNamesTheLeversWhenNothingFits) {
  const auto spec = meshtrain::model::model_spec("gpt-small");
  SearchOptions o;
  o.batch = 8, o.seq = 256;
  const Cluster c = device_cluster(1, 8, 1e-6);  // 1 kB a device
  const auto r = meshtrain::plan::search_layouts(*spec, c, o);
  ASSERT_TRUE(r.ranked.empty());
  EXPECT_EQ(r.too_big + r.refused, r.tried);
  EXPECT_DOUBLE_EQ(r.smallest_need, need_range(*spec, c, o).first);
  const std::string m = meshtrain::plan::advise(*spec, c, o, r);
  for (const char* w : {"fits no layout", "recomputation", "ZeRO-3", "devices", "gpt-small"})
    EXPECT_NE(m.find(w), std::string::npos) << w << ": " << m;
}

TEST(LayoutSearch, AdviceOffersABatchThatDivides) {
  // 67 is prime: one data-parallel rank, one micro-batch of 67 sequences; 64 or 68 divide.
  const auto spec = meshtrain::model::model_spec("gpt-small");
  SearchOptions o;
  o.batch = 67, o.seq = 256;
  SearchOptions b64 = o;
  b64.batch = 64;
  const double least64 = need_range(*spec, device_cluster(1, 8, 80), b64).first;
  const double least67 = need_range(*spec, device_cluster(1, 8, 80), o).first;
  ASSERT_LT(least64, least67);
  // Memory between the two: a batch of 64 fits, 67 does not.
  const Cluster c = device_cluster(1, 8, std::sqrt(least64 * least67) / 1e9);
  const auto r = meshtrain::plan::search_layouts(*spec, c, o);
  ASSERT_TRUE(r.ranked.empty());
  const std::string m = meshtrain::plan::advise(*spec, c, o, r);
  EXPECT_NE(m.find("a global batch of"), std::string::npos) << m;
}

}  // namespace
