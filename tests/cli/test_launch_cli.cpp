// `meshtrain launch` end to end: a dp 2 x pp 2 job whose rank 3 fails (the test fault
// injection) resumes on the three survivors at the largest layout that takes the same global
// batch (dp 3) and its loss equals the uninterrupted single-rank run's at every step; the
// events file names the lost rank, the new layout and the checkpoint resumed from; the metrics
// hold every step once; it gives up with exit 1 after --max-restarts; bad input exits 2.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "temp_dir.h"

namespace {
using meshtrain::testing::run_cli;
using nlohmann::json;

std::vector<json> lines_of(const std::string& path) {
  std::vector<json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::string corpus(const meshtrain::testing::TempDir& tmp) {
  const std::string p = tmp.file("corpus.txt");
  std::ofstream f(p);
  for (int i = 0; i < 3000; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  return p;
}

const std::string kJob = " --model gpt-tiny --steps 10 --batch 12 --seq 32 --eval-every 0 --eval-batches 1 --threads 1 "
                        "--comm-timeout 20";

}  // namespace

TEST(CliLaunch, ResumesOnTheSurvivorsOnTheSingleRankCurve) {
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl"), metrics = tmp.file("m.jsonl");
  auto r = run_cli("launch --events " + events + " -- train --data " + data + kJob + " --log-every 5" +
                       " --dp 2 --pp 2 --microbatches 2 --checkpoint-dir " + tmp.file("ck") +
                       " --checkpoint-every 2 --metrics " + metrics + " --fail-rank 3 --fail-at-step 6",
                   300);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ev = lines_of(events);
  std::vector<std::string> kinds;
  for (const json& e : ev) kinds.push_back(e.at("event"));
  ASSERT_EQ(kinds, (std::vector<std::string>{"start", "failure", "restart", "resumed", "done"})) << r.output;
  EXPECT_EQ(ev[1].at("lost_ranks"), json::array({3}));
  EXPECT_EQ(ev[1].at("checkpoint"), "step_00000006");
  EXPECT_EQ(ev[2].at("layout"), "dp=3 tp=1 pp=1");
  EXPECT_EQ(ev[2].at("survivors"), 3);
  EXPECT_GE(ev[1].at("work_lost_s").get<double>(), 0.0);
  EXPECT_LE(ev[1].at("work_lost_s").get<double>(), ev[1].at("seconds_run").get<double>());
  EXPECT_GT(ev[3].at("restart_s").get<double>(), 0.0);
  EXPECT_EQ(ev[4].at("layout"), "dp=3 tp=1 pp=1");

  // The uninterrupted single-rank run.
  const std::string ref = tmp.file("ref.jsonl");
  auto s = run_cli("train --data " + data + kJob + " --metrics " + ref, 300);
  ASSERT_EQ(s.code, 0) << s.output;
  const auto got = lines_of(metrics), want = lines_of(ref);
  ASSERT_EQ(got.size(), 10u);  // every step once: the failed run's step 7 is written again, not twice
  ASSERT_EQ(want.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].at("step"), static_cast<int>(i + 1));
    const double a = got[i].at("loss"), b = want[i].at("loss");
    EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(b)) << "step " << i + 1;
  }
}

TEST(CliLaunch, GivesUpAfterMaxRestartsAndRefusesBadInput) {
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl");
  const std::string job = " -- train --data " + data + kJob + " --dp 2 --checkpoint-dir " + tmp.file("ck");
  auto r = run_cli("launch --max-restarts 0 --events " + events + job + " --fail-rank 1 --fail-at-step 3", 300);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("giving up"), std::string::npos) << r.output;
  const auto ev = lines_of(events);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().at("event"), "give_up");

  // Bad input: exit 2 with a sentence, nothing run.
  r = run_cli("launch --min-ranks 3" + job, 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--min-ranks"), std::string::npos) << r.output;
  r = run_cli("launch -- train --data " + data + kJob + " --dp 2", 60);  // restarts need checkpoints
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--checkpoint-dir"), std::string::npos) << r.output;
  r = run_cli("launch -- generate", 60);
  EXPECT_EQ(r.code, 2) << r.output;
  // A job that exits 2 (bad input) is not restarted.
  r = run_cli("launch -- train --data " + tmp.file("missing.txt") + kJob + " --checkpoint-dir " + tmp.file("ck2"), 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.find("restart"), std::string::npos) << r.output;
}

