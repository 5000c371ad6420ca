// `meshtrain launch [--max-restarts K] [--min-ranks R] [--events FILE] -- train ARGS...`: runs
// `meshtrain train ARGS` as a child process (its ranks threads of that process), watches it, and
// when it fails resumes it on the ranks that survive.
//
//   - SIGINT and SIGTERM go to the child, whose graceful stop (train/stop.h) saves a checkpoint
//     at the next step boundary and exits 0; a second signal stops it at once (128 + signal),
//     and the launcher exits with the child's code.
//   - The child exits 0: done. 2 (bad input): exit 2, a restart would be refused alike.
//   - Any other exit is a failure. The ranks it lost are those its last words name ("rank R
//     failed": the threads backend's report of the first rank that failed); the survivors are
//     the world without them. The launcher picks the largest layout the survivors can hold at
//     the same global batch (so the loss curve stays the single-rank one): the most ranks,
//     keeping tp and pp where they still fit, dp and the micro-batches dividing the batch, tp
//     dividing the heads, pp at most the model's units; and restarts with --resume from the
//     newest checkpoint that verifies (train picks it), or from the start when none was saved.
//     An injected failure (--fail-rank/--fail-at-step, a test flag) is dropped on restart.
//   - --events FILE: one JSON line per event (start, failure with the lost ranks and the
//     checkpoint step resumed from, restart with the new layout, seconds lost, done or give-up).
//   - It gives up with exit 1 and a sentence after K restarts (--max-restarts, default 3) or
//     when fewer than R ranks survive (--min-ranks, default 1); with exit 2 when no layout of
//     the survivors takes the job's global batch (the sentence says what would).
// Bad input (exit 2): no train arguments, --min-ranks above the job's ranks, restarts without
// --checkpoint-dir to resume from.
//
// Limits: threads only (one child process; ranks of an MPI job through mpirun are not
// supervised yet); a lost rank is one the child names, so a child killed from outside (SIGKILL)
// is restarted at the same layout.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/cli/commands.h"
#include "meshtrain/io/file.h"
#include "meshtrain/model/spec.h"

extern char** environ;

namespace meshtrain::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct LaunchArgs {
  int max_restarts = 3;
  int min_ranks = 1;
  std::string events;
  std::vector<std::string> train;  // the arguments after `--` (starting with "train")
};

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

struct Shape {
  int dp = 1, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
  std::string str() const {
    return "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
  }
};

// The largest layout of at most `ranks` ranks for the same global batch (see the header).
std::optional<Shape> survivors_layout(int ranks, const Shape& was, int64_t batch, int micro, int64_t heads,
                                      int64_t units) {
  for (int w = ranks; w >= 1; --w) {
    std::vector<Shape> candidates;
    for (int tp = was.tp; tp >= 1; --tp)
      for (int pp = was.pp; pp >= 1; --pp) {
        if (w % (tp * pp) != 0) continue;
        const int dp = w / (tp * pp);
        if (heads % tp != 0 || pp > units) continue;
        if (batch % (static_cast<int64_t>(dp) * micro) != 0) continue;  // train's rule: dp x micro-batches
        candidates.push_back({dp, tp, pp});
      }
    if (!candidates.empty()) return candidates.front();  // the most tp, then pp, kept
  }
  return std::nullopt;
}

// ---- the child ----
std::atomic<pid_t> g_child{0};
std::atomic<int> g_signals{0};

void forward(int sig) {
  g_signals.fetch_add(1);
  const pid_t c = g_child.load();
  if (c > 0) kill(c, sig);
}

struct ChildResult {
  int code = 0;         // exit code, or 128 + signal
  std::string tail;     // its last stderr bytes
};

// Runs `meshtrain ARGS` with its stdout and stderr passed through; keeps the end of its stderr
// and the moment its stdout first said it resumed ("resumed from") or began (its model line).
struct Started {
  std::optional<Clock::time_point> at;
};

