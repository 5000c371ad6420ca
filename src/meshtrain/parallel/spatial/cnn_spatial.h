// Convolutional networks split by image regions over the intra-layer group (--spatial N): each
// rank holds a band of every feature map's rows, whole width, all channels (model/cnn_layout.h).
//
// Bands. Rank r of p holds rows [r H / p, (r+1) H / p) (integer division) of a feature map H
// rows high: equal bands where p divides H, otherwise bands one row apart (cnn-small's 7-row
// map over 2 ranks: rows 0-2 and 3-6). Every feature map of the model is cut this way, at its
// own height, so a window layer's output band is fixed by its output height alone.
//
// Windows (convolutions, max pools). Output row o of a window (kernel k, stride s, padding pad)
// reads input rows [o s - pad, o s - pad + k); this rank's output band [oa, ob) reads
// [oa s - pad, (ob-1) s - pad + k). Before the window each rank sends every other rank the rows
// of its own band that the other's range needs, and receives the rows of its range that others
// hold (a halo: one row from each neighbour for a 3x3, stride-1 window; none for a 2x2 pool over
// an even band; the top row only for resnet's stride-2 3x3). Rows outside the image are the
// padding, filled here (zeros for a convolution, -inf for a max pool). A convolution pads its
// columns itself (oneDNN's padding, rows unpadded); a pool gets its padding columns here too and
// runs unpadded. Activations keep the single rank's memory layout (blocked where the model keeps
// it blocked: a plane's row is then W x B floats). Backward is the transpose: the
// gradient of each received row goes back to the rank that owns it and is added there. The
// exchange is point-to-point on the group's communicator (counted in its bytes), all sends and
// receives of a layer posted at once; it does not overlap interior computation.
//
// The rest, per micro-batch:
//   batch norm      statistics summed over the group, then the data-parallel group (float64:
//                   1 + 2C values in forward, 2C in backward)
//   global pool     local sums, all-reduced (N C floats), divided by the whole H W; backward
//                   spreads dy / (H W) over the band, no communication
//   whole map       all-gather of the bands (uneven counts), rows put back in order; backward
//                   keeps the band's rows of dy
//   parameters      replicated; the gradients of convolutions and batch norms are the band's
//                   partial sums, all-reduced once per unit's backward (reduce_partial_grads).
//                   The classifier's linears see whole, equal inputs: their gradients agree.
// All-reduces and the all-gather run as rings (kTPAlgorithm), whose per-rank bytes are exact.
//
// Limits: every feature map must have at least p rows (validate_cnn_spatial); under a zero-bubble
// schedule (deferred weight gradients) the partial sums would escape their reduction, so the
// trainer refuses that pairing.
#pragma once

#include <cstdint>
#include <memory>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/cnn_layout.h"

namespace meshtrain::parallel {

// Throws std::invalid_argument with a sentence when `cfg`'s feature maps cannot be cut into `n`
// bands of at least one row each: which layer's map is too small and which n work.
void validate_cnn_spatial(const model::CNNConfig& cfg, int n);

// The layout for row bands of `cfg`'s feature maps over `group` (size 2 or more).
std::shared_ptr<const model::CNNLayout> cnn_spatial_layout(std::shared_ptr<comm::Communicator> group,
                                                           const model::CNNConfig& cfg);

// Analytic bytes rank `rank` of `p` sends per training micro-batch of `rows` samples of `cfg`
// (forward and backward): halo rows, their gradients, the batch-norm statistics, the partial
// gradients' reductions, the global pool's sums and the whole map's gather. Ranks differ (an
// edge band has one neighbour).
uint64_t cnn_spatial_bytes_per_microbatch(const model::CNNConfig& cfg, int p, int rank, int64_t rows);

}  // namespace meshtrain::parallel
