// Crash consistency through the `meshtrain` program: runs killed with SIGKILL at random moments
// and resumed end with every metrics line once and the weights of the uninterrupted run; a
// full disk at the metrics file, the trace or a checkpoint ends the run with exit 1 naming the
// file and the cause, leaves the last good checkpoint `latest` and reports nothing as written
// that was not. The full-disk tests mount a small tmpfs and skip where mounting is refused.
//
// The kills are driven by the program's own output (a progress or checkpoint line), then a
// random delay, so they land inside the run on a loaded machine too; assertions are on what
// the files hold, never on timing (the deadlines are hang guards only).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "temp_dir.h"
#include "tmpfs_mount.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace meshtrain;
using meshtrain::testing::run_cli;

namespace {

using Clock = std::chrono::steady_clock;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool has(const std::string& text, const std::string& phrase) { return text.find(phrase) != std::string::npos; }

// The lines of a metrics file that parse, by step (a step written twice appears twice).
std::vector<nlohmann::json> metric_lines(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step")) out.push_back(std::move(j));
  }
  return out;
}

std::vector<int64_t> steps_of(const std::vector<nlohmann::json>& lines) {
  std::vector<int64_t> s;
  for (const auto& j : lines) s.push_back(j.at("step").get<int64_t>());
  return s;
}

