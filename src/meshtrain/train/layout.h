// The pipeline side of a training layout: which schedule the executor runs and which blocks
// each stage holds, both from the options alone (every rank computes the same answer).
#pragma once

#include <vector>

#include "meshtrain/model/config.h"
#include "meshtrain/pipeline/partition.h"
#include "meshtrain/pipeline/schedule.h"

namespace meshtrain::train {

struct TrainOptions;

// --pp 1: the trivial schedule (one stage, the micro-batches one after another); otherwise the
// named schedule (--schedule; `zb` is zb-h1) over pp ranks x --chunks, with its communication.
// Throws std::invalid_argument with a sentence for a shape the schedule cannot run.
pipeline::Schedule make_pipeline_schedule(const TrainOptions& o);

// Blocks per stage (stage s = chunk * pp + rank): --pp-balance when given; equal spans for
// several chunks per rank; otherwise balanced by the analytic FLOPs of a block, with the head
// (the tied projection over the vocabulary) counted on the last stage.
std::vector<pipeline::LayerSpan> stage_layers(const TrainOptions& o, const model::GPTConfig& cfg);

}  // namespace meshtrain::train
