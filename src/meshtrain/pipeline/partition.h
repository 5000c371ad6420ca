// Stage partitioning: which blocks of the model each pipeline stage builds. The first stage
// also runs the embedding and the last the head, so a balanced split gives them fewer blocks
// when those ends cost something.
//
// balance_layers minimises the largest stage cost over all contiguous splits (exact, by
// dynamic programming over n blocks x s stages). The costs are whatever the caller measures or
// models (the trainer uses the analytic FLOPs of a block, of the embedding and of the head).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::pipeline {

struct LayerSpan {
  int64_t first = 0, end = 0;  // blocks [first, end)
  int64_t size() const { return end - first; }
  bool operator==(const LayerSpan&) const = default;
};

// `stages` non-empty contiguous spans of block_costs.size() blocks minimising
// max_s (first_extra [s == 0] + sum of its blocks' costs + last_extra [s == last]); among
// equal splits, the one that gives earlier stages more blocks. Throws std::invalid_argument
// when there are fewer blocks than stages.
std::vector<LayerSpan> balance_layers(const std::vector<double>& block_costs, int stages,
                                      double first_extra, double last_extra);

// Equal spans (interleaved schedules need n_layers % stages == 0; otherwise throws).
std::vector<LayerSpan> equal_layers(int64_t n_layers, int stages);

// `--pp-balance 3,3,2,2`: blocks per stage, given by hand. Throws std::invalid_argument with a
// sentence when a count is not a positive integer, there are not `stages` of them, or they do
// not add up to n_layers.
std::vector<LayerSpan> layers_from_counts(const std::string& counts, int stages, int64_t n_layers);

// "0-2 | 3-5" style text for the start-up line.
std::string to_string(const std::vector<LayerSpan>& spans);

}  // namespace meshtrain::pipeline
