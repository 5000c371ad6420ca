#include "meshtrain/parallel/cnn_spatial.h"

#include <stdexcept>

namespace meshtrain::parallel {

std::shared_ptr<const model::CNNLayout> cnn_spatial_layout(std::shared_ptr<comm::Communicator>,
                                                           const model::CNNConfig&) {
  throw std::invalid_argument("--spatial is not built yet");
}

}  // namespace meshtrain::parallel
