// The pipeline side of a training layout: which schedule the executor runs and which blocks
// each stage holds, both from the options alone (every rank computes the same answer).
#pragma once

#include <vector>

#include "meshtrain/model/cnn.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/pipeline/partition.h"
#include "meshtrain/pipeline/schedule.h"

namespace meshtrain::train {

struct TrainOptions;

// --pp 1: the trivial schedule (one stage, the micro-batches one after another); otherwise the
// named schedule (--schedule; `zb` is zb-h1) over pp ranks x --chunks, with its communication.
// Throws std::invalid_argument with a sentence for a shape the schedule cannot run.
pipeline::Schedule make_pipeline_schedule(const TrainOptions& o);
// --schedule pipedream at --pp 1 --chunks P: one rank holds the P stages of a pp P run (cut the
// same way) and computes their asynchronous recurrence, micro-batch by micro-batch: the
// reference the pipelines are checked against (train/weight_stash.h).
bool pipedream_reference(const TrainOptions& o);

// What balancing weighs: per block, the embedding and the head (any unit).
struct StageCosts {
  std::vector<double> blocks;
  double embedding = 0, head = 0;
};

// Measured costs (--pp-balance profile): forward + backward seconds of each block, of the
// embedding and of the head, on one micro-batch of `rows` x T through the whole model on this
// thread (one untimed pass, then per part the least of three timed ones).
StageCosts profile_costs(const model::GPTConfig& cfg, int64_t rows, int64_t T, int threads, uint64_t seed);

// Blocks per stage (stage s = chunk * pp + rank): --pp-balance counts when given; equal spans
// for several chunks per rank; otherwise balanced to minimise the largest stage cost, by
// `measured` when given (--pp-balance profile) and else by the planner's FLOPs
// (plan::balance_stages, the one balancer `plan` predicts with).
std::vector<pipeline::LayerSpan> stage_layers(const TrainOptions& o, const model::GPTConfig& cfg,
                                              const StageCosts* measured = nullptr);
// The same for a CNN (model/cnn.h): its units per stage, by --pp-balance counts, or balanced by
// the units' FLOPs (equal spans for interleaved schedules).
std::vector<pipeline::LayerSpan> stage_units(const TrainOptions& o, const model::CNNConfig& cfg);

// --pp-cuts: the layers the stages after the first begin at, as --pp-balance counts of units
// ("2,3,1"). A transformer's stages begin at a block (h.<i> or h.<i>.ln_1); a graph's at a
// layer that begins a unit (model/graph.h: unit_starts). Throws std::invalid_argument naming
// the layer and where a stage can begin.
std::string stage_counts_at(const model::ModelSpec& spec, const TrainOptions& o);

}  // namespace meshtrain::train
