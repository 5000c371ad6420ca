// bf16 on the wire: collectives whose payload travels as bf16 (half of float32's bytes) while
// every sum is made in float32 (--comm-dtype bf16; docs/precision.md).
//
// Slices: a buffer of n floats is cut into p slices (counts[q] values for rank q, in order);
// on the wire slice q is block q of a packed buffer of p blocks of `slots` floats, each float
// slot holding two bf16 values (slots = the largest slice, rounded up to even, halved).
//   reduce-scatter  = an all-to-all of the packed blocks, then the owner's float32 sum of the p
//                     bf16 slices in rank order (times `scale`): the owner keeps float32
//   all-gather      = the owner's slice rounded to bf16 and gathered; every rank, the owner
//                     too, takes the bf16 values, so all ranks hold the same tensor
//   all-reduce      = the two in turn (every rank ends with the bf16 of the float32 sum)
// The data-parallel buckets use the pieces (the all-to-all started during backward, the rest
// when the step waits); tensor parallelism's regions use the whole operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "meshtrain/comm/communicator.h"

namespace meshtrain::parallel {

// ---- pieces ----
int64_t bf16_slots(const std::vector<std::size_t>& counts);
std::vector<std::size_t> even_counts(int64_t n, int p);  // n / p each, the first n % p one more
// x (sum of counts values) into p packed blocks of `slots` floats.
void pack_bf16_slices(const float* x, const std::vector<std::size_t>& counts, std::vector<float>& packed);
// out[i] = scale * sum over q of block q's value i (i < n), in float32, in rank order.
void sum_bf16_blocks(const std::vector<float>& packed, int p, int64_t slots, int64_t n, float scale, float* out);
// The bf16 of `mine` (n values) all-gathered; out (sum of counts values) unpacked from every
// rank's block, the caller's included.
void all_gather_bf16(comm::Communicator& c, const float* mine, const std::vector<std::size_t>& counts, float* out);

// ---- whole operations (blocking) ----
void all_reduce_bf16(comm::Communicator& c, std::span<float> x, float scale = 1.0f);
// in: p equal slices; out: the caller's slice of the float32 sum.
void reduce_scatter_bf16(comm::Communicator& c, std::span<const float> in, std::span<float> out);
// in: the caller's slice; out: p equal slices, every one the bf16 of its owner's.
void all_gather_bf16(comm::Communicator& c, std::span<const float> in, std::span<float> out);

}  // namespace meshtrain::parallel
