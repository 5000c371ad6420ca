// The collective algorithms, each written once over Transport point-to-point (OpContext) and
// each in its own file with its cost. Buffers are untyped (bytes + DType); counts are in
// elements. All run in place on `buf` unless said otherwise.
//
// Cost notation (Hockney / Thakur-Rabenseifner-Gropp): p ranks, n bytes, alpha = latency per
// message, beta = time per byte moved, gamma = time per byte reduced.
#pragma once

#include <cstddef>

#include "meshtrain/comm/op_context.h"

namespace meshtrain::comm {

// ---- ring.cpp ----
// Block i of the layout ends on rank i (reduce-scatter) / starts on rank i (all-gather).
void ring_reduce_scatter(OpContext& c, void* buf, const Layout& l, DType t, ReduceOp op);
void ring_all_gather(OpContext& c, void* buf, const Layout& l, std::size_t elem_size);
void ring_all_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op);

// ---- hier.cpp ----
// BlueConnect's decomposition over two sub-groups of the caller's group: `in_host` (the K ranks
// of this rank's host, this rank at index k) and `across` (the rank of index k on every host).
// Reduce-scatter inside the host (block k of even_layout(count, K) ends on index k), all-reduce
// of block k across hosts, all-gather inside the host. All three are the ring algorithms.
// avg divides once, by `group_size`, at the end (as every algorithm rounds).
void hier_all_reduce(OpContext& in_host, OpContext& across, void* buf, std::size_t count, DType t, ReduceOp op,
                     int group_size);

// ---- rhd.cpp ----
void rhd_all_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op);

// ---- tree.cpp ----
void tree_broadcast(OpContext& c, void* buf, std::size_t bytes, int root);
// Reduces `buf` of every rank into `buf` of root; non-root buffers are clobbered.
void tree_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op, int root);
void tree_all_reduce(OpContext& c, void* buf, std::size_t count, DType t, ReduceOp op);

// ---- shm.cpp ----
// Ranks in one address space (Transport::shared_memory): rank r sums block r of every rank's
// buffer in the tree's order and writes it into all of them; each byte read and written once.
void shm_all_reduce(OpContext& c, SharedMemory& m, void* buf, std::size_t count, DType t, ReduceOp op);

// ---- direct_all_to_all.cpp ----
// in and out hold p blocks of block_bytes; block j of `in` goes to rank j.
void direct_all_to_all(OpContext& c, const void* in, void* out, std::size_t block_bytes);

// ---- barrier.cpp ----
void dissemination_barrier(OpContext& c);

}  // namespace meshtrain::comm
