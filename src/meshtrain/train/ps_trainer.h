// The training loop of parameter-server mode (`meshtrain train --ps-servers S`): ranks
// 0..dp-1 are workers (each a full model replica computing gradients on its rows of the global
// batch), ranks dp..dp+S-1 are servers (each owning a contiguous shard of the flattened
// parameters and its optimizer state). The protocol, the rounds and the staleness rule live in
// parallel/data/param_server.h; docs/param_server.md explains the modes.
//
// The run spends a sample budget of `steps` global batches (steps * dp pushes of B/dp rows);
// a faster worker may take more of it than a slower one when the staleness bound allows.
// Worker 0 prints progress, writes one metrics line per optimizer round (server 0's update),
// and computes the validation loss at the end with the final parameters.
//
// Any model family: a token model (GPT) or an image model (a layer graph: the named CNNs, the
// user's graph files), whose workers run the whole model as one stage (ModelSpec::make_stage)
// through the same executor as the all-reduce trainer, on the same rows: micro-batch k of
// worker w is rows [k B/M + w B/(W M), ...) of the global batch, as dp rank w's. Batch norm:
// with staleness 0 the workers reduce its statistics over a workers-only group (synchronised
// batch norm, so the run is one rank's curve and every worker's running statistics are equal);
// with --batch-norm local each worker uses its own rows' statistics and worker 0's running
// statistics are the ones evaluated; a batch-norm graph with staleness other than 0 needs
// --batch-norm local (workers steps apart cannot share statistics: validate.cpp refuses).
// Limits: no checkpoints, no tensor or pipeline parallelism inside a worker, validation only
// at the end.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/data/data.h"
#include "meshtrain/data/images.h"
#include "meshtrain/model/config.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/parallel/data/param_server.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::train {

// What a run did, beyond TrainResult (filled on threads; under mpi only the parts this
// process saw).
struct PSRunLog {
  std::vector<parallel::PSRead> reads;  // every read server 0 granted, in order
  std::vector<parallel::PSRead> holds;  // every read server 0 held back by the staleness bound
  std::vector<int64_t> pushes;          // per worker
  std::vector<int64_t> round_pushes;    // per round of server 0 (worker 0's view)
  int64_t samples = 0;                  // rows of gradient the servers applied
  double wall_s = 0;                    // worker 0: first pull to the last round applied
};

// Runs parameter-server training (o.ps_servers > 0); `o` resolved by resolve_options. Bad
// input throws std::invalid_argument before any work.
TrainResult train_parameter_server(const TrainOptions& o, const model::GPTConfig& cfg,
                                   const TokenDataset& data, PSRunLog* log = nullptr);
// The same for an image model (spec.input() == images): `o` resolved as train() resolves an
// image model's options (validate_image_options), `data` fitted to the model.
TrainResult train_parameter_server(const TrainOptions& o, const model::ModelSpec& spec,
                                   const ImageDataset& data, PSRunLog* log = nullptr);

}  // namespace meshtrain::train
