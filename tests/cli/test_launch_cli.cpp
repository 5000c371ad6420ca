// `meshtrain launch` end to end: a dp 2 x pp 2 job whose rank 3 fails (the test fault
// injection) resumes on the three survivors at the largest layout that takes the same global
// batch (dp 3) and its loss equals the uninterrupted single-rank run's at every step; the
// events file names the lost rank, the new layout and the checkpoint resumed from; the metrics
// hold every step once; it gives up with exit 1 after --max-restarts; bad input exits 2. The
// same as MPI processes (--np, through mpirun), a rank's process killed from outside, and a
// stopped job ended after --stall-timeout-s and resumed.
#include <gtest/gtest.h>

#include <sys/types.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
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


// gpt-tiny at dp 2 x pp 2 under `launch LAUNCH_OPTS`, rank 3 failing at step 7 (0-based 6):
// the events (a failure naming rank 3 and step 6's checkpoint, a restart at dp 3 on the three
// survivors, the restart's cost), and every step's loss once in the metrics and equal to the
// uninterrupted single-rank run's. Returns the events for the caller's own checks.
std::vector<json> rank3_fails_at_dp2_pp2(const std::string& launch_opts) {
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl"), metrics = tmp.file("m.jsonl");
  auto r = run_cli("launch " + launch_opts + " --events " + events + " -- train --data " + data + kJob +
                       " --log-every 5 --dp 2 --pp 2 --microbatches 2 --checkpoint-dir " + tmp.file("ck") +
                       " --checkpoint-every 2 --metrics " + metrics + " --fail-rank 3 --fail-at-step 6",
                   300);
  EXPECT_EQ(r.code, 0) << r.output;
  const auto ev = lines_of(events);
  std::vector<std::string> kinds;
  for (const json& e : ev) kinds.push_back(e.at("event"));
  EXPECT_EQ(kinds, (std::vector<std::string>{"start", "failure", "restart", "resumed", "done"})) << r.output;
  if (kinds.size() != 5) return ev;
  EXPECT_EQ(ev[1].at("lost_ranks"), json::array({3}));
  EXPECT_EQ(ev[1].at("checkpoint"), "step_00000006");
  EXPECT_EQ(ev[2].at("layout"), "dp=3 tp=1 pp=1");
  EXPECT_EQ(ev[2].at("survivors"), 3);
  EXPECT_EQ(ev[2].at("from_step"), 6);
  EXPECT_GE(ev[1].at("work_lost_s").get<double>(), 0.0);
  EXPECT_LE(ev[1].at("work_lost_s").get<double>(), ev[1].at("seconds_run").get<double>());
  EXPECT_GT(ev[3].at("restart_s").get<double>(), 0.0);
  EXPECT_EQ(ev[4].at("layout"), "dp=3 tp=1 pp=1");

  // The uninterrupted single-rank run.
  const std::string ref = tmp.file("ref.jsonl");
  auto s = run_cli("train --data " + data + kJob + " --metrics " + ref, 300);
  EXPECT_EQ(s.code, 0) << s.output;
  const auto got = lines_of(metrics), want = lines_of(ref);
  EXPECT_EQ(got.size(), 10u);  // every step once: the failed run's step 7 is written again, not twice
  EXPECT_EQ(want.size(), 10u);
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_EQ(got[i].at("step"), static_cast<int>(i + 1));
    const double a = got[i].at("loss"), b = want[i].at("loss");
    EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(b)) << "step " << i + 1;
  }
  return ev;
}

}  // namespace

TEST(CliLaunch, ResumesOnTheSurvivorsOnTheSingleRankCurve) { rank3_fails_at_dp2_pp2(""); }