std::vector<int64_t> one_to(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

std::string corpus_in(const meshtrain::testing::TempDir& tmp) {
  const std::string p = tmp.file("corpus.txt");
  if (!fs::exists(p)) {
    std::ofstream f(p);
    for (int i = 0; i < 2000; ++i) f << "to be or not to be, that is the question " << i % 97 << ". ";
  }
  return p;
}

// Every tensor of both checkpoints, byte for byte (model and optimizer state).
void expect_same_tensors(const std::string& a, const std::string& b) {
  const train::CheckpointData x = train::load_checkpoint(a), y = train::load_checkpoint(b);
  EXPECT_EQ(x.step, y.step);
  for (const auto part : {&train::CheckpointData::model, &train::CheckpointData::optimizer}) {
    std::map<std::string, const Tensor*> by_name;
    for (const auto& [n, t] : y.*part) by_name[n] = &t;
    ASSERT_EQ((x.*part).size(), by_name.size());
    for (const auto& [n, t] : x.*part) {
      ASSERT_TRUE(by_name.count(n)) << n;
      const Tensor& u = *by_name[n];
      ASSERT_EQ(t.numel(), u.numel()) << n;
      EXPECT_EQ(std::memcmp(t.data(), u.data(), static_cast<size_t>(t.numel()) * sizeof(float)), 0)
          << n << " differs from the uninterrupted run's";
    }
  }
}

// ---- a child we can kill: its stdout and stderr on one pipe, read line by line ----

// A command line's words, as a shell splits a line without quotes.
std::vector<std::string> words_of(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream words(line);
  for (std::string w; words >> w;) out.push_back(w);
  return out;
}

class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    const std::string bin = meshtrain::testing::meshtrain_binary();
    std::vector<char*> argv{const_cast<char*>(bin.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    ::close(p[1]);
    fd_ = p[0];
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0 && fd_ >= 0; }
  const std::string& output() const { return output_; }

  // Waits for the next progress or checkpoint line; false at the end of the output or at the
  // deadline.
  bool next_event(Clock::time_point deadline) {
    for (;;) {
      size_t nl;
      while ((nl = pending_.find('\n')) != std::string::npos) {
        const std::string line = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        if (line.rfind("step ", 0) == 0 || line.rfind("checkpoint ", 0) == 0) return true;
      }
      if (!read_some(deadline)) return false;
    }
  }

  void send(int sig) { ::kill(pid_, sig); }

  // SIGKILL now. Returns true when the signal ended the process (false: it had exited).
  bool kill_and_reap(Clock::time_point deadline) {
    ::kill(pid_, SIGKILL);
    const int status = reap(deadline);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }
  // The raw wait status once the process ends.
  int wait_status(Clock::time_point deadline) { return reap(deadline); }
  // The exit code once the process ends on its own (-1: a signal or the deadline).
  int wait_exit(Clock::time_point deadline) {
    const int status = reap(deadline);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  bool read_some(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) return false;
    char buf[4096];
    const ssize_t k = ::read(fd_, buf, sizeof buf);
    if (k <= 0) return false;
    output_.append(buf, static_cast<size_t>(k));
    pending_.append(buf, static_cast<size_t>(k));
    return true;
  }
  int reap(Clock::time_point deadline) {
    while (read_some(deadline)) {
    }
    if (Clock::now() >= deadline) ::kill(pid_, SIGKILL);  // hang guard
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_, pending_;
};

}  // namespace

// 20 SIGKILLs at random moments (seeded) of a pp 2 x dp 2 run that saves every step, each
// followed by --resume (killed again while steps remain), each chain then resumed to the
// end: every metrics file holds steps 1..12 once each, with the losses of the uninterrupted
// run, and the final checkpoint holds its tensors bit for bit.
TEST(CrashCli, KilledPipelineRunsResumeToTheUninterruptedResult) {
  meshtrain::testing::TempDir tmp("crash_cli");
  constexpr int64_t kSteps = 12;
  constexpr int kKills = 20;
  auto args = [&](const fs::path& dir, bool resume) {
    std::vector<std::string> a = {"train", "--model", "gpt-tiny", "--data", corpus_in(tmp), "--pp", "2", "--dp", "2",
                                  "--microbatches", "2", "--batch", "4", "--seq", "16", "--threads", "1",
                                  "--eval-every", "4", "--eval-batches", "1", "--log-every", "1",
                                  "--steps", std::to_string(kSteps), "--checkpoint-every", "1",
                                  "--keep-checkpoints", "3", "--checkpoint-dir", (dir / "ck").string(),
                                  "--metrics", (dir / "m.jsonl").string()};
    if (resume) a.push_back("--resume");
    return a;
  };
  auto deadline = [] { return Clock::now() + std::chrono::seconds(90); };  // hang guard per run

  const fs::path ref = tmp.path() / "ref";
  fs::create_directories(ref);
  {
    Child c(args(ref, false));
    ASSERT_TRUE(c.started());
    ASSERT_EQ(c.wait_exit(deadline()), 0) << c.output();
  }
  const std::vector<nlohmann::json> want = metric_lines(ref / "m.jsonl");
  ASSERT_EQ(steps_of(want), one_to(kSteps));

  std::mt19937 rng(20240611);
  int kills = 0, chains = 0, launches = 0, window = 0;
  while (kills < kKills) {
    ASSERT_LT(chains, 15) << "the kills kept missing the runs";
    const fs::path dir = tmp.path() / ("chain" + std::to_string(chains++));
    fs::create_directories(dir);
    int64_t hole = 0;  // a committed step whose line the file lacked at a kill (0: none)
    for (bool resume = false, done = false; !done; resume = true) {
      ASSERT_LT(++launches, 200);
      Child c(args(dir, resume));
      ASSERT_TRUE(c.started());
      if (kills >= kKills) {  // the final resume of this chain, to the end
        ASSERT_EQ(c.wait_exit(deadline()), 0) << c.output();
        done = true;
      } else {
        // A random moment: after 0-5 progress or checkpoint lines, then 0-25 ms (often none:
        // right after a checkpoint's line is where the metrics line is written); with no
        // line, 20-300 ms after the start (start-up, restore, the metrics file's repair).
        const int events = std::uniform_int_distribution<int>(0, 5)(rng);
        const int coin = std::uniform_int_distribution<int>(0, 2)(rng);
        const int delay_us = events == 0 ? std::uniform_int_distribution<int>(20'000, 300'000)(rng)
                             : coin == 0 ? 0
                                         : std::uniform_int_distribution<int>(0, 25'000)(rng);
        const auto until = deadline();
        bool alive = true;
        for (int e = 0; e < events && alive; ++e) alive = c.next_event(until);
        if (alive) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        if (c.kill_and_reap(until)) {
          ++kills;
        } else {  // it finished first
          ASSERT_TRUE(has(c.output(), "done: ")) << c.output();
          done = true;
        }
      }
      const std::string out = c.output();
      ASSERT_FALSE(has(out, "meshtrain: error")) << out;
      if (hole && has(out, "metrics file ")) {
        EXPECT_TRUE(has(out, "rebuilt the line(s) of step(s) " + std::to_string(hole) + ",")) << out;
        if (has(out, "rebuilt the line(s)")) hole = 0;
      }
      if (done) break;
      // After a kill: the step --resume continues from has its metrics line in its checkpoint.
      const train::ResumePoint rp = train::find_resume_point((dir / "ck").string());
      if (!rp.folder) continue;
      const nlohmann::json state = train::read_checkpoint_state(*rp.folder);
      ASSERT_TRUE(state.contains("metrics")) << *rp.folder;
      EXPECT_EQ(state["metrics"]["step"], rp.step);
      EXPECT_EQ(state["metrics"]["loss"], want[rp.step - 1]["loss"]);
      const std::vector<int64_t> have = steps_of(metric_lines(dir / "m.jsonl"));
      auto in_file = [&](int64_t s) { return std::find(have.begin(), have.end(), s) != have.end(); };
      if (hole && in_file(hole)) hole = 0;  // repaired by a resume killed before its note
      if (!in_file(rp.step) && hole != rp.step) hole = rp.step, ++window;
    }
    // The chain's result: each step once, the uninterrupted run's losses, its tensors.
    const std::vector<nlohmann::json> got = metric_lines(dir / "m.jsonl");
    ASSERT_EQ(steps_of(got), one_to(kSteps)) << dir;
    for (int64_t s = 0; s < kSteps; ++s) {
      EXPECT_EQ(got[s]["loss"], want[s]["loss"]) << "step " << s + 1;
      EXPECT_EQ(got[s]["grad_norm"], want[s]["grad_norm"]) << "step " << s + 1;
    }
    EXPECT_EQ(hole, 0) << "step " << hole << "'s line was never rebuilt";
    EXPECT_EQ(read_all(dir / "ck" / "latest"), train::step_folder_name(kSteps) + "\n");
    expect_same_tensors((dir / "ck").string(), (ref / "ck").string());
    fs::remove_all(dir);  // about 30 MiB of checkpoints a chain
  }
  EXPECT_EQ(kills, kKills);
  std::printf("%d kills over %d chains (%d runs); %d left a committed step without its metrics line, "
              "which the next resume rebuilt\n",
              kills, chains, launches, window);
  RecordProperty("kills", kills);
  RecordProperty("kills_between_commit_and_metrics_line", window);
}

// As a kill between committing a checkpoint and writing its metrics line leaves it (the window
// the test above hits at random): the resume writes the line back from the checkpoint.
TEST(CrashCli, AMissingMetricsLineComesBackFromItsCheckpoint) {
  meshtrain::testing::TempDir tmp("crash_cli");
  const std::string ck = tmp.file("ck"), m = tmp.file("m.jsonl");
  const std::string base = "train --data " + corpus_in(tmp) + " --batch 4 --seq 16 --eval-batches 1 --threads 1 "
                           "--log-every 0 --checkpoint-every 1 --checkpoint-dir " + ck + " --metrics " + m;
  auto r = run_cli(base + " --steps 4");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<nlohmann::json> first = metric_lines(m);
  ASSERT_EQ(steps_of(first), one_to(4));
  std::ofstream(m, std::ios::trunc) << first[0].dump() << "\n" << first[1].dump() << "\n" << first[1].dump() << "\n";
  r = run_cli(base + " --steps 6 --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "collapsed 1 duplicate line(s)")) << r.output;
  EXPECT_TRUE(has(r.output, "rebuilt the line(s) of step(s) 3-4,")) << r.output;
  const std::vector<nlohmann::json> got = metric_lines(m);
  ASSERT_EQ(steps_of(got), one_to(6));
  EXPECT_EQ(got[3]["loss"], first[3]["loss"]);
  EXPECT_FALSE(got[3].contains("checkpoint"));  // a rebuilt line: no save timings
  EXPECT_TRUE(got[4].contains("checkpoint"));   // an uninterrupted step keeps them
}

// A run without --metrics, resumed with it: the lines its checkpoints recorded come back; those
// of steps whose folders were pruned cannot, and the note says so.
TEST(CrashCli, MetricsAddedOnResumeRebuildWhatCheckpointsRecorded) {
  meshtrain::testing::TempDir tmp("crash_cli");
  const std::string ck = tmp.file("ck"), m = tmp.file("m.jsonl");
  const std::string base = "train --data " + corpus_in(tmp) + " --batch 4 --seq 16 --eval-batches 1 --threads 1 "
                           "--log-every 0 --checkpoint-every 1 --keep-checkpoints 2 --checkpoint-dir " + ck;
  auto r = run_cli(base + " --steps 4");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_cli(base + " --steps 5 --resume --metrics " + m);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "rebuilt the line(s) of step(s) 3-4,")) << r.output;
  EXPECT_TRUE(has(r.output, "lacks the line(s) of step(s) 1-2, which could not be rebuilt")) << r.output;
  EXPECT_EQ(steps_of(metric_lines(m)), (std::vector<int64_t>{3, 4, 5}));
}

// ---- a graceful stop (train/stop.h) ----

// SIGTERM (and SIGINT) stop a run at the end of the step in flight: exit 0 with a sentence
// naming the step, a checkpoint of that step `latest`, the metrics file holding steps 1..N once
// each; --resume then ends where an uninterrupted run of as many steps ends, metrics and tensors
// bit for bit. The learning rate is constant (no warm-up, cosine from --lr to --min-lr = --lr),
// so the run may be started with more steps than it will take and the reference sized after the
// stop: nothing depends on when the signal lands.
TEST(StopCli, ASignalStopsAtAStepWithACheckpointAndTheResumeIsBitExact) {
  meshtrain::testing::TempDir tmp("stop_cli");
  const std::string base = "train --data " + corpus_in(tmp) + " --batch 4 --seq 16 --eval-batches 1 --threads 1 " +
                           "--eval-every 0 --log-every 1 --warmup 0 --lr 0.001 --min-lr 0.001";
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    const std::string ck = tmp.file("ck_" + name), m = tmp.file("m_" + name + ".jsonl");
    Child child(words_of(base + " --steps 1000000 --checkpoint-dir " + ck + " --metrics " + m));
    ASSERT_TRUE(child.started());
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(child.next_event(deadline)) << child.output();
    child.send(sig);
    ASSERT_EQ(child.wait_exit(deadline), 0) << child.output();
    const std::vector<nlohmann::json> lines = metric_lines(m);
    const int64_t n = static_cast<int64_t>(lines.size());
    ASSERT_GE(n, 2) << child.output();
    EXPECT_TRUE(has(child.output(), "stopped at step " + std::to_string(n) + " by " + name +
                                        ", checkpoint written to " + ck + " (continue with --resume)"))
        << child.output();
    EXPECT_EQ(steps_of(lines), one_to(n));
    EXPECT_EQ(train::open_checkpoint(ck).step, n) << "latest is the stopped step's checkpoint";
    const int64_t total = n + 10;
    const std::string whole_ck = tmp.file("whole_" + name), whole_m = tmp.file("whole_" + name + ".jsonl");
    auto r = run_cli(base + " --steps " + std::to_string(total) + " --checkpoint-dir " + whole_ck + " --metrics " +
                     whole_m);
    ASSERT_EQ(r.code, 0) << r.output;
    r = run_cli(base + " --steps " + std::to_string(total) + " --checkpoint-dir " + ck + " --metrics " + m +
                " --resume");
    ASSERT_EQ(r.code, 0) << r.output;
    const std::vector<nlohmann::json> got = metric_lines(m), whole = metric_lines(whole_m);
    ASSERT_EQ(steps_of(got), one_to(total)) << name;
    ASSERT_EQ(steps_of(whole), one_to(total)) << name;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i]["loss"], whole[i]["loss"]) << name << " step " << i + 1;
    expect_same_tensors(ck, whole_ck);
  }
}

