// The time side of a convolutional network's cost (model/cost.h): one OpCost per layer the
// compiler (model/cnn.cpp) builds, in forward order, for one micro-batch on one rank of the
// intra-layer group, with what the layout adds around it (cnn_layout.h):
//
//   layout      a rank computes                           and the group exchanges
//   one rank    every layer; activations kept in oneDNN's  nothing
//               blocked layout where the graph takes it
//               (graph.h: graph_takes_blocked), else NCHW
//   --tp        paired convolutions' (and linears') share   all-reduce of a channel split's partial
//               of filters or channels; per-channel layers  output (forward) and of a filter split's
//               between them on their share; the rest       input gradient (backward); all-gather of
//               (unpaired layers, pooling, the classifier)  a filter split that leaves full
//               whole, replicated; NCHW throughout
//   --spatial   its band of every feature map's rows (the   halo rows before each window (forward,
//               largest band: the slowest rank); the        and their gradients back); batch-norm
//               classifier whole; NCHW throughout           statistics, global pool sums, the
//                                                           convolutions' and batch norms' partial
//                                                           gradients (all-reduces); the whole map
//                                                           before a flatten (all-gather)
//   --branch    its branches of each block (by FLOPs, the   all-gather of the concat (forward),
//               greedy of parallel/branch; or the          all-reduce of the block input's gradient
//               balance); the rest replicated; NCHW         (backward)
//
// A convolution is priced by its shape class and format (plan/machine.h ConvRate), every other
// memory-bound layer by its measured call (LayerRate), linear layers as GEMMs. The ReLU after a
// batch norm or a sum is folded into it (batchnorm_relu, add_relu), as the compiler folds it.
// Memory (saved_bytes, temp_bytes) is not set here: model/spec.cpp measures it per unit.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/model/cnn.h"
#include "meshtrain/model/cost.h"

namespace meshtrain::model {

// Units [first_unit, end_unit) of `cfg` (the last op of each unit has unit_end), with the loss
// when `head`, on rank q.tp_rank of an intra-layer group of q.tp split as q.split.
std::vector<OpCost> cnn_layer_costs(const CNNConfig& cfg, int64_t first_unit, int64_t end_unit, bool head,
                                    const CostQuery& q);

}  // namespace meshtrain::model
