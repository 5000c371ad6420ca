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
// Each row is measured in rounds, one after the other over the whole list and interleaved with
// the kernels' rounds (RoundTasks below; calibrate: three, or --rounds, quick mode one), and
// keeps the median of its rounds' figures: a moment of a shared VM that runs a kernel at half
// or twice its rate, a few hundred milliseconds long, then does not become the row
// (docs/planner.md).
// Internal to plan/: calibrate.cpp adds these tasks to its list; the kernels' rows
// (plan/calibrate_kernels.h) are measured in rounds too, through add_round_tasks and
// median_of_rounds below (the links keep their best).
#pragma once

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/plan/machine.h"

namespace meshtrain::plan::detail {

// The figure calibrate keeps of a measurement's timed repetitions: their median. The cost model
// predicts a run's median step, and a step meets each kernel in whatever state the machine is
// in at the time; the fastest repetition is the machine's best moment, which a shared VM may
// reach in a calibration and not in the run it predicts (docs/planner.md). Empty: 0.
double median_seconds(std::vector<double> times);

// The row kept of one class's rounds (the same shape, format, batch and threads): the first
// round's row with each of `fields` the median of the rounds'. Empty: a default row.
template <class Row>
Row median_of_rounds(const std::vector<Row>& rounds, std::initializer_list<double Row::*> fields) {
  if (rounds.empty()) return {};
  Row r = rounds.front();
  for (double Row::*f : fields) {
    std::vector<double> v;
    for (const Row& x : rounds) v.push_back(x.*f);
    r.*f = median_seconds(std::move(v));
  }
  return r;
}
ConvRate median_conv(const std::vector<ConvRate>& rounds);
LayerRate median_layer(const std::vector<LayerRate>& rounds);

// Calibrate's measurements that run in rounds, kept by round: calibrate runs round 1 of every
// section (the kernels', then the convolutional layers'), then round 2 of every section, and so
// on, and each section's `keep` after the last round. A row's rounds then lie a whole round of
// calibrate apart (about 20 s each on 2 cores), not one section's round: a shared VM's slower
// and faster states last tens of seconds (docs/planner.md), and a row whose rounds all fell in
// one of them would carry it into every prediction.
struct RoundTasks {
  std::vector<std::vector<std::function<std::string()>>> rounds;  // [round]: every section's tasks
  std::vector<std::function<std::string()>> keep;                 // one per section
  // Round 1's tasks, round 2's, ..., then the keeps.
  std::vector<std::function<std::string()>> in_order() const {
    std::vector<std::function<std::string()>> all;
    for (const auto& r : rounds) all.insert(all.end(), r.begin(), r.end());
    all.insert(all.end(), keep.begin(), keep.end());
    return all;
  }
};

// Adds to `tasks` one task per row and round, round r's in `tasks.rounds[r]`, each returning
// `line` of the figure it measured, and a keep that hands every row's rounds, in the order of
// `rows`, to `keep` and returns its line.
template <class Row>
void add_round_tasks(std::vector<std::function<Row()>> rows, std::function<std::string(const Row&)> line,
                     std::function<std::string(const std::vector<std::vector<Row>>&)> keep, RoundTasks& tasks,
                     int rounds) {
  rounds = std::max(1, rounds);
  if (static_cast<int>(tasks.rounds.size()) < rounds) tasks.rounds.resize(rounds);
  auto measured = std::make_shared<std::vector<std::vector<Row>>>(rows.size());
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < rows.size(); ++i)
      tasks.rounds[round].push_back([measured, fn = rows[i], line, i, round, rounds] {
        (*measured)[i].push_back(fn());
        return line((*measured)[i].back()) +
               (rounds > 1 ? " (round " + std::to_string(round + 1) + " of " + std::to_string(rounds) + ")" : "");
      });
  tasks.keep.push_back([measured, keep] { return keep(*measured); });
}

// Adds one task per measurement and round (`rounds` of them) to `tasks`, each returning its
// line of progress, and a keep that pushes every row's median into `p`.
void add_cnn_tasks(MachineProfile& p, const std::vector<int>& threads, bool quick, RoundTasks& tasks, int rounds);

}  // namespace meshtrain::plan::detail
