// What a convolutional network holds on one rank of a split intra-layer group (--tp, --spatial,
// --branch-parallel), measured by running it: the group's ranks as threads of this process,
// each building the whole model with the split's layer factory (parallel/) and running one
// forward and backward of a micro-batch of one and of two zero images, as model/spec.cpp
// measures one rank (CNNSpec::kept_by). A split's tensors do not divide by the group: the
// replicated layers (pooling, the classifier, batch norms of whole activations) hold whole
// activations, the gathers and the halos hold theirs, the branch split's ranks hold different
// branches; running the layers counts all of it.
//
// Limits: the whole model as one stage (pp 1); a pipeline's stages under a split fall back to
// the single rank's figures over the group (plan/cost.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/model/cnn.h"
#include "meshtrain/plan/cost.h"

namespace meshtrain::plan {

// Per rank of the group, for a micro-batch of the run's size (measured at that size: the
// splits' buffers do not all grow in proportion to it): what one forward keeps until its
// backward (`kept`), and the most alive over the forward and backward (`peak`, the kept tensors
// included), beyond the parameters and gradients.
struct SplitMemory {
  std::vector<double> params;  // parameter elements each rank holds (replicated ones whole)
  std::vector<double> kept, peak;
};

// Cached per (model, input size, split, group size, balance, rows). Throws
// std::invalid_argument as the layout's validation does.
// `branch_costs`: the branch split's measured seconds per block (branch_costs below; empty: by
// FLOPs), placed as the trainer places them.
SplitMemory split_memory(const model::CNNConfig& cfg, Layout::Split split, int tp, const std::string& balance,
                         int64_t rows, const std::map<std::string, std::vector<double>>& branch_costs = {});

// The trainer's measurement of each block's branches (model::measure_branch_costs at
// min(32, rows) images and `threads` threads) for a branch split without --branch-balance, cached
// per (model, input size, rows, threads): the planner places the branches as the run will.
const std::map<std::string, std::vector<double>>& branch_costs(const model::CNNConfig& cfg, int64_t rows, int threads);

}  // namespace meshtrain::plan