// The survivors' best layout does not fit in memory (train's start-up check, told by a test
// setting that the machine has 40 MiB: dp 2 x pp 2 needs 37.2 MiB, dp 3 45.1 MiB, pp 2 24.0 MiB):
// the launcher goes on to the next layout that may fit, pp 2 on two ranks, on the same curve.
TEST(CliLaunch, TakesTheNextLayoutWhenTheBestDoesNotFitInMemory) {
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl"), metrics = tmp.file("m.jsonl");
  setenv("MESHTRAIN_TEST_MEMORY_BYTES", std::to_string(40 << 20).c_str(), 1);
  auto r = run_cli("launch --events " + events + " -- train --data " + data + kJob +
                       " --dp 2 --pp 2 --microbatches 2 --checkpoint-dir " + tmp.file("ck") +
                       " --checkpoint-every 2 --metrics " + metrics + " --fail-rank 3 --fail-at-step 6",
                   300);
  unsetenv("MESHTRAIN_TEST_MEMORY_BYTES");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ev = lines_of(events);
  std::vector<std::string> kinds;
  for (const json& e : ev) kinds.push_back(e.at("event"));
  ASSERT_EQ(kinds, (std::vector<std::string>{"start", "failure", "restart", "refused", "resumed", "done"})) << r.output;
  EXPECT_EQ(ev[2].at("layout"), "dp=3 tp=1 pp=1");
  EXPECT_EQ(ev[3].at("layout"), "dp=3 tp=1 pp=1");
  EXPECT_EQ(ev[3].at("reason"), "memory");
  EXPECT_EQ(ev[3].at("next"), "dp=1 tp=1 pp=2");
  EXPECT_EQ(ev[5].at("layout"), "dp=1 tp=1 pp=2");
  const std::string ref = tmp.file("ref.jsonl");
  auto s = run_cli("train --data " + data + kJob + " --metrics " + ref, 300);
  ASSERT_EQ(s.code, 0) << s.output;
  const auto got = lines_of(metrics), want = lines_of(ref);
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].at("step"), static_cast<int>(i + 1));
    const double x = got[i].at("loss"), y = want.at(i).at("loss");
    EXPECT_LE(std::abs(x - y), 1e-5 * std::abs(y)) << "step " << i + 1;
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
  r = run_cli("launch --stall-timeout-s -1" + job, 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--stall-timeout-s"), std::string::npos) << r.output;
  r = run_cli("launch -- generate", 60);
  EXPECT_EQ(r.code, 2) << r.output;
  // A job that exits 2 (bad input) is not restarted.
  r = run_cli("launch -- train --data " + tmp.file("missing.txt") + kJob + " --checkpoint-dir " + tmp.file("ck2"), 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.find("restart"), std::string::npos) << r.output;
}

namespace {
// The process of a job's rank: a `meshtrain train` (not the launcher) whose arguments name the
// metrics file `metrics` and whose environment holds `env` (empty: any). 0 when none runs.
pid_t job_process(const std::string& metrics, const std::string& env) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream environ_file(e.path() / "environ"), cmd(e.path() / "cmdline");
    const std::string environ_text((std::istreambuf_iterator<char>(environ_file)), {}),
        cmdline((std::istreambuf_iterator<char>(cmd)), {});
    if (cmdline.find(metrics) == std::string::npos || cmdline.find(std::string("\0train\0", 7)) == std::string::npos ||
        cmdline.find(std::string("\0launch\0", 8)) != std::string::npos)
      continue;
    if (env.empty() || environ_text.find(env + '\0') != std::string::npos) return std::stoi(name);
  }
  return 0;
}

// job_process once the job has written 12 metrics lines (so that it is well under way); 0 when
// none was found within two minutes.
pid_t running_process(const std::string& metrics, const std::string& env) {
  for (int i = 0; i < 1200; ++i) {
    if (lines_of(metrics).size() >= 12)
      if (const pid_t p = job_process(metrics, env)) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}

// Runs `launch_args` (a launch command writing `metrics`) and, once the job is well under way,
// sends `sig` to its process whose environment holds `env` (any when empty); the launch's
// result. A job process not found fails the calling test.
meshtrain::testing::CliResult signal_during(const std::string& launch_args, const std::string& metrics, const std::string& env, int sig) {
  auto job = std::async(std::launch::async, [&] { return run_cli(launch_args, 300); });
  const pid_t p = running_process(metrics, env);
  EXPECT_GT(p, 0) << "no process of the job" << (env.empty() ? "" : " with " + env) << " found while it ran";
  if (p > 0) kill(p, sig);
  return job.get();
}

std::vector<std::string> kinds_of(const std::vector<json>& events) {
  std::vector<std::string> kinds;
  for (const json& e : events) kinds.push_back(e.at("event"));
  return kinds;
}

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
// on the three survivors (mpirun -np 3, dp 3) on the single-rank curve.
TEST(CliLaunch, MpiJobResumesOnTheSurvivors) {
#ifndef MESHTRAIN_HAVE_MPI
  GTEST_SKIP() << "this build has no MPI backend";
#endif
  mpi_environment();
  const auto ev = rank3_fails_at_dp2_pp2("--np 4");
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0].at("hosts"), "localhost:4");
  EXPECT_EQ(ev[2].at("hosts"), "localhost:3");
}