ChildResult run_child(const std::vector<std::string>& args, Started* started) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw std::runtime_error("launch: cannot find its own program (/proc/self/exe)");
  std::vector<std::string> full{self};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : full) argv.push_back(s.data());
  argv.push_back(nullptr);
  int err_pipe[2], out_pipe[2];
  if (pipe(err_pipe) != 0 || pipe(out_pipe) != 0) throw std::runtime_error("launch: cannot make pipes for the child");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_addclose(&fa, err_pipe[0]);
  posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(err_pipe[1]);
  close(out_pipe[1]);
  if (rc != 0) {
    close(err_pipe[0]);
    close(out_pipe[0]);
    throw std::runtime_error("launch: cannot start " + self + " (posix_spawn error " + std::to_string(rc) + ")");
  }
  g_child.store(pid);
  ChildResult r;
  std::thread err_reader([&] {
    char buf[4096];
    ssize_t n;
    while ((n = read(err_pipe[0], buf, sizeof buf)) > 0) {
      fwrite(buf, 1, static_cast<size_t>(n), stderr);
      fflush(stderr);
      r.tail.append(buf, static_cast<size_t>(n));
      if (r.tail.size() > 65536) r.tail.erase(0, r.tail.size() - 65536);
    }
  });
  std::thread out_reader([&] {
    char buf[4096];
    ssize_t n;
    std::string seen;
    while ((n = read(out_pipe[0], buf, sizeof buf)) > 0) {
      fwrite(buf, 1, static_cast<size_t>(n), stdout);
      fflush(stdout);
      if (started && !started->at) {
        seen.append(buf, static_cast<size_t>(n));
        if (seen.find("resumed from") != std::string::npos || seen.find("model ") != std::string::npos)
          started->at = Clock::now();
        if (seen.size() > 65536) seen.erase(0, seen.size() - 4096);
      }
    }
  });
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child.store(0);
  err_reader.join();
  out_reader.join();
  close(err_pipe[0]);
  close(out_pipe[0]);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

class Events {
 public:
  explicit Events(const std::string& path) : path_(path) {
    if (!path_.empty()) std::ofstream(path_, std::ios::trunc);
  }
  void write(nlohmann::json j) {
    j["time_s"] = std::chrono::duration<double>(Clock::now() - start_).count();
    std::printf("launch: %s\n", j.dump().c_str());
    std::fflush(stdout);
    if (path_.empty()) return;
    std::ofstream f(path_, std::ios::app);
    f << j.dump() << "\n";
    f.flush();
    if (!f) throw std::runtime_error("launch: could not write the events file " + path_);
  }

 private:
  std::string path_;
  Clock::time_point start_ = Clock::now();
};

