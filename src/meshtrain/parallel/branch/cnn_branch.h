// Inception blocks' branches placed on different ranks of the intra-layer group
// (--branch-parallel N; model/cnn_layout.h): the CNN layout under which rank r of the group
// builds and computes only the branches assigned to it, and the block's concatenation along
// channels becomes an all-gather.
//
//   the join            forward                              backward
//   outputs -> concat   all-gather along channels            each branch its channels of dy
//                       (variable counts: rank r sends       (no communication)
//                       its branches' channels)
//   input gradient      (the input is replicated)            all-reduce dx over the group
//
// Assignment. Every block asks branches_here with its branches' forward+backward FLOPs; the rank
// of branch b is balance[b] (--branch-balance 0,1,1,0: the same for every block) or, without a
// balance, the longest-processing-time greedy over the group by cost: branches by falling cost
// (ties: lower index first), each to the rank with the least cost so far (ties: lower rank).
// With at most as many ranks as branches every rank gets one. The cost is the branch's measured
// seconds (model::measure_branch_costs, timed by the trainer on one rank at start and broadcast,
// so every rank places alike) or, with --branch-balance flops or where nothing was measured, its
// FLOPs (the same on every rank by construction).
//
// Everything outside the blocks (the stem, the classifier) runs replicated: every rank of the
// group computes the same values from the same whole input (the all-gather gives every rank the
// whole concatenation; the all-reduce every rank the whole input gradient), so their gradients
// are equal and are counted once (tp rank 0), as for the filter split's replicated parameters.
// A branch's parameters and batch-norm buffers exist only on the rank computing it; their shard
// spec is ShardSpec::owned(rank, N) (nn/param.h), so checkpoints take them from their owner, the
// gradient norm and LAMB's per-parameter norms count them there once, and a checkpoint holds
// every tensor whole: a run resumes at any other layout.
//
// Under pipeline parallelism each stage builds its units with this layout: a stage without
// Inception blocks (the stem) is simply replicated over the group, a stage with them splits
// their branches; the executor sees whole activations at every stage boundary.
//
// Bytes per micro-batch of n samples (ring collectives, kTPAlgorithm; comm/ring.cpp), per block
// with input (C_in, H, W) and rank r's branches holding L_r of the output channels: the ring
// all-gather with counts c_q = n L_q H W has rank r send every block but that of rank r+1
// (its own, then p-2 forwarded), sum_q c_q - c_{r+1}; the all-reduce of m = n C_in H W floats is a
// ring reduce-scatter (rank r sends every near-equal part but its own: m - e_r) then an
// all-gather (m - e_{r+1}), e_q = m/p + (q < m mod p). Nothing else crosses the group.
//
// Limits: 2 to 4 ranks (an Inception block has four branches); the model must have Inception
// blocks (validate_cnn_branch); float32 on the wire (image models refuse --comm-dtype bf16).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/cnn_layout.h"

namespace meshtrain::parallel {

// --branch-balance "0,1,1,0" for `ranks` ranks and `branches` branches: the rank of each branch.
// Throws std::invalid_argument with a sentence when it names the wrong number of branches, a
// rank outside 0..ranks-1 or something not a number, or leaves a rank without a branch.
std::vector<int> parse_branch_balance(const std::string& balance, int ranks, int branches = 4);

// The rank of each branch: `balance` when it lists ranks (parse_branch_balance), otherwise
// (empty or "flops") the longest-processing-time greedy over `costs` (see the top of this file).
std::vector<int> assign_branches(const std::vector<double>& costs, int ranks, const std::string& balance);

// Throws std::invalid_argument with a sentence when `cfg` cannot be split by branches over
// `ranks` ranks with `balance`: a model without Inception blocks, more ranks than branches, a bad
// balance.
void validate_cnn_branch(const model::CNNConfig& cfg, int ranks, const std::string& balance);

// The layout placing each Inception block's branches over `group` (size 2 or more): by
// `balance` ("0,1,1,0": the rank of each branch), by FLOPs ("flops"), or, empty, by the
// `measured` seconds of each block's branches (model::measure_branch_costs; the same on every
// rank) where given, else by FLOPs.
std::shared_ptr<const model::CNNLayout> cnn_branch_layout(std::shared_ptr<comm::Communicator> group,
                                                          const std::string& balance,
                                                          std::map<std::string, std::vector<double>> measured = {});

// Analytic bytes rank `rank` of the group sends per micro-batch of `rows` samples of `cfg`
// (forward and backward), for the tests and the run's report: what the table above moves, for
// the placement `balance` gives (a list of ranks, or placement by FLOPs: empty or "flops").
uint64_t cnn_branch_bytes_per_microbatch(const model::CNNConfig& cfg, int ranks, const std::string& balance,
                                         int64_t rows, int rank = 0);

}  // namespace meshtrain::parallel