// `meshtrain launch` forwards SIGTERM to its job: the job stops at a step with a checkpoint and
// exits 0, and so does the launcher (no restart).
TEST(StopCli, LaunchForwardsASignalToItsJob) {
  meshtrain::testing::TempDir tmp("stop_cli");
  const std::string ck = tmp.file("ck"), m = tmp.file("m.jsonl"), events = tmp.file("events.jsonl");
  Child child(words_of("launch --events " + events + " -- train --data " + corpus_in(tmp) +
                           " --batch 4 --seq 16 --eval-batches 1 --threads 1 --eval-every 0 --log-every 1 --warmup 0 "
                           "--lr 0.001 --min-lr 0.001 --steps 1000000 --checkpoint-dir " + ck + " --metrics " + m));
  ASSERT_TRUE(child.started());
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(child.next_event(deadline)) << child.output();
  child.send(SIGTERM);
  ASSERT_EQ(child.wait_exit(deadline), 0) << child.output();
  const int64_t n = static_cast<int64_t>(metric_lines(m).size());
  EXPECT_TRUE(has(child.output(), "stopped at step " + std::to_string(n) + " by SIGTERM")) << child.output();
  EXPECT_EQ(train::open_checkpoint(ck).step, n);
  EXPECT_FALSE(has(child.output(), "\"restart\"")) << child.output();
}

