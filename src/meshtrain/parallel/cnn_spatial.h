// Convolutional networks split by image regions over the intra-layer group (--spatial N): each
// rank holds a band of every feature map's rows (model/cnn_layout.h).
#pragma once

#include <memory>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/cnn.h"
#include "meshtrain/model/cnn_layout.h"

namespace meshtrain::parallel {

// The layout for row bands of `cfg`'s feature maps over `group` (size 2 or more).
std::shared_ptr<const model::CNNLayout> cnn_spatial_layout(std::shared_ptr<comm::Communicator> group,
                                                           const model::CNNConfig& cfg);

}  // namespace meshtrain::parallel
