#include "meshtrain/parallel/mesh.h"

#include <stdexcept>

namespace meshtrain::parallel {

std::string MeshShape::str() const {
  return "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
}

int mesh_rank(const MeshShape& s, const MeshCoord& c) { return (c.pp * s.dp + c.dp) * s.tp + c.tp; }

MeshCoord mesh_coord(const MeshShape& s, int rank) {
  MeshCoord c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  return c;
}

void validate_mesh(const MeshShape& s, int world) {
  if (s.dp < 1 || s.tp < 1 || s.pp < 1)
    throw std::invalid_argument("--dp, --tp and --pp must each be at least 1 (got " + s.str() + ")");
  if (s.world() != world)
    throw std::invalid_argument("the mesh " + s.str() + " needs " + std::to_string(s.world()) +
                                " ranks but the world has " + std::to_string(world) +
                                "; make dp * tp * pp equal the number of ranks");
}

DeviceMesh::DeviceMesh(comm::Communicator& world, MeshShape shape)
    : world_(&world), shape_(shape), coord_(mesh_coord(shape, world.rank())) {
  validate_mesh(shape, world.size());
  const MeshCoord c = coord_;
  // Ranks sharing (pp, dp) form a tp group, ordered by tp index; likewise for the others.
  tp_ = world.split(c.pp * shape.dp + c.dp, c.tp, "tp[pp" + std::to_string(c.pp) + ",dp" + std::to_string(c.dp) + "]");
  dp_ = world.split(c.pp * shape.tp + c.tp, c.dp, "dp[pp" + std::to_string(c.pp) + ",tp" + std::to_string(c.tp) + "]");
  pp_ = world.split(c.dp * shape.tp + c.tp, c.pp, "pp[dp" + std::to_string(c.dp) + ",tp" + std::to_string(c.tp) + "]");
}

}  // namespace meshtrain::parallel