// The same through the launcher of an MPI job (--np 2, mpirun): SIGTERM to `launch` reaches
// every rank as mpirun's SIGUSR1, the job stops at a step with a checkpoint, all exit 0, and a
// resume continues from it. (Signals are taken by a thread of their own: under MPI the main
// thread computes, and a handler run in a GEMM kernel's thread was seen to corrupt the heap.)
TEST(StopCli, LaunchStopsAnMpiJobAtAStepBoundary) {
#ifndef MESHTRAIN_HAVE_MPI
  GTEST_SKIP() << "this build has no MPI backend";
#endif
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  setenv("OMPI_MCA_hwloc_base_binding_policy", "none", 1);
  setenv("OMPI_MCA_btl", "vader,self", 1);
  meshtrain::testing::TempDir tmp("stop_cli");
  const std::string ck = tmp.file("ck"), m = tmp.file("m.jsonl"), events = tmp.file("events.jsonl");
  const std::string job = " -- train --data " + corpus_in(tmp) +
                          " --batch 4 --seq 16 --eval-batches 1 --threads 1 --eval-every 0 --log-every 1 --warmup 0 "
                          "--lr 0.001 --min-lr 0.001 --dp 2 --checkpoint-dir " + ck + " --metrics " + m;
  Child child(words_of("launch --np 2 --events " + events + job + " --steps 1000000"));
  ASSERT_TRUE(child.started());
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(child.next_event(deadline)) << child.output();
  child.send(SIGTERM);
  ASSERT_EQ(child.wait_exit(deadline), 0) << child.output();
  const int64_t n = static_cast<int64_t>(metric_lines(m).size());
  EXPECT_TRUE(has(child.output(), "stopped at step " + std::to_string(n) + " by SIGUSR1")) << child.output();
  EXPECT_EQ(train::open_checkpoint(ck).step, n);
  EXPECT_FALSE(has(child.output(), "\"restart\"")) << child.output();
  // On from there, two more steps.
  const auto r = run_cli("launch --np 2" + job + " --resume --steps " + std::to_string(n + 2), 120);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto lines = metric_lines(m);
  ASSERT_EQ(static_cast<int64_t>(lines.size()), n + 2) << r.output;
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i].at("step"), static_cast<int64_t>(i + 1));
}

