// Goodput of global batches (`meshtrain plan --goodput`): which global batch makes the most
// progress per second, given the gradient noise scale a training run measured
// (train/noise_scale.h). For each candidate batch B the planner predicts a layout's step
// (plan/cost.h: the fastest layout that fits at B, or the one the user names), so its
// throughput in samples per second; Pollux's statistical efficiency E(B) against the base batch
// B0 says what share of those samples buy the progress a B0 batch buys per sample:
//   goodput(B) = samples_per_s(B) x E(B),   E(B) = (B_noise + B0) / (B_noise + B)
// A small noise scale (the gradient's signal dominates) makes large batches wasteful, E ~ B0/B,
// so goodput ~ B0 / step time and the smallest batch wins; a large one makes E ~ 1 everywhere,
// so the batch with the most samples per second wins.
//
// The efficiency is passed in (plan/ sits below train/, whose stat_efficiency the CLI passes),
// so the planner ranks with exactly the function the trainer reports per step.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/plan/cost.h"

namespace meshtrain::plan {

// E(B) against B0 for a noise scale (train::stat_efficiency).
using Efficiency = std::function<double(double noise_scale, double b0, double b)>;

// The candidate global batches: base, 2 base, 4 base, ... while at most `max`. Throws
// std::invalid_argument for a base below 1 or a max below the base.
std::vector<int64_t> goodput_batches(int64_t base, int64_t max);

struct GoodputRow {
  Prediction prediction;  // the layout predicted at this batch (prediction.layout.batch)
  double efficiency = 0;  // E(batch) against the base batch
  double goodput = 0;     // prediction.samples_per_s x efficiency
  int64_t batch() const { return prediction.layout.batch; }
};

struct GoodputRanking {
  std::vector<GoodputRow> rows;  // in the order given (the candidate batches, smallest first)
  size_t best = 0;               // the row of the highest goodput; a tie goes to the smaller batch
};

// Ranks the predictions (one per candidate batch, each with its layout.batch set) by goodput
// with the given noise scale and base batch. Throws std::invalid_argument for no predictions,
// a negative or non-finite noise scale, a base batch below 1, or a prediction without a
// positive step time.
GoodputRanking rank_goodput(std::vector<Prediction> per_batch, double noise_scale, int64_t base,
                            const Efficiency& efficiency);

}  // namespace meshtrain::plan
