// What `meshtrain calibrate` measures of convolutional networks (machine file version 4,
// plan/machine.h ConvRate and LayerRate), as the layers run them:
//   - convolutions through kernels/conv.h (oneDNN), forward, backward-data and backward-weights
//     each on its own, over shape classes that span the channel counts (1 to 128), kernels (1,
//     3, 5), strides and feature-map sizes (7 to 28) of small image models, each in the blocked
//     layout (where the channels allow; no conversion) and in NCHW (converted inside every call,
//     as under the splits);
//   - the memory-bound layers through nn/ and a Context (their allocations and saved tensors
//     included): batch norm (with and without its folded ReLU; blocked and NCHW), ReLU, sums,
//     max and average pooling (2 x 2), global average pooling, concat, flatten, and the layout
//     conversion NCHW <-> blocked, at three sizes so the cost model has each call's fixed cost
//     and its cost per element (quick mode: 3 convolution classes at one batch, the layers at
//     one size, about a second more).
// Each row is measured in rounds, one after the other over the whole list (calibrate: three,
// quick mode one), and keeps the median of its rounds' figures: a moment of a shared VM that
// runs a kernel at half or twice its rate, a few hundred milliseconds long, then does not
// become the row (docs/planner.md).
// Internal to plan/: calibrate.cpp adds these tasks to its list, and takes its own kernels'
// figures by median_seconds below, as these do (its links keep their best).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "meshtrain/plan/machine.h"

namespace meshtrain::plan::detail {

// The figure calibrate keeps of a measurement's timed repetitions: their median. The cost model
// predicts a run's median step, and a step meets each kernel in whatever state the machine is
// in at the time; the fastest repetition is the machine's best moment, which a shared VM may
// reach in a calibration and not in the run it predicts (docs/planner.md). Empty: 0.
double median_seconds(std::vector<double> times);

// The row kept of one class's rounds (the same shape, format, batch and threads): each figure
// the median of the rounds'. Empty: a default row.
ConvRate median_conv(const std::vector<ConvRate>& rounds);
LayerRate median_layer(const std::vector<LayerRate>& rounds);

inline constexpr int kCnnRounds = 3;

// Appends one task per measurement and round (`rounds` of them) to `tasks`, each returning its
// line of progress, and a last one that pushes every row's median into `p`.
void add_cnn_tasks(MachineProfile& p, const std::vector<int>& threads, bool quick,
                   std::vector<std::function<std::string()>>& tasks, int rounds);

}  // namespace meshtrain::plan::detail