// A second signal ends the process at once with 128 + the signal (130 for SIGINT, 143 for SIGTERM), and
// `latest` still names a complete checkpoint, from which --resume reaches the uninterrupted end.
// The same through `meshtrain launch`, which passes both signals on and exits with its job's code.
TEST(StopCli, ASecondSignalExitsAtOnceAndLeavesTheLastCheckpoint) {
  for (const std::string prefix : {"", "launch -- "}) {
    SCOPED_TRACE(prefix.empty() ? "train" : "launch");
    meshtrain::testing::TempDir tmp("stop_cli");
    const std::string ck = tmp.file("ck");
    // As above: a constant rate, so the signalled run may ask for more steps than it will take.
    const std::string base = "train --data " + corpus_in(tmp) + " --batch 4 --seq 16 --eval-batches 1 --threads 1 " +
                             "--eval-every 0 --log-every 1 --warmup 0 --lr 0.001 --min-lr 0.001 --checkpoint-every 1 " +
                             "--checkpoint-dir " + ck;
    Child child(words_of(prefix + base + " --steps 1000000"));
    ASSERT_TRUE(child.started());
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(child.next_event(deadline)) << child.output();
    // Two different signals, so the second cannot merge with a first still pending (the kernel
    // keeps one pending instance of each): whichever is handled second ends the process.
    child.send(SIGTERM);
    child.send(SIGINT);
    const int status = child.wait_status(deadline);
    ASSERT_TRUE(WIFEXITED(status)) << child.output();
    EXPECT_TRUE(WEXITSTATUS(status) == 130 || WEXITSTATUS(status) == 143)
        << "exit " << WEXITSTATUS(status) << ": " << child.output();
    EXPECT_FALSE(has(child.output(), "stopped at step")) << child.output();
    const train::CheckpointIndex latest = train::open_checkpoint(ck);  // throws if latest is not whole
    EXPECT_GE(latest.step, 2);  // four events seen: the checkpoints and progress lines of steps 1 and 2
    auto r = run_cli(prefix + base + " --steps " + std::to_string(latest.step + 5) + " --resume");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(has(r.output, "done: 5 steps")) << r.output;
  }
}

