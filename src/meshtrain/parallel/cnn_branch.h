// Inception blocks' branches placed on different ranks of the intra-layer group
// (--branch-parallel N; model/cnn_layout.h).
#pragma once

#include <memory>
#include <string>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/model/cnn_layout.h"

namespace meshtrain::parallel {

// The layout placing each Inception block's branches over `group` (size 2 or more): by
// `balance` ("0,1,1,0": the rank of each branch) or, empty, by the branches' costs.
std::shared_ptr<const model::CNNLayout> cnn_branch_layout(std::shared_ptr<comm::Communicator> group,
                                                          const std::string& balance);

}  // namespace meshtrain::parallel
