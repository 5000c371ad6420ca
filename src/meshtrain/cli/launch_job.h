// The job `meshtrain launch` supervises (cli/launch.cpp): reading and rewriting its train
// arguments, the layouts its surviving ranks may take (by the layout check train and plan
// share), and what its output and checkpoint directory say after it ends.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/model/spec.h"
#include "meshtrain/plan/cost.h"

namespace meshtrain::cli {

// ---- the train arguments (`--flag value` or `--flag=value`; the last one given counts) ----
std::optional<std::string> flag_value(const std::vector<std::string>& a, const std::string& flag);
bool has_flag(const std::vector<std::string>& a, const std::string& flag);
// Removes every occurrence of `flag` (with its value when `valued`).
void drop_flag(std::vector<std::string>& a, const std::string& flag, bool valued);
void set_flag(std::vector<std::string>& a, const std::string& flag, const std::string& value);
// The flag's integer value, `otherwise` when absent or unreadable (train refuses it in words).
int int_flag(const std::vector<std::string>& a, const std::string& flag, int otherwise);

struct Shape {
  int dp = 1, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
  std::string str() const {
    return "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
  }
};

// The layouts of at most `ranks` ranks for the same global batch, best first: the most ranks,
// then the most tp, then pp, kept; each passes plan::check_layout with `job`'s other settings.
std::vector<Shape> survivors_layouts(int ranks, const Shape& was, const model::ModelSpec& spec, plan::Layout job);

// ---- what a job's output says ----
// train's start-up memory check refused the layout (its exit 2).
bool refused_for_memory(const std::string& tail);
// The world ranks that failed by themselves: meshtrain's "rank R failed: ..." that is not a
// deadline or a peer's failure, and mpirun's "process rank R ... exited on signal".
std::vector<int> lost_ranks(const std::string& tail);
// mpirun's refusal to start as root.
bool mpirun_refused_root(const std::string& tail);
// The step `latest` names in a checkpoint directory (-1: none).
int64_t latest_step(const std::optional<std::string>& dir);

}  // namespace meshtrain::cli
