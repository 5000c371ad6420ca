#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/parallel/mesh.h"

using namespace meshtrain;
using parallel::MeshCoord;
using parallel::MeshShape;

TEST(Mesh, RankFormulaRoundTripsAndMatchesDesign) {
  MeshShape s{2, 2, 2};
  // The worked example of mesh.h, written out independently.
  const int expect_tp[] = {0, 1, 0, 1, 0, 1, 0, 1};
  const int expect_dp[] = {0, 0, 1, 1, 0, 0, 1, 1};
  const int expect_pp[] = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int r = 0; r < 8; ++r) {
    MeshCoord c = parallel::mesh_coord(s, r);
    EXPECT_EQ(c.tp, expect_tp[r]);
    EXPECT_EQ(c.dp, expect_dp[r]);
    EXPECT_EQ(c.pp, expect_pp[r]);
    EXPECT_EQ(parallel::mesh_rank(s, c), r);
  }
  EXPECT_THROW(parallel::validate_mesh({2, 2, 1}, 3), std::invalid_argument);
  EXPECT_THROW(parallel::validate_mesh({0, 1, 1}, 0), std::invalid_argument);
}

TEST(Mesh, GroupsContainTheRightRanks) {
  MeshShape s{3, 2, 2};  // 12 ranks
  std::mutex mu;
  std::map<int, std::vector<int>> tp_members, dp_members, pp_members;
  comm::run_threads(s.world(), [&](comm::Communicator& world) {
    parallel::DeviceMesh mesh(world, s);
    // Each group's members, gathered inside the group (so the communicators really work).
    auto members = [&](comm::Communicator& g) {
      std::vector<int64_t> mine{world.rank()}, all(g.size());
      g.all_gather(mine, all);
      return std::vector<int>(all.begin(), all.end());
    };
    auto tp = members(mesh.tp_group()), dp = members(mesh.dp_group()), pp = members(mesh.pp_group());
    std::lock_guard<std::mutex> lock(mu);
    tp_members[world.rank()] = tp;
    dp_members[world.rank()] = dp;
    pp_members[world.rank()] = pp;
  });
  for (int r = 0; r < 12; ++r) {
    MeshCoord c = parallel::mesh_coord(s, r);
    std::vector<int> tp, dp, pp;
    for (int i = 0; i < s.tp; ++i) tp.push_back(parallel::mesh_rank(s, {c.dp, i, c.pp}));
    for (int i = 0; i < s.dp; ++i) dp.push_back(parallel::mesh_rank(s, {i, c.tp, c.pp}));
    for (int i = 0; i < s.pp; ++i) pp.push_back(parallel::mesh_rank(s, {c.dp, c.tp, i}));
    EXPECT_EQ(tp_members[r], tp) << "rank " << r;
    EXPECT_EQ(dp_members[r], dp) << "rank " << r;
    EXPECT_EQ(pp_members[r], pp) << "rank " << r;
  }
}