// Two SIGINTs to `launch` in quick succession, the second landing somewhere in the save the
// first asked for (a sweep of delays; the stop's save is the run's first checkpoint). Whatever
// the moment, the files are consistent: `latest` names the newest step folder installed (none:
// no `latest`), a save cut short stays in its temporary folder only, and neither `latest.tmp`
// nor the launcher's status file stays. Before a commit's last moves were shielded from the
// second signal (train/stop.h, StopDeferred), an exit between writing `latest.tmp` and its
// rename left it there and no `latest`.
TEST(StopCli, TwoSignalsToLaunchLeaveLatestWholeAndNoTemporaryFile) {
  for (const int delay_ms : {0, 10, 30, 60, 100, 150}) {
    SCOPED_TRACE("second signal " + std::to_string(delay_ms) + " ms after the first");
    meshtrain::testing::TempDir tmp("stop_cli");
    const std::string ck = tmp.file("ck");
    Child child(words_of("launch --max-restarts 0 -- train --data " + corpus_in(tmp) +
                         " --batch 4 --seq 16 --eval-batches 1 --threads 1 --eval-every 0 --log-every 1 --warmup 0 "
                         "--lr 0.001 --min-lr 0.001 --steps 1000000 --checkpoint-every 1000 --checkpoint-dir " + ck));
    ASSERT_TRUE(child.started());
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(child.next_event(deadline)) << child.output();
    child.send(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    child.send(SIGINT);
    const int status = child.wait_status(deadline);
    ASSERT_TRUE(WIFEXITED(status)) << child.output();
    // 130: the second signal ended the job; 0: both came before the job took the first.
    EXPECT_TRUE(WEXITSTATUS(status) == 130 || WEXITSTATUS(status) == 0) << "exit " << WEXITSTATUS(status);
    int64_t newest = -1;
    for (const auto& e : fs::directory_iterator(ck)) {
      const std::string name = e.path().filename().string();
      EXPECT_FALSE(name.starts_with("latest.")) << name << " left in " << ck << "\n" << child.output();
      EXPECT_EQ(name.find("launch-status"), std::string::npos) << name << " left in " << ck;
      if (name.starts_with("step_") && name.find('.') == std::string::npos)
        newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
    }
    if (newest >= 0)
      EXPECT_EQ(train::open_checkpoint(ck).step, newest) << child.output();  // throws if `latest` is not whole
    else
      EXPECT_FALSE(fs::exists(fs::path(ck) / "latest")) << child.output();
  }
}

// ---- a full disk ----

class FullDiskCli : public ::testing::Test {
 protected:
  meshtrain::testing::TempDir tmp{"full_disk_cli"};
  std::string base() const {
    return "train --data " + corpus_in(tmp) + " --batch 4 --seq 16 --eval-batches 1 --threads 1 --log-every 1 ";
  }
};

#define SKIP_UNLESS_MOUNTED(disk)                                                                     \
  if (!(disk).mounted())                                                                              \
  GTEST_SKIP() << "skipped: cannot mount a tmpfs to fill (" << (disk).error() << "); run as root to " \
                  "test a full disk"

// The metrics file fills up mid-run: exit 1 naming it; the file holds whole lines of the steps
// printed; the step that failed is not printed, and its checkpoint, `latest`, records its line,
// which a resume after freeing space writes back.
TEST_F(FullDiskCli, AtTheMetricsWrite) {
  meshtrain::testing::TmpfsMount disk(tmp.path() / "disk", "64k");
  SKIP_UNLESS_MOUNTED(disk);
  ASSERT_GT(disk.fill(4096), 0);  // one page: a few lines fit
  const std::string ck = tmp.file("ck"), m = (disk.path() / "m.jsonl").string();
  const std::string run = base() + "--checkpoint-every 1 --checkpoint-dir " + ck + " --metrics " + m;
  auto r = run_cli(run + " --steps 40");
  ASSERT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "cannot write metrics file " + m + ": No space left on device (at step ")) << r.output;
  const size_t at = r.output.find("(at step ");
  ASSERT_NE(at, std::string::npos);
  const int64_t failed = std::stoll(r.output.substr(at + 9));
  ASSERT_GT(failed, 1);
  EXPECT_EQ(steps_of(metric_lines(m)), one_to(failed - 1));
  EXPECT_EQ(read_all(m).back(), '\n');  // no cut line
  EXPECT_TRUE(has(r.output, " " + std::to_string(failed - 1) + "/40 |")) << r.output;
  EXPECT_FALSE(has(r.output, " " + std::to_string(failed) + "/40 |")) << r.output;
  EXPECT_TRUE(has(r.output, "the latest checkpoint stays " + train::step_folder_name(failed))) << r.output;
  EXPECT_EQ(read_all(fs::path(ck) / "latest"), train::step_folder_name(failed) + "\n");
  const train::CheckpointIndex idx = train::open_checkpoint(ck);
  EXPECT_EQ(idx.step, failed);
  EXPECT_EQ(idx.state["metrics"]["step"], failed);
  // Space again: the resume writes the failed step's line back and goes on.
  fs::remove(disk.path() / "filler");
  r = run_cli(run + " --steps " + std::to_string(failed + 2) + " --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "rebuilt the line(s) of step(s) " + std::to_string(failed) + ",")) << r.output;
  EXPECT_EQ(steps_of(metric_lines(m)), one_to(failed + 2));
}

