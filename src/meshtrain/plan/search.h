// The layout search of `meshtrain plan`: every layout a cluster can run a model with, each
// predicted by the cost and memory models (plan/cost.h), the ones that do not fit in memory
// dropped, the rest ranked by predicted step time. When none fits, advise() says what would
// make one fit, each lever re-checked with the memory model.
//
// The space (enumerate_layouts), bounded so a 3072-device cluster takes seconds:
//   - world sizes: every count from 1 to the cluster's devices when it has at most
//     kSmallCluster of them, else the powers of two below the device count and the count itself;
//   - dp x tp x pp = the world: tp divides the model's heads and stays inside a node (a CNN:
//     tp 1), pp up to the model's units (powers of two on a large cluster, as tp), dp the rest;
//     dp divides the global batch;
//   - micro-batches: the powers of two dividing the per-dp batch, pp times them (interleaving
//     needs a multiple of pp) and the per-dp batch itself, at most max_microbatches;
//   - pp > 1: gpipe, 1f1b, interleaved (2 chunks, where the units divide into 2 pp stages and
//     the micro-batches by pp) and zb; ZeRO 0-3 where dp > 1 (0 only at dp 1, where the stages
//     hold the same); recomputation off and on (GPT only: the CNNs' batch norms refuse it);
//   - a machine-file (CPU) cluster: ranks are threads on the nodes' cores, filled node by node,
//     each with max(1, cores / ranks on its node) kernel threads, as train does.
// Layouts the cost model refuses (a schedule's shape it cannot take) are counted, not ranked.
// A layout with recomputation is predicted only where the same layout without it does not fit
// (it would only be slower); the others are counted as dominated.
//
// Memory: a device cluster's rank must fit its device (Prediction::peak_bytes <= memory); a
// CPU cluster's ranks of one node share its memory, so their sum must fit (memory_need).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/model/spec.h"
#include "meshtrain/plan/cluster.h"
#include "meshtrain/plan/cost.h"

namespace meshtrain::plan {

inline constexpr int kSmallCluster = 16;

struct SearchOptions {
  int64_t batch = 1;         // global batch (samples)
  int64_t seq = 1;           // sequence length (1 for images)
  int optimizer_state = 2;   // floats of state per parameter (plan::Layout::optimizer_state)
  int max_microbatches = 64;
};

// Every layout of the space above for `spec` on `c` (not yet predicted). Throws
// std::invalid_argument for a batch or sequence length below 1.
std::vector<Layout> enumerate_layouts(const model::ModelSpec& spec, const Cluster& c, const SearchOptions& o);

// The bytes of layout `l` that must fit in the cluster's memory (Hardware::memory_bytes):
// the most one rank holds on a device cluster; on a CPU cluster the ranks of its fullest node
// together.
double memory_need(const std::vector<RankMemory>& memory, const Layout& l, const Hardware& hw);

struct SearchResult {
  std::vector<Prediction> ranked;  // the layouts that fit, fastest first (timelines dropped)
  int64_t tried = 0;               // layouts enumerated
  int64_t refused = 0;             // refused by the cost model (a shape it cannot take)
  int64_t too_big = 0;             // dropped by the memory filter
  // With recomputation where the same layout without it fits (and is faster): not predicted.
  int64_t dominated = 0;
  // The least memory_need of any layout tried, and that layout.
  double smallest_need = std::numeric_limits<double>::infinity();
  Layout smallest;
};

// (done, total) now and then while predicting.
using SearchProgress = std::function<void(int64_t done, int64_t total)>;

// Predicts every layout of enumerate_layouts (on all cores), filters and ranks them; ties in
// step time go to the smaller memory need, then the fewer devices.
SearchResult search_layouts(const model::ModelSpec& spec, const Cluster& c, const SearchOptions& o,
                            const SearchProgress& progress = {});

// Why nothing fits and what would, in one sentence for a user: the smallest need against the
// memory; what recomputation and ZeRO-3 do to it (re-checked with the memory model); the
// smallest multiple of the cluster's nodes on which a layout fits, if any up to 1024 x; a
// nearby global batch that would fit where the given one divides over too few dp ranks.
std::string advise(const model::ModelSpec& spec, const Cluster& c, const SearchOptions& o, const SearchResult& r);

}  // namespace meshtrain::plan
