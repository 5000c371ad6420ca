// The job `meshtrain launch` supervises (cli/launch_job.h): its train arguments, the layouts its
// survivors may take, and what its output says.
#include "meshtrain/cli/launch_job.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

namespace meshtrain::cli {

// ---- the train arguments ----
std::optional<std::string> flag_value(const std::vector<std::string>& a, const std::string& flag) {
  std::optional<std::string> v;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == flag && i + 1 < a.size()) v = a[i + 1];
    else if (a[i].rfind(flag + "=", 0) == 0) v = a[i].substr(flag.size() + 1);
  }
  return v;
}
bool has_flag(const std::vector<std::string>& a, const std::string& flag) {
  return std::find(a.begin(), a.end(), flag) != a.end();
}
// Removes every occurrence of `flag` (with its value when `valued`).
void drop_flag(std::vector<std::string>& a, const std::string& flag, bool valued) {
  std::vector<std::string> out;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == flag) {
      if (valued) ++i;
      continue;
    }
    if (valued && a[i].rfind(flag + "=", 0) == 0) continue;
    out.push_back(a[i]);
  }
  a = out;
}
void set_flag(std::vector<std::string>& a, const std::string& flag, const std::string& value) {
  drop_flag(a, flag, true);
  a.push_back(flag);
  a.push_back(value);
}
int int_flag(const std::vector<std::string>& a, const std::string& flag, int otherwise) {
  const auto v = flag_value(a, flag);
  if (!v) return otherwise;
  try {
    return std::stoi(*v);
  } catch (const std::exception&) {
    return otherwise;  // train refuses it in words
  }
}

// The layouts of at most `ranks` ranks for the same global batch, best first (cli/launch.cpp's header):
// the most ranks, then the most tp, then pp, kept. Each is one the model can take by the check
// train and plan share (plan::check_layout): `job` holds the job's other layout settings.
std::vector<Shape> survivors_layouts(int ranks, const Shape& was, const model::ModelSpec& spec, plan::Layout job) {
  std::vector<Shape> out;
  const int chunks = job.chunks;
  for (int w = ranks; w >= 1; --w)
    for (int tp = was.tp; tp >= 1; --tp)
      for (int pp = was.pp; pp >= 1; --pp) {
        if (w % (tp * pp) != 0) continue;
        job.dp = w / (tp * pp), job.tp = tp, job.pp = pp;
        job.chunks = pp > 1 ? chunks : 1;
        job.sequence_parallel = job.sequence_parallel && tp > 1;
        try {
          plan::check_layout(spec, job);
        } catch (const std::invalid_argument&) {
          continue;
        }
        out.push_back({job.dp, tp, pp});
      }
  return out;
}

// Whether a job's exit 2 was train's start-up memory check refusing its layout (train/validate.cpp).
bool refused_for_memory(const std::string& tail) {
  return tail.find("of memory in this process") != std::string::npos;
}

// The world ranks a failed job's output says failed by themselves (cli/launch.cpp's header).
std::vector<int> lost_ranks(const std::string& tail) {
  std::vector<int> lost;
  auto add = [&](int r) {
    if (std::find(lost.begin(), lost.end(), r) == lost.end()) lost.push_back(r);
  };
  // meshtrain's report of a rank's failure: a deadline or a peer's failure names a rank that
  // noticed, not one that failed.
  static const std::regex named(R"(rank (\d+) failed: ([^\n]*))");
  for (std::sregex_iterator it(tail.begin(), tail.end(), named), end; it != end; ++it) {
    const std::string what = (*it)[2].str();
    if (what.find("(timeout)") != std::string::npos || what.find("(peer failed)") != std::string::npos) continue;
    if (what.find("terminated by the launcher") != std::string::npos) continue;
    add(std::stoi((*it)[1].str()));
  }
  // mpirun's word for a process that died of a signal.
  static const std::regex died(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal)");
  for (std::sregex_iterator it(tail.begin(), tail.end(), died), end; it != end; ++it) add(std::stoi((*it)[1].str()));
  std::sort(lost.begin(), lost.end());
  return lost;
}

// mpirun's refusal to start as root (OpenMPI 4: "mpirun has detected an attempt to run as root").
bool mpirun_refused_root(const std::string& tail) {
  return tail.find("has detected an attempt to run as root") != std::string::npos;
}

// The step `latest` names in a checkpoint directory (-1: none).
int64_t latest_step(const std::optional<std::string>& dir) {
  if (!dir) return -1;
  std::ifstream f(std::filesystem::path(*dir) / "latest");
  std::string name;
  if (!(f >> name)) return -1;
  const auto digits = name.find_first_of("0123456789");
  if (digits == std::string::npos) return -1;
  try {
    return std::stoll(name.substr(digits));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace meshtrain::cli