namespace {
// mpirun's settings for this machine, as OpenMPI reads them from the environment (the tests run
// as root in CI; more processes than cores).
void mpi_environment() {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  setenv("OMPI_MCA_hwloc_base_binding_policy", "none", 1);
  setenv("OMPI_MCA_btl", "vader,self", 1);
}
}  // namespace

// The same job as MPI processes (--np 4, through mpirun): rank 3 fails, the launcher resumes
// on the three survivors (mpirun -np 3, dp 3) on the single-rank curve; and a SIGKILL of one
// rank's process (mpirun names it) counts as that rank lost.
TEST(CliLaunch, MpiJobResumesOnTheSurvivors) {
#ifndef MESHTRAIN_HAVE_MPI
  GTEST_SKIP() << "this build has no MPI backend";
#endif
  mpi_environment();
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl"), metrics = tmp.file("m.jsonl");
  auto r = run_cli("launch --np 4 --events " + events + " -- train --data " + data + kJob + " --log-every 5" +
                       " --dp 2 --pp 2 --microbatches 2 --checkpoint-dir " + tmp.file("ck") +
                       " --checkpoint-every 2 --metrics " + metrics + " --fail-rank 3 --fail-at-step 6",
                   300);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ev = lines_of(events);
  std::vector<std::string> kinds;
  for (const json& e : ev) kinds.push_back(e.at("event"));
  ASSERT_EQ(kinds, (std::vector<std::string>{"start", "failure", "restart", "resumed", "done"})) << r.output;
  EXPECT_EQ(ev[0].at("hosts"), "localhost:4");
  EXPECT_EQ(ev[1].at("lost_ranks"), json::array({3}));
  EXPECT_EQ(ev[2].at("layout"), "dp=3 tp=1 pp=1");
  EXPECT_EQ(ev[2].at("hosts"), "localhost:3");
  const std::string ref = tmp.file("ref.jsonl");
  auto s = run_cli("train --data " + data + kJob + " --metrics " + ref, 300);
  ASSERT_EQ(s.code, 0) << s.output;
  const auto got = lines_of(metrics), want = lines_of(ref);
  ASSERT_EQ(got.size(), 10u);
  ASSERT_EQ(want.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].at("step"), static_cast<int>(i + 1));
    const double a = got[i].at("loss"), b = want[i].at("loss");
    EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(b)) << "step " << i + 1;
  }
}

TEST(CliLaunch, RefusesBadHostsFiles) {
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp);
  const std::string job = " -- train --data " + data + kJob + " --dp 2 --checkpoint-dir " + tmp.file("ck");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(tmp.file(name)) << text;
    return tmp.file(name);
  };
  struct Case {
    std::string file, says;
  };
  const std::vector<Case> cases = {
      {write("empty.txt", "# nothing here\n\n"), "names no host"},
      {write("bad_slots.txt", "node1 slots=0\n"), "slots=N"},
      {write("words.txt", "node1 cpus=4\n"), "'cpus=4' is not understood"},
      {write("twice.txt", "node1\nnode1 slots=2\n"), "listed twice"},
      {write("name.txt", "node/1\n"), "is not a host name"},
      {write("few.txt", "node1 slots=1\n"), "fewer than the job's 2 ranks"},
      {tmp.file("missing.txt"), "cannot read the hosts file"},
  };
  for (const Case& c : cases) {
    const auto r = run_cli("launch --hosts " + c.file + job, 60);
    EXPECT_EQ(r.code, 2) << c.file << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.file << "\n" << r.output;
  }
  auto r = run_cli("launch --np 3" + job, 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--np 3 differs from the job's 2 ranks"), std::string::npos) << r.output;
  r = run_cli("launch --np 2 --hosts " + cases[0].file + job, 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("not both"), std::string::npos) << r.output;
  r = run_cli("launch --grow --max-restarts 0 -- train --data " + data + kJob, 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--checkpoint-dir"), std::string::npos) << r.output;
}
