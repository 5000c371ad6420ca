// `meshtrain train --comm-timeout` end to end: a worker stuck in computation past the deadline
// (parameter server, --slow-worker) ends the run with exit 1 at the deadline, naming that
// worker, even though its thread is still asleep; bad values of the flag exit 2 naming it.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "temp_dir.h"

namespace {

struct Result {
  int code;
  std::string output;
  double seconds;
};

Result run(const std::string& args) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string cmd = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = pclose(p);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, s};
}

const meshtrain::testing::TempDir& scratch() {
  static meshtrain::testing::TempDir dir("deadline_cli");
  return dir;
}

std::string corpus() {
  std::string p = scratch().file("corpus.txt");
  if (!std::filesystem::exists(p)) {
    std::ofstream f(p);
    for (int i = 0; i < 2000; ++i) f << "to be or not to be, that is the question. ";
  }
  return p;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Worker 0 (rank 0) sleeps 100000 times its step (minutes); the deadline is 2 s. Without the
// watchdog the process would exit only when it wakes.
TEST(DeadlineCli, StuckWorkerEndsTheRunAtTheDeadlineNamingIt) {
  Result r = run("train --model gpt-tiny --data " + corpus() +
                 " --ps-servers 1 --dp 2 --batch 4 --seq 16 --steps 50 --threads 1 --slow-worker 100000"
                 " --comm-timeout 2");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;  // hang guard: deadline 2 s, worker asleep for minutes
  EXPECT_TRUE(has(r.output, "not heard from: [0]")) << r.output;  // worker 0, not the server (rank 2)
  EXPECT_TRUE(has(r.output, "timeout")) << r.output;
}

TEST(DeadlineCli, CommTimeoutMustBePositiveAndFinite) {
  for (const char* bad : {"0", "-1", "nan", "inf", "1e30", "abc"}) {
    Result r = run("train --data " + corpus() + " --steps 1 --comm-timeout " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_TRUE(has(r.output, "--comm-timeout")) << bad << ": " << r.output;
  }
}

TEST(DeadlineCli, CommTimeoutAcceptsSeconds) {
  Result r = run("train --data " + corpus() + " --batch 4 --seq 16 --steps 2 --eval-batches 1 --quiet --comm-timeout 30.5");
  EXPECT_EQ(r.code, 0) << r.output;
}
