// DeviceMesh: the dp x tp x pp layout of the ranks and the communicator of each axis.
//
// The rank formula (DESIGN decision 3), the only place it is written:
//     rank = (pp_index * dp + dp_index) * tp + tp_index
// TP neighbours are adjacent ranks (they talk most), PP stages the farthest apart. Example,
// dp = 2, tp = 2, pp = 2 (8 ranks):
//     rank:      0 1 2 3 4 5 6 7
//     tp_index:  0 1 0 1 0 1 0 1
//     dp_index:  0 0 1 1 0 0 1 1
//     pp_index:  0 0 0 0 1 1 1 1
// tp groups {0,1} {2,3} ...; dp groups {0,2} {1,3} {4,6} {5,7}; pp groups {0,4} {1,5} ...
//
// A DeviceMesh is a value passed explicitly to whatever needs it (no global mesh). Building
// one is collective over the world communicator (it splits it three times).
#pragma once

#include <memory>
#include <string>

#include "meshtrain/comm/communicator.h"

namespace meshtrain::parallel {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
  std::string str() const;  // "dp=2 tp=1 pp=1"
};

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0;
};

// rank <-> coordinates, per the formula above.
int mesh_rank(const MeshShape& s, const MeshCoord& c);
MeshCoord mesh_coord(const MeshShape& s, int rank);

// Throws std::invalid_argument with a sentence when `world` ranks cannot form the mesh.
void validate_mesh(const MeshShape& s, int world);

class DeviceMesh {
 public:
  // Collective over `world`; world.size() must equal shape.world().
  DeviceMesh(comm::Communicator& world, MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return world_->rank(); }
  comm::Communicator& world() const { return *world_; }
  comm::Communicator& dp_group() const { return *dp_; }
  comm::Communicator& tp_group() const { return *tp_; }
  comm::Communicator& pp_group() const { return *pp_; }
  std::shared_ptr<comm::Communicator> dp_ptr() const { return dp_; }
  std::shared_ptr<comm::Communicator> tp_ptr() const { return tp_; }
  std::shared_ptr<comm::Communicator> pp_ptr() const { return pp_; }

 private:
  comm::Communicator* world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::shared_ptr<comm::Communicator> dp_, tp_, pp_;
};

}  // namespace meshtrain::parallel
