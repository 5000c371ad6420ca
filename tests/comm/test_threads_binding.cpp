// The threads backend binds ranks of one kernel thread that outnumber the process's cores
// (comm::core_binding): each rank's thread, seen from inside the rank, may run on exactly the
// core the binding names, and every other run keeps the process's whole mask.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "meshtrain/comm/threads_backend.h"

namespace mc = meshtrain::comm;

namespace {

std::vector<int> cpus_of(const cpu_set_t& set) {
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

std::vector<int> process_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return cpus_of(set);
}

// Each rank's own mask, read on its thread while it runs.
std::vector<std::vector<int>> masks_inside(int world, int threads_per_rank) {
  std::vector<std::vector<int>> masks(static_cast<size_t>(world));
  std::mutex m;
  mc::ThreadsOptions opts;
  opts.threads_per_rank = threads_per_rank;
  opts.timeout = std::chrono::seconds(60);
  mc::run_threads(
      world,
      [&](mc::Communicator& c) {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0) throw std::runtime_error("no mask");
        {
          std::lock_guard g(m);
          masks[static_cast<size_t>(c.rank())] = cpus_of(set);
        }
        c.barrier();
      },
      opts);
  return masks;
}

}  // namespace

TEST(ThreadsBinding, RanksOfOneThreadThatOutnumberTheCoresEachRunOnOneCoreInTurn) {
  const std::vector<int> cpus = process_cpus();
  const int n = static_cast<int>(cpus.size());
  if (n > 32) GTEST_SKIP() << n << " cores: twice as many rank threads is more than this test starts";
  // The backend drops a binding the system refuses (a hint): check first that a thread may bind.
  int refused = 0;
  std::thread([&refused, c = cpus.front()] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    refused = pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  }).join();
  if (refused != 0) GTEST_SKIP() << "this system does not let a thread bind itself to a core (error " << refused << ")";
  const int world = 2 * n;
  const std::vector<int> plan = mc::core_binding(world, 1);
  ASSERT_EQ(plan.size(), static_cast<size_t>(world));
  const std::vector<std::vector<int>> masks = masks_inside(world, 1);
  for (int r = 0; r < world; ++r) {
    const int want = cpus[static_cast<size_t>(r % n)];
    EXPECT_EQ(plan[static_cast<size_t>(r)], want) << "rank " << r;
    EXPECT_EQ(masks[static_cast<size_t>(r)], std::vector<int>{want}) << "rank " << r;
  }
  // Adjacent ranks (tensor-parallel peers under the mesh's rank formula) on different cores.
  if (n > 1) {
    EXPECT_NE(plan[0], plan[1]);
  }
}

TEST(ThreadsBinding, OtherRunsKeepTheProcessMask) {
  const std::vector<int> cpus = process_cpus();
  const int n = static_cast<int>(cpus.size());
  EXPECT_TRUE(mc::core_binding(n, 1).empty()) << "no more ranks than cores";
  EXPECT_TRUE(mc::core_binding(2 * n, 2).empty()) << "ranks of two kernel threads";
  EXPECT_TRUE(mc::core_binding(2 * n, 0).empty()) << "kernel threads not known";
  if (n > 1) {
    EXPECT_TRUE(mc::core_binding(2 * n + 1, 1).empty()) << "ranks that do not fill the cores evenly";
  }
  if (n <= 32) {
    for (const std::vector<int>& mask : masks_inside(2 * n, 0)) EXPECT_EQ(mask, cpus);
    for (const std::vector<int>& mask : masks_inside(std::min(n, 4), 1)) EXPECT_EQ(mask, cpus);
  }
}

TEST(ThreadsBinding, TheEnvironmentTurnsItOff) {
  const int n = static_cast<int>(process_cpus().size());
  ASSERT_EQ(setenv("MESHTRAIN_COMM_PIN", "0", 1), 0);
  const bool off = mc::core_binding(2 * n, 1).empty();
  unsetenv("MESHTRAIN_COMM_PIN");
  EXPECT_TRUE(off);
  EXPECT_FALSE(mc::core_binding(2 * n, 1).empty());
}
