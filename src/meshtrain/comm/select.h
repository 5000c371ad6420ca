// The cost model of the collectives (alpha-beta-gamma) and `Algorithm::automatic`: which
// algorithm runs an operation of n bytes on p ranks. The planner (plan/) reads the same formulas.
//
// Limits: the constants are measured on this machine class (2-core Sapphire Rapids VM; see
// docs/benchmarks.md, "Communication"); on other machines `auto` may pick the second-best
// algorithm, which every option can override.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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

// ---- hosts ----
// Where the ranks of a group sit: `hosts` hosts of `ranks_per_host` ranks each, with the cost of
// a message inside a host and between two hosts. One host (or uneven hosts): hier does not apply.
struct HostLayout {
  int hosts = 1;
  int ranks_per_host = 1;
  CostParams in_host{}, across{};
  int ranks() const { return hosts * ranks_per_host; }
  // The links between hosts are slower than those inside one (latency or bandwidth).
  bool across_slower() const { return across.alpha > in_host.alpha || across.beta > in_host.beta; }
};
// Hierarchical all-reduce of n bytes (hier.cpp): ring reduce-scatter inside a host (K ranks,
// in-host link), ring all-reduce of one n/K shard across the H hosts (link between hosts), ring
// all-gather inside a host.
double predicted_hier_seconds(std::size_t n, const HostLayout& h);
// A flat all-reduce of n bytes over all ranks with algorithm a: every step of ring, rhd and
// tree has some message cross hosts when there are several, so a step costs what the link
// between hosts costs.
double predicted_flat_seconds(Algorithm a, std::size_t n, const HostLayout& h);
// `auto` for all_reduce on a group that knows its hosts: hier when the links between hosts are
// slower than inside one and hier's predicted time beats the best flat algorithm's on those
// links; otherwise what choose_algorithm picks (the choice without hosts, unchanged).
Algorithm choose_all_reduce(std::size_t n, const HostLayout& h, std::string_view backend);

// ---- choice ----
// The algorithms that implement `op` (native only where the backend has one).
std::span<const Algorithm> algorithms_for(OpKind op);
bool supports(OpKind op, Algorithm a);
// The cheapest of algorithms_for(op) (excluding native, hier and shm) under cost_params(backend).
Algorithm choose_algorithm(OpKind op, std::size_t n, int p, std::string_view backend);

// Where the ranks share memory (Transport::shared_memory: threads, or mpi on one host),
// all_reduce runs shm instead of `chosen` wherever that keeps the bits `chosen` gives: at p = 2
// (two terms have one sum whatever the order) and where `chosen` is tree (shm adds in the
// tree's order). Elsewhere (ring or rhd at p >= 3) `chosen` stays, so `auto` never changes a
// result; shm can still be asked for by name. Other operations: `chosen`.
// `bytes` above `limit` (the shared segment of an mpi process): `chosen`.
Algorithm prefer_shared_memory(OpKind op, Algorithm chosen, int p, std::size_t bytes = 0,
                               std::size_t limit = SIZE_MAX);

// Default pipelining segment of ring and broadcast, per backend.
std::size_t default_chunk_bytes(std::string_view backend);

}  // namespace meshtrain::comm
