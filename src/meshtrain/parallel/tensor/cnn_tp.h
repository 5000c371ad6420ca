// Convolutions split by filters and by input channels, and linear layers by columns and rows,
// over the tp group (--tp N with an image model): the CNN layout (model/cnn_layout.h) whose
// convolution pairs are the column- and row-parallel layers of the transformer, and whose
// linear pairs are those layers themselves.
//
//   convolution                 weight (OC, IC, K, K)   forward                 backward
//   full -> split  (filters)    split along OC          none                    all-reduce dx
//   split -> full  (channels)   split along IC          all-reduce y (partial)  none
//   full -> full   (filters,    split along OC          all-gather y along      all-reduce dx; dy's
//                   gathered)                           channels                own channels kept
//   full -> full   (where the   replicated              none                    none
//                   split does not pay: model::filter_split_pays)
//
//   linear layers (a pair, parallel/tensor/tensor_parallel.h):
//   full -> split  (columns)    split along out         none                    all-reduce dx
//   split -> full  (rows)       split along in          all-reduce y (partial)  none
//   full -> full                replicated              none                    none
//
// "full" is an activation every tp rank holds whole (and equal), "split" one whose channels lie
// rank-major over the group: rank r holds channels [r C/p, (r+1) C/p). A batch norm between a
// filter split and the channel split after it normalises its rank's channels: the statistics of
// a channel need no other rank (so the numbers are the single rank's), its parameters and
// running statistics are split along channels too. Everything else (pooling, the classifier,
// batch norms of full activations) runs replicated: every tp rank computes the same values, and
// their parameters' gradients are equal, so checkpoints and the gradient norm count them once
// (tp rank 0), as for the transformer's replicated parameters.
//
// Bytes per micro-batch of n samples, with A the activation's floats per sample, over p ranks
// (ring collectives, parallel/tensor/tp_regions.h): an all-reduce sends 2 (p-1)/p n A floats per rank,
// an all-gather (p-1)/p n A. The first convolution of a model (input_grad false) skips its dx.
// A bias is replicated and added once, after the reduction (split -> full) or on each rank's own
// channels (filter splits, where it is split with them).
//
// Limits: the full channel counts must divide by p (validate_cnn_tp names the nearest that do).
#pragma once

#include <memory>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/cnn_layout.h"

namespace meshtrain::parallel {

// Throws std::invalid_argument with a sentence when `cfg`'s split convolutions cannot be cut over
// `tp` ranks: each channel count that tp must divide, and the nearest tp values that work.
void validate_cnn_tp(const model::CNNConfig& cfg, int tp);

// The layout for filter and channel splits over `tp` (size 2 or more).
std::shared_ptr<const model::CNNLayout> cnn_tp_layout(std::shared_ptr<comm::Communicator> tp);

// Analytic bytes one tp rank sends per micro-batch of `rows` samples of `cfg` (forward and
// backward), for the tests and the run's report: what the collectives of the table above move.
uint64_t cnn_tp_bytes_per_microbatch(const model::CNNConfig& cfg, int tp, int64_t rows);

}  // namespace meshtrain::parallel