int run_launch(LaunchArgs a) {
  if (a.train.empty() || a.train.front() != "train")
    throw UsageError("launch supervises a training job: give `meshtrain launch [options] -- train ARGS...`");
  std::vector<std::string> args = a.train;
  Shape shape{int_flag(args, "--dp", 1), int_flag(args, "--tp", 1), int_flag(args, "--pp", 1)};
  if (a.min_ranks < 1 || a.min_ranks > shape.world())
    throw UsageError("--min-ranks " + std::to_string(a.min_ranks) + " must be from 1 to the job's " +
                     std::to_string(shape.world()) + " ranks (" + shape.str() + ")");
  if (a.max_restarts < 0) throw UsageError("--max-restarts must be 0 or more");
  const auto dir = flag_value(args, "--checkpoint-dir");
  if (a.max_restarts > 0 && !dir)
    throw UsageError("launch resumes a failed job from its checkpoints: give train --checkpoint-dir DIR "
                     "(or --max-restarts 0 to only supervise)");
  // The model's heads and units bound the layouts the survivors can take.
  int64_t heads = 1, units = 1, batch = 0;
  try {
    const auto cfg = flag_value(args, "--config");
    const auto spec = cfg ? model::model_spec_from_file(*cfg) : model::model_spec(flag_value(args, "--model").value_or("gpt-tiny"));
    heads = spec->gpt() ? spec->gpt()->n_head : 1;
    units = spec->num_units();
    batch = spec->default_batch();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (const auto b = flag_value(args, "--batch")) {
    try {
      batch = std::stoll(*b);
    } catch (const std::exception&) {
      throw UsageError("--batch must be a whole number of samples, not '" + *b + "'");
    }
  }
  const int micro = int_flag(args, "--microbatches", 1);

  struct sigaction sa {};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  Events events(a.events);
  events.write({{"event", "start"}, {"layout", shape.str()}, {"args", args}});
  if (const auto every_s = flag_value(args, "--checkpoint-every-s"))
    std::printf("launch: checkpoints every %s s: a failure loses about half that on average, plus the restart "
                "(measured at each restart: the events' restart_s)\n",
                every_s->c_str());
  int restarts = 0;
  std::optional<Clock::time_point> restart_at;  // set while a restarted child has not yet begun its steps
  for (;;) {
    const auto t0 = Clock::now();
    Started started;
    const ChildResult r = run_child(args, &started);
    if (restart_at && started.at)  // the restart's cost: from the failure until the job resumed
      events.write({{"event", "resumed"}, {"restart_s", std::chrono::duration<double>(*started.at - *restart_at).count()}});
    restart_at.reset();
    if (r.code == 0 || r.code == 2 || g_signals.load() > 0) {
      events.write({{"event", r.code == 0 ? "done" : "exit"}, {"code", r.code}, {"layout", shape.str()}});
      return r.code;
    }
    // A failure: which ranks it names, and where it can resume.
    std::vector<int> lost;
    static const std::regex named(R"(rank (\d+) failed)");
    for (std::sregex_iterator it(r.tail.begin(), r.tail.end(), named), end; it != end; ++it) {
      const int rank = std::stoi((*it)[1].str());
      if (std::find(lost.begin(), lost.end(), rank) == lost.end()) lost.push_back(rank);
    }
    std::string resumed = "none (from the start)";
    // The work the failure loses: the time since the checkpoint it resumes from was committed
    // (`latest` written), or since the child started when there is none.
    double work_lost_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dir) {
      const auto latest_path = std::filesystem::path(*dir) / "latest";
      std::ifstream latest(latest_path);
      std::string step;
      if (latest >> step) {
        resumed = step;
        std::error_code ec;
        const auto written = std::filesystem::last_write_time(latest_path, ec);
        if (!ec)
          work_lost_s = std::max(0.0, std::chrono::duration<double>(std::filesystem::file_time_type::clock::now() - written).count());
      }
    }
    const auto failed_at = Clock::now();
    const double run_s = std::chrono::duration<double>(failed_at - t0).count();
    events.write({{"event", "failure"}, {"code", r.code}, {"lost_ranks", lost}, {"layout", shape.str()},
                  {"checkpoint", resumed}, {"seconds_run", run_s}, {"work_lost_s", work_lost_s}});
    if (restarts >= a.max_restarts) {
      events.write({{"event", "give_up"}, {"reason", "restarts"}});
      std::fprintf(stderr, "launch: the job failed %d time(s) and --max-restarts is %d; giving up (the last "
                           "checkpoint stays in %s)\n",
                   restarts + 1, a.max_restarts, dir ? dir->c_str() : "no directory");
      return 1;
    }
    const int survivors = shape.world() - static_cast<int>(lost.size());
    if (survivors < a.min_ranks) {
      events.write({{"event", "give_up"}, {"reason", "min_ranks"}, {"survivors", survivors}});
      std::fprintf(stderr, "launch: %d rank(s) survive, fewer than --min-ranks %d; giving up\n", survivors, a.min_ranks);
      return 1;
    }
    const auto next = survivors_layout(survivors, shape, batch, micro, heads, units);
    if (!next) {
      events.write({{"event", "give_up"}, {"reason", "no_layout"}, {"survivors", survivors}});
      std::fprintf(stderr, "launch: no layout of at most %d rank(s) takes the global batch %lld with %d micro-batches; "
                           "giving up (a batch divisible by more rank counts would let it go on)\n",
                   survivors, static_cast<long long>(batch), micro);
      return 2;  // the job's batch, not the machine, stops it: what to change is said
    }
    shape = *next;
    set_flag(args, "--dp", std::to_string(shape.dp));
    set_flag(args, "--tp", std::to_string(shape.tp));
    set_flag(args, "--pp", std::to_string(shape.pp));
    if (shape.pp == 1) drop_flag(args, "--schedule", true);
    drop_flag(args, "--fail-rank", true);
    drop_flag(args, "--fail-at-step", true);
    if (resumed != "none (from the start)" && !has_flag(args, "--resume")) args.push_back("--resume");
    ++restarts;
    events.write({{"event", "restart"}, {"restart", restarts}, {"layout", shape.str()}, {"survivors", survivors},
                  {"from", resumed}});
    restart_at = failed_at;
  }
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  CLI::App* c = app.add_subcommand(
      "launch", "Run `meshtrain train` as a supervised child; resume a failed job on the surviving ranks");
  c->add_option("--max-restarts", a->max_restarts, "Give up after this many restarts")->capture_default_str();
  c->add_option("--min-ranks", a->min_ranks, "Give up when fewer ranks than this survive")->capture_default_str();
  c->add_option("--events", a->events, "Write one JSON line per event (failure, restart, done) to this file");
  c->add_option("train", a->train, "-- train ARGS...: the job")->expected(-1);
  c->callback([a] {
    const int code = run_launch(*a);
    if (code != 0) throw LaunchExit(code);
  });
}

}  // namespace meshtrain::cli
