// The cost model of the collectives (alpha-beta-gamma) and `Algorithm::automatic`: which
// algorithm runs an operation of n bytes on p ranks. The planner (plan/) reads the same formulas.
//
// Limits: the constants are measured on this machine class (2-core Sapphire Rapids VM; see
// docs/benchmarks.md, "Communication"); on other machines `auto` may pick the second-best
// algorithm, which every option can override.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "meshtrain/comm/transport.h"
#include "meshtrain/comm/types.h"

namespace meshtrain::comm {

// ---- cost model ----
struct CostParams {
  double alpha;  // seconds per message (latency, including the wake-up of the peer)
  double beta;   // seconds per byte moved
  double gamma;  // seconds per byte reduced
};
// "threads" or "mpi"; alpha is one exchange step (a one-way tree step costs alpha / 2) and is
// scaled by max(1, p / cores) for p ranks, since oversubscribed ranks wait for the scheduler.
CostParams cost_params(std::string_view backend, int p);
CostParams cost_params(std::string_view backend);  // p = 1

// Predicted time of one operation; n = bytes of the whole vector (all_reduce, broadcast,
// reduce) or of the whole output (reduce_scatter input, all_gather output, all_to_all buffer).
double predicted_seconds(OpKind op, Algorithm a, std::size_t n, int p, const CostParams& c);

// ---- choice ----
// The algorithms that implement `op` (native only where the backend has one).
std::vector<Algorithm> algorithms_for(OpKind op);
bool supports(OpKind op, Algorithm a);
// The cheapest of algorithms_for(op) (excluding native) under cost_params(backend).
Algorithm choose_algorithm(OpKind op, std::size_t n, int p, std::string_view backend);

// Default pipelining segment of ring and broadcast, per backend.
std::size_t default_chunk_bytes(std::string_view backend);

}  // namespace meshtrain::comm
