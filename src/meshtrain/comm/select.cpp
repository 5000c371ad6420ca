// Cost formulas and the automatic algorithm choice (see select.h). The formulas are those in
// the header comment of each algorithm file; the constants come from fitting
// `meshtrain bench comm` runs on this machine class (docs/benchmarks.md).
#include "meshtrain/comm/select.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <limits>

namespace meshtrain::comm {

// ---- constants ----
// alpha is the cost of one exchange step (every rank sends and receives); a one-way tree step
// costs alpha / 2. Fitted to `meshtrain bench comm` on this machine class (docs/benchmarks.md):
// threads: 4K all-reduce at p = 2 took 4.8 us (tree, 2 one-way steps) to 5.9 us (rhd, 2
// exchanges); 32 MiB single-thread reduce and memcpy both ran at 10-12 GB/s per operand.
// When ranks outnumber cores a step waits for the scheduler, so alpha grows with p / cores.
CostParams cost_params(std::string_view backend, int p) {
  // Asked once: hardware_concurrency reads /sys (system calls), and every `auto` call comes here.
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double oversub = std::max(1.0, static_cast<double>(p) / cores);
  if (backend == "mpi") return {6.0e-6 * oversub, 1.0 / 6.0e9, 1.0 / 10.0e9};
  return {5.0e-6 * oversub, 1.0 / 10.0e9, 1.0 / 10.0e9};
}
CostParams cost_params(std::string_view backend) { return cost_params(backend, 1); }

std::size_t default_chunk_bytes(std::string_view backend) {
  return backend == "mpi" ? (std::size_t{1} << 20) : (std::size_t{1} << 20);
}

// ---- formulas ----
namespace {
double log2ceil(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}
}  // namespace

double predicted_seconds(OpKind op, Algorithm a, std::size_t bytes, int p, const CostParams& c) {
  if (p <= 1) return 0.0;
  const double n = static_cast<double>(bytes), P = p, L = log2ceil(p);
  const double frac = (P - 1) / P;
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  const double P2 = pof2, frac2 = (P2 - 1) / P2;
  const bool fixup = pof2 != p;
  switch (op) {
    case OpKind::all_reduce:
      if (a == Algorithm::ring) return 2 * (P - 1) * c.alpha + 2 * frac * n * c.beta + frac * n * c.gamma;
      if (a == Algorithm::rhd)
        return 2 * std::log2(P2) * c.alpha + 2 * frac2 * n * c.beta + frac2 * n * c.gamma +
               (fixup ? 2 * c.alpha + 2 * n * c.beta + n * c.gamma : 0.0);
      if (a == Algorithm::tree) return 2 * L * (c.alpha / 2 + n * c.beta) + L * n * c.gamma;
      // shm: two synchronisations (a quarter of an exchange each); every rank reads and writes
      // n bytes at once, the reduction hidden under the memory traffic.
      if (a == Algorithm::shm) return c.alpha / 2 + n * c.beta;
      break;
    case OpKind::reduce_scatter:
      if (a == Algorithm::ring) return (P - 1) * c.alpha + frac * n * (c.beta + c.gamma);
      break;
    case OpKind::all_gather:
      if (a == Algorithm::ring) return (P - 1) * c.alpha + frac * n * c.beta;
      break;
    case OpKind::broadcast:
      if (a == Algorithm::tree) return L * (c.alpha / 2 + n * c.beta);
      break;
    case OpKind::reduce:
      if (a == Algorithm::tree) return L * (c.alpha / 2 + n * (c.beta + c.gamma));
      break;
    case OpKind::all_to_all:
      if (a == Algorithm::direct) return (P - 1) * c.alpha + frac * n * c.beta;
      break;
    case OpKind::barrier:
      return L * c.alpha;
  }
  return std::numeric_limits<double>::infinity();
}

// ---- choice ----
std::span<const Algorithm> algorithms_for(OpKind op) {
  // Static tables: asking allocates nothing (every all_reduce asks).
  // hier needs the group's hosts (choose_all_reduce), shm shared memory (prefer_shared_memory);
  // choose_algorithm picks neither.
  static constexpr Algorithm all_reduce[] = {Algorithm::ring, Algorithm::rhd,    Algorithm::tree,
                                             Algorithm::hier, Algorithm::shm,    Algorithm::native};
  static constexpr Algorithm ring[] = {Algorithm::ring, Algorithm::native};
  static constexpr Algorithm tree[] = {Algorithm::tree, Algorithm::native};
  static constexpr Algorithm direct[] = {Algorithm::direct, Algorithm::native};
  switch (op) {
    case OpKind::all_reduce: return all_reduce;
    case OpKind::reduce_scatter:
    case OpKind::all_gather: return ring;
    case OpKind::broadcast:
    case OpKind::reduce:
    case OpKind::barrier: return tree;
    case OpKind::all_to_all: return direct;
  }
  return {};
}

bool supports(OpKind op, Algorithm a) {
  if (a == Algorithm::automatic) return true;
  for (Algorithm b : algorithms_for(op))
    if (a == b) return true;
  return false;
}

Algorithm choose_algorithm(OpKind op, std::size_t n, int p, std::string_view backend) {
  const CostParams c = cost_params(backend, p);
  Algorithm best = algorithms_for(op).front();
  double best_t = std::numeric_limits<double>::infinity();
  for (Algorithm a : algorithms_for(op)) {
    if (a == Algorithm::native || a == Algorithm::hier || a == Algorithm::shm) continue;
    const double t = predicted_seconds(op, a, n, p, c);
    if (t < best_t) best_t = t, best = a;
  }
  return best;
}

Algorithm prefer_shared_memory(OpKind op, Algorithm chosen, int p, std::size_t bytes, std::size_t limit) {
  if (op != OpKind::all_reduce || p < 2 || chosen == Algorithm::hier || bytes > limit) return chosen;
  return p == 2 || chosen == Algorithm::tree ? Algorithm::shm : chosen;
}

// ---- hosts ----
double predicted_hier_seconds(std::size_t n, const HostLayout& h) {
  const int K = h.ranks_per_host, H = h.hosts;
  const std::size_t shard = (n + static_cast<std::size_t>(K) - 1) / static_cast<std::size_t>(K);
  return predicted_seconds(OpKind::reduce_scatter, Algorithm::ring, n, K, h.in_host) +
         predicted_seconds(OpKind::all_reduce, Algorithm::ring, shard, H, h.across) +
         predicted_seconds(OpKind::all_gather, Algorithm::ring, n, K, h.in_host);
}

double predicted_flat_seconds(Algorithm a, std::size_t n, const HostLayout& h) {
  return predicted_seconds(OpKind::all_reduce, a, n, h.ranks(), h.hosts > 1 ? h.across : h.in_host);
}

Algorithm choose_all_reduce(std::size_t n, const HostLayout& h, std::string_view backend) {
  const Algorithm flat = choose_algorithm(OpKind::all_reduce, n, h.ranks(), backend);
  if (h.hosts < 2 || h.ranks_per_host < 1 || !h.across_slower()) return flat;
  double best_flat = std::numeric_limits<double>::infinity();
  for (Algorithm a : {Algorithm::ring, Algorithm::rhd, Algorithm::tree})
    best_flat = std::min(best_flat, predicted_flat_seconds(a, n, h));
  return predicted_hier_seconds(n, h) < best_flat ? Algorithm::hier : flat;
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::all_gather: return "all_gather";
    case OpKind::broadcast: return "broadcast";
    case OpKind::reduce: return "reduce";
    case OpKind::all_to_all: return "all_to_all";
    case OpKind::barrier: return "barrier";
  }
  return "?";
}

}  // namespace meshtrain::comm