// A real kill: SIGKILL to world rank 1's process of a --np 2 job. mpirun names the process, the
// launcher counts rank 1 lost and goes on at dp 1 from the last checkpoint, to the end.
TEST(CliLaunch, MpiRankKilledFromOutsideIsLost) {
#ifndef MESHTRAIN_HAVE_MPI
  GTEST_SKIP() << "this build has no MPI backend";
#endif
  mpi_environment();
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl"), metrics = tmp.file("m.jsonl");
  // A constant rate, so the curve does not depend on --steps; many steps, so the kill lands.
  const auto r = signal_during("launch --np 2 --max-restarts 1 --events " + events + " -- train --data " + data +
                                    " --model gpt-tiny --batch 4 --seq 16 --steps 600 --warmup 0 --lr 0.001 "
                                    "--min-lr 0.001 --eval-every 0 --eval-batches 1 --threads 1 --comm-timeout 20 "
                                    "--quiet --dp 2 --checkpoint-dir " +
                                    tmp.file("ck") + " --checkpoint-every 5 --metrics " + metrics,
                                metrics, "OMPI_COMM_WORLD_RANK=1", SIGKILL);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ev = lines_of(events);
  ASSERT_EQ(kinds_of(ev), (std::vector<std::string>{"start", "failure", "restart", "resumed", "done"})) << r.output;
  EXPECT_EQ(ev[1].at("lost_ranks"), json::array({1})) << r.output;
  EXPECT_EQ(ev[2].at("layout"), "dp=1 tp=1 pp=1");
  EXPECT_EQ(ev[2].at("hosts"), "localhost:1");
  const auto got = lines_of(metrics);
  ASSERT_EQ(got.size(), 600u);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].at("step"), static_cast<int>(i + 1));
}

// A stalled job: the threads child of a one-rank job stopped (SIGSTOP) mid-run, where no peer's
// deadline can notice. The launcher sees no step for --stall-timeout-s, ends it, and resumes at
// the same layout from the last checkpoint: every step once, each loss equal to the
// uninterrupted run's (resume is bit-exact).
TEST(CliLaunch, EndsAndRestartsAStalledJob) {
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl"), metrics = tmp.file("m.jsonl");
  const std::string train = " --data " + data +
                            " --model gpt-tiny --batch 4 --seq 16 --steps 600 --warmup 0 --lr 0.001 --min-lr 0.001 "
                            "--eval-every 0 --eval-batches 1 --threads 1 --quiet --checkpoint-every 5";
  const auto r = signal_during("launch --stall-timeout-s 4 --max-restarts 1 --events " + events + " -- train" + train +
                                    " --checkpoint-dir " + tmp.file("ck") + " --metrics " + metrics,
                                metrics, "", SIGSTOP);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the job is stalled"), std::string::npos) << r.output;
  const auto ev = lines_of(events);
  ASSERT_EQ(kinds_of(ev), (std::vector<std::string>{"start", "failure", "restart", "resumed", "done"})) << r.output;
  EXPECT_EQ(ev[1].at("reason"), "stalled");
  EXPECT_EQ(ev[1].at("lost_ranks"), json::array());
  EXPECT_GE(ev[1].at("stalled_s").get<double>(), 4.0);
  EXPECT_EQ(ev[2].at("layout"), "dp=1 tp=1 pp=1");

  const std::string ref = tmp.file("ref.jsonl");
  const auto s = run_cli("train" + train + " --checkpoint-dir " + tmp.file("ck_ref") + " --metrics " + ref, 300);
  ASSERT_EQ(s.code, 0) << s.output;
  const auto got = lines_of(metrics), want = lines_of(ref);
  ASSERT_EQ(got.size(), 600u);
  ASSERT_EQ(want.size(), 600u);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].at("step"), static_cast<int>(i + 1));
    ASSERT_EQ(got[i].at("loss").get<double>(), want[i].at("loss").get<double>()) << "step " << i + 1;
  }
}

// A long evaluation is not a stall: the final evaluation of 16,000 batches (several seconds)
// under --stall-timeout-s 2, where each step takes milliseconds. The trainer's heartbeat comes
// after each chunk of evaluation batches too, so the job ends once, with no failure.
TEST(CliLaunch, ALongEvaluationIsNotAStall) {
  meshtrain::testing::TempDir tmp("launch_cli");
  const std::string data = corpus(tmp), events = tmp.file("events.jsonl");
  const auto r = run_cli("launch --stall-timeout-s 2 --max-restarts 1 --events " + events + " -- train --data " + data +
                             " --model gpt-tiny --batch 4 --seq 16 --steps 20 --warmup 0 --eval-every 0 "
                             "--eval-batches 16000 --threads 1 --checkpoint-dir " +
                             tmp.file("ck") + " --metrics " + tmp.file("m.jsonl"),
                         300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("the job is stalled"), std::string::npos) << r.output;
  EXPECT_EQ(kinds_of(lines_of(events)), (std::vector<std::string>{"start", "done"})) << r.output;
  EXPECT_NE(r.output.find("final validation loss"), std::string::npos) << r.output;
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
  r = run_cli("launch --max-ranks 1" + job, 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--max-ranks 1 is below the job's 2 ranks"), std::string::npos) << r.output;
  r = run_cli("launch --grow --max-restarts 0 -- train --data " + data + kJob, 60);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--checkpoint-dir"), std::string::npos) << r.output;
}
