#include "meshtrain/train/layout.h"

#include <stdexcept>

#include "meshtrain/pipeline/passes.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::train {

pipeline::Schedule make_pipeline_schedule(const TrainOptions& o) {
  const std::string name = o.pp == 1 ? "naive" : o.schedule == "zb" ? "zb-h1" : o.schedule;
  try {
    return pipeline::add_send_recv(pipeline::make_schedule(name, {o.pp, o.microbatches, o.pp == 1 ? 1 : o.chunks}));
  } catch (const std::invalid_argument& e) {  // say which flags made the shape
    throw std::invalid_argument("--schedule " + o.schedule + " with --pp " + std::to_string(o.pp) + ", --microbatches " +
                                std::to_string(o.microbatches) + " and --chunks " + std::to_string(o.chunks) + ": " +
                                e.what());
  }
}

std::vector<pipeline::LayerSpan> stage_layers(const TrainOptions& o, const model::GPTConfig& cfg) {
  const int chunks = o.pp == 1 ? 1 : o.chunks;
  const int stages = o.pp * chunks;
  if (!o.pp_balance.empty()) return pipeline::layers_from_counts(o.pp_balance, stages, cfg.n_layer);
  if (chunks > 1) {
    if (cfg.n_layer % stages != 0)
      throw std::invalid_argument("--schedule interleaved with --pp " + std::to_string(o.pp) + " and --chunks " +
                                  std::to_string(chunks) + " needs the model's " + std::to_string(cfg.n_layer) +
                                  " blocks to divide into " + std::to_string(stages) +
                                  " equal stages; change --pp or --chunks");
    return pipeline::equal_layers(cfg.n_layer, stages);
  }
  // Per token, forward and backward alike: a block's GEMMs 24 C^2 and attention 4 T C; the head
  // 2 C V (the tied projection); the embedding is a lookup.
  const double C = static_cast<double>(cfg.n_embd), T = static_cast<double>(o.seq > 0 ? o.seq : cfg.seq);
  const double block = 24 * C * C + 4 * T * C, head = 2 * C * static_cast<double>(cfg.vocab_size);
  return pipeline::balance_layers(std::vector<double>(static_cast<size_t>(cfg.n_layer), block), stages, 0.0, head);
}

}  // namespace meshtrain::train