// The trace cannot be written at the end of the run: exit 1 naming it; the previous trace and
// swimlane are untouched, nothing half-written is left beside them, no "trace:" line is printed,
// and the run's last checkpoint is `latest`.
TEST_F(FullDiskCli, AtTheTraceWrite) {
  meshtrain::testing::TmpfsMount disk(tmp.path() / "disk", "256k");
  SKIP_UNLESS_MOUNTED(disk);
  const std::string t = (disk.path() / "t.json").string(), svg = (disk.path() / "t.svg").string();
  auto r = run_cli(base() + "--steps 2 --trace " + t);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string trace = read_all(t), lane = read_all(svg);
  ASSERT_FALSE(trace.empty());
  ASSERT_FALSE(lane.empty());
  ASSERT_GT(disk.fill(), 0);
  const std::string ck = tmp.file("ck");
  r = run_cli(base() + "--steps 3 --checkpoint-every 1 --checkpoint-dir " + ck + " --trace " + t);
  ASSERT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "cannot write trace " + t + ": No space left on device")) << r.output;
  EXPECT_FALSE(has(r.output, "trace: ")) << r.output;
  EXPECT_EQ(read_all(t), trace);
  EXPECT_EQ(read_all(svg), lane);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(disk.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"filler", "t.json", "t.svg"}));
  EXPECT_EQ(read_all(fs::path(ck) / "latest"), train::step_folder_name(3) + "\n");
  EXPECT_EQ(train::open_checkpoint(ck).step, 3);
}

// The checkpoint directory fills up at the third save (two fit): exit 1 naming the file and the
// cause; step 2 stays `latest` and verifies; the failed save leaves no folder; its step was not
// printed and has no metrics line.
TEST_F(FullDiskCli, AtACheckpointWrite) {
  meshtrain::testing::TmpfsMount disk(tmp.path() / "disk", "25m");  // a gpt-tiny save: 9.6 MiB
  SKIP_UNLESS_MOUNTED(disk);
  const std::string ck = (disk.path() / "ck").string(), m = tmp.file("m.jsonl");
  auto r = run_cli(base() + "--dp 2 --steps 6 --checkpoint-every 1 --checkpoint-dir " + ck + " --metrics " + m);
  ASSERT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "cannot save checkpoint " + ck + "/step_00000003.tmp/")) << r.output;
  EXPECT_TRUE(has(r.output, "No space left on device")) << r.output;
  EXPECT_TRUE(has(r.output, "the latest checkpoint stays step_00000002 in " + ck)) << r.output;
  EXPECT_FALSE(has(r.output, "checkpoint step_00000003 saved")) << r.output;
  EXPECT_FALSE(has(r.output, "3/6 |")) << r.output;
  EXPECT_EQ(read_all(fs::path(ck) / "latest"), "step_00000002\n");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000001", "step_00000002"}));
  EXPECT_NO_THROW(train::verify_checkpoint((fs::path(ck) / "step_00000002").string()));
  EXPECT_EQ(train::open_checkpoint(ck).step, 2);
  EXPECT_EQ(steps_of(metric_lines(m)), one_to(2));
}
