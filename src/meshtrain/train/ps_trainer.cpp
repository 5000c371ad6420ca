#include "meshtrain/train/ps_trainer.h"

#include <stdexcept>

namespace meshtrain::train {

TrainResult train_parameter_server(const TrainOptions&, const model::GPTConfig&, const TokenDataset&, PSRunLog*) {
  throw std::invalid_argument("the parameter server is not available in this build yet; run without --ps-servers");
}

}  // namespace meshtrain::train
