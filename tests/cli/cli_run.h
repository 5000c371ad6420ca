// Runs the built `meshtrain` program for the CLI tests: stdout and stderr together, the exit
// code, and a hang guard (coreutils `timeout`; exit 124 when it fires).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace meshtrain::testing {

struct CliResult {
  int code = -1;  // exit status; -1 when killed by a signal (a crash)
  std::string output;
};

inline std::string meshtrain_binary() { return std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain"; }

// `prefix` goes before the program (e.g. an mpirun line); `args` after it, as a shell would
// split them.
inline CliResult run_cli(const std::string& args, int timeout_s = 120, const std::string& prefix = "") {
  std::string cmd = "timeout --kill-after=10 " + std::to_string(timeout_s) + " " + prefix +
                    (prefix.empty() ? "" : " ") + meshtrain_binary() + " " + args + " 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace meshtrain::testing
