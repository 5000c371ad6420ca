// `meshtrain launch [--np N | --hosts FILE] [--max-restarts K] [--min-ranks R] [--grow]
// [--events FILE] -- train ARGS...`: runs `meshtrain train ARGS`, watches it, and when it fails
// resumes it on the ranks and hosts that survive (docs/launch.md).
//
//   - Where the ranks run. With neither --np nor --hosts, as threads of one child process (as
//     `train` runs them). With --np N, as N MPI processes of this machine, and with --hosts FILE
//     (OpenMPI's hostfile syntax: a host name per line, `slots=N`) as MPI processes across those
//     hosts: the child is then OpenMPI's mpirun (--mpirun), given the hosts and slots, and
//     mpirun's own settings come from its environment (OMPI_MCA_*).
//   - SIGINT and SIGTERM stop the job gracefully: the threads child gets the signal, an MPI job
//     SIGUSR1 (mpirun passes it on to every rank); train saves a checkpoint at the next step
//     boundary and exits 0. A second signal stops it at once (the threads child gets it again,
//     mpirun a SIGTERM), and the launcher exits with the child's code.
//   - The child exits 0: done. 2 (bad input): exit 2, a restart would be refused alike.
//   - Any other exit is a failure. The ranks lost are those that failed by themselves (the job's
//     "rank R failed: ..." that is not a deadline or a peer's failure, or mpirun's "process
//     rank R ... exited on signal"), and every rank of a host that no longer answers (each host
//     is asked with a one-process mpirun, under --probe-timeout-s). Their slots are held back.
//     The launcher picks the largest layout the remaining slots hold at the same global batch
//     (so the loss curve stays the single-rank one): the most ranks, keeping tp and pp where
//     they still fit, each a layout the model takes by the check train and plan share
//     (plan::check_layout: dp and the micro-batches dividing the batch, tp splitting the model's
//     layers, pp at most its units); and restarts with --resume from the newest checkpoint that
//     verifies (train picks it), or from the start when none was saved; when train's start-up
//     memory check refuses that layout, the next one of the list. An injected failure
//     (--fail-rank/--fail-at-step, a test flag) is dropped on restart.
//   - A job whose steps stop coming (world rank 0 touches the launcher's status file after each
//     step) for --stall-timeout-s seconds, or for 10 times its longest gap between steps if
//     that is longer, is stalled: a process stopped, or one rank alone waiting where no peer's
//     deadline can notice. The launcher ends it and it counts as a failure with no rank lost
//     (a restart at the same layout), the event saying "stalled".
//   - --grow: while the job runs smaller than it started, a lost host that answers again (or a
//     host added to the hosts file) and the slot of a rank that failed on a host that still
//     answers (once the job has committed a checkpoint since) are taken back: the job is
//     stopped at its next step boundary, where it writes a checkpoint, and resumed at the
//     larger layout.
//   - --events FILE: one JSON line per event (start, failure with the lost ranks and hosts and
//     the checkpoint resumed from, restart with the new layout and hosts, resumed with the
//     restart's seconds, grow, done or give-up). Planned through the output policy
//     (train/outputs.h) before anything runs: never the job's --data, --config, --metrics or
//     --trace, never a name its checkpoint directory manages, and an existing file that is not
//     an events file only with --overwrite. A write that fails names the file and the cause.
//   - A failure that would repeat is not retried: mpirun's refusal to run as root (refused up
//     front when this process is root and OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) are not 1), and a
//     job that failed before its first step with the same output as the attempt before: exit 2.
//   - What the launcher made goes when it ends, whatever the exit: the status file (and a
//     temporary one a killed job left), and the checkpoint directory it created when the job
//     never began its steps and left nothing there.
//   - It gives up with exit 1 and a sentence after K restarts (--max-restarts, default 3) or
//     when fewer than R ranks survive (--min-ranks, default 1); with exit 2 when no layout of
//     the survivors takes the job's global batch (the sentence says what would).
// Bad input (exit 2): no train arguments, a number that is not finite or out of range (--np
// and --min-ranks at least 1, the seconds above 0 and at most a week), --min-ranks above the
// job's ranks, restarts without --checkpoint-dir to resume from, --np and --hosts together,
// --np unlike the job's ranks, a hosts file that does not parse or names no host, fewer slots
// than the job's ranks, an --events path the output policy refuses, mpirun as root without
// its permission.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/launch_hosts.h"
#include "meshtrain/cli/launch_job.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/io/file.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/plan/cost.h"
#include "meshtrain/train/outputs.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::cli {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr double kWeekS = 604'800;

struct LaunchArgs {
  int max_restarts = 3;
  int min_ranks = 1;
  int np = 0;  // 0: not given (a given --np is at least 1)
  int max_ranks = 0;  // 0: the job's ranks, or with --grow every usable slot
  std::string hosts_file;
  std::string mpirun = "mpirun";
  bool grow = false;
  double probe_every_s = 5;
  double probe_timeout_s = 30;
  double stall_timeout_s = 600;  // 0: never
  std::string events;
  bool overwrite = false;  // --events may replace a file meshtrain did not write
  std::vector<std::string> train;  // the arguments after `--` (starting with "train")
};

std::atomic<pid_t> g_child{0};
std::atomic<bool> g_child_is_mpirun{false};
std::atomic<int> g_signals{0};

// The first signal stops the job gracefully, a later one at once (see the header).
void forward(int sig) {
  const int n = g_signals.fetch_add(1) + 1;
  const pid_t c = g_child.load();
  if (c <= 0) return;
  if (g_child_is_mpirun.load()) kill(c, n == 1 ? SIGUSR1 : SIGTERM);
  else kill(c, sig);
}

struct ChildResult {
  int code = 0;          // exit code, or 128 + signal
  std::string tail;      // its last stderr bytes
  std::string out_tail;  // its last stdout bytes
  double stalled_s = 0;  // > 0: ended by the launcher after this many seconds without a step
};

// Runs the job with its stdout and stderr passed through and keeps the end of both; sets
// `started` (and calls on_start) when world rank 0 writes the status file (train/trainer.h:
// its steps began). Then watches the file's heartbeat (rank 0 touches it after every step):
// no step for `stall_s` seconds, or for 10 times the longest gap between steps seen if that is
// longer, and the job is stalled (a process stopped, a rank waiting on nothing that a deadline
// would catch: one rank alone): it is ended (a threads child SIGKILL, mpirun SIGTERM, which
// ends its ranks, then SIGKILL after 10 s) and counts as a failure. 0: never.
ChildResult run_child(const std::string& program, const std::vector<std::string>& args, bool mpirun,
                      const std::string& status_file, double stall_s, std::atomic<bool>* started,
                      const std::function<void()>& on_start) {
  std::error_code ec;
  std::filesystem::remove(status_file, ec);
  const Spawned p = spawn(program, args, /*capture=*/true);
  g_child_is_mpirun.store(mpirun);
  g_child.store(p.pid);
  if (g_signals.load() > 0) kill(p.pid, mpirun ? SIGUSR1 : SIGTERM);  // a stop asked while it started
  ChildResult r;
  std::thread err_reader([&] { pass_through(p.err, stderr, r.tail, 65536); });
  std::thread out_reader([&] { pass_through(p.out, stdout, r.out_tail, 8192); });
  std::atomic<bool> ended{false};
  std::thread start_watch([&] {
    std::optional<std::filesystem::file_time_type> beat;  // the heartbeat last seen
    Clock::time_point beat_at, killed_at;
    double longest = 0;
    bool killed = false, forced = false;
    while (!ended.load()) {
      std::error_code e;
      const auto t = std::filesystem::last_write_time(status_file, e);
      const auto now = Clock::now();
      if (!e && !beat) {
        started->store(true);
        on_start();
        beat = t, beat_at = now;
      } else if (!e && t != *beat) {
        longest = std::max(longest, std::chrono::duration<double>(now - beat_at).count());
        beat = t, beat_at = now;
      } else if (beat && stall_s > 0 && !killed) {
        const double quiet = std::chrono::duration<double>(now - beat_at).count();
        if (quiet > std::max(stall_s, 10 * longest)) {
          std::fprintf(stderr,
                       "launch: no step for %.1f s (--stall-timeout-s %g; the longest gap between steps so far "
                       "%.2f s): the job is stalled; ending it, to restart from its last checkpoint\n",
                       quiet, stall_s, longest);
          r.stalled_s = quiet;
          killed = true, killed_at = now;
          if (mpirun) kill(p.pid, SIGTERM);
          else kill(-p.pid, SIGKILL);
        }
      } else if (killed && mpirun && !forced && now - killed_at > std::chrono::seconds(10)) {
        kill(-p.pid, SIGKILL);  // mpirun did not end its ranks in time
        forced = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(beat ? 100 : 20));
    }
  });
  r.code = wait_code(p.pid);
  ended.store(true);
  start_watch.join();
  g_child.store(0);
  err_reader.join();
  out_reader.join();
  close(p.err);
  close(p.out);
  return r;
}

// The events, printed and (--events) appended to the file, each line whole (io::AppendFile).
// A write that fails (a full disk) is said at once, naming the file and the cause; the job
// goes on supervised, later events are only printed, and close() throws the error so that the
// launcher exits 1 (a write may come from a watching thread, which must not throw).
class Events {
 public:
  explicit Events(const std::string& path) {
    if (!path.empty()) file_.emplace(path, /*truncate=*/true, "events file");
  }
  void write(nlohmann::json j) {  // from the launcher's threads: one line at a time
    std::lock_guard g(m_);
    j["time_s"] = std::chrono::duration<double>(Clock::now() - start_).count();
    std::printf("launch: %s\n", j.dump().c_str());
    std::fflush(stdout);
    if (!file_ || error_) return;
    try {
      file_->append(j.dump() + "\n");
    } catch (const io::WriteError& e) {
      error_ = e.what();
      std::fprintf(stderr, "launch: %s; later events are printed only\n", e.what());
    }
  }
  // Closes the file; throws io::WriteError when a write failed.
  void close() {
    std::lock_guard g(m_);
    if (file_ && !error_) try {
        file_->close();
      } catch (const io::WriteError& e) {
        error_ = e.what();
      }
    if (error_) throw io::WriteError(*error_);
  }

 private:
  std::optional<io::AppendFile> file_;
  std::optional<std::string> error_;
  Clock::time_point start_ = Clock::now();
  std::mutex m_;
};

class Launcher {
 public:
  explicit Launcher(LaunchArgs a) : a_(std::move(a)) {}

  int run() {
    if (a_.train.empty() || a_.train.front() != "train")
      throw UsageError("launch supervises a training job: give `meshtrain launch [options] -- train ARGS...`");
    args_ = a_.train;
    shape_ = {int_flag(args_, "--dp", 1), int_flag(args_, "--tp", 1), int_flag(args_, "--pp", 1)};
    check_args();
    check_paths();
    // From here on the launcher makes files: they go again on every way out.
    struct Cleanup {
      Launcher* l;
      ~Cleanup() { l->clean_up(); }
    } cleanup{this};
    set_up_hosts();

    struct sigaction sa {};
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    Events events(a_.events);
    events_ = &events;
    nlohmann::json start = {{"event", "start"}, {"layout", shape_.str()}, {"args", args_}};
    if (mpi()) start["hosts"] = hosts_text(hosts_, shape_.world());
    events.write(start);
    if (const auto every_s = flag_value(args_, "--checkpoint-every-s")) {
      try {
        every_s_ = std::stod(*every_s);
      } catch (const std::exception&) {
      }  // train refuses it in words
      std::printf("launch: checkpoints every %s s: a failure loses about half that on average, plus the restart "
                  "(measured at each restart)\n",
                  every_s->c_str());
    }
    const int code = loop();
    // A failed write of the events file (said when it happened, naming the file and the cause)
    // turns a success into exit 1; a job's own failure keeps its code.
    if (code == 0) events.close();
    return code;
  }

 private:
  bool mpi() const { return !hosts_.empty(); }
  bool probed() const { return !a_.hosts_file.empty(); }  // --np runs on this machine, which answers

  void check_args() {
    if (a_.min_ranks < 1 || a_.min_ranks > shape_.world())
      throw UsageError("--min-ranks " + std::to_string(a_.min_ranks) + " must be from 1 to the job's " +
                       std::to_string(shape_.world()) + " ranks (" + shape_.str() + ")");
    if (a_.max_restarts < 0) throw UsageError("--max-restarts must be 0 or more");
    if (a_.np != 0 && !a_.hosts_file.empty())
      throw UsageError("give --np N (processes on this machine) or --hosts FILE (processes across hosts), not both");
    if (a_.np < 0) throw UsageError("--np must be at least 1");
    if (a_.max_ranks < 0 || (a_.max_ranks > 0 && a_.max_ranks < shape_.world()))
      throw UsageError("--max-ranks " + std::to_string(a_.max_ranks) + " is below the job's " +
                       std::to_string(shape_.world()) + " ranks (" + shape_.str() + "): give at least that many, or 0 for no bound");
    if (a_.np > 0 && a_.np != shape_.world())
      throw UsageError("--np " + std::to_string(a_.np) + " differs from the job's " + std::to_string(shape_.world()) +
                       " ranks (" + shape_.str() + "): give train --dp/--tp/--pp whose product is " + std::to_string(a_.np));
    if (a_.probe_every_s <= 0 || a_.probe_timeout_s <= 0)
      throw UsageError("--probe-every-s and --probe-timeout-s must be above 0 seconds");
    if (!(a_.stall_timeout_s >= 0))
      throw UsageError("--stall-timeout-s must be 0 (never) or a number of seconds above 0");
    dir_ = flag_value(args_, "--checkpoint-dir");
    if ((a_.max_restarts > 0 || a_.grow) && !dir_)
      throw UsageError("launch resumes a job from its checkpoints: give train --checkpoint-dir DIR "
                       "(or --max-restarts 0 without --grow to only supervise)");
    // The model bounds the layouts the survivors can take (job_layout, survivors_layouts).
    try {
      const auto cfg = flag_value(args_, "--config");
      const auto spec = cfg ? model::model_spec_from_file(*cfg)
                            : model::model_spec(flag_value(args_, "--model").value_or("gpt-tiny"));
      spec_ = spec;
      batch_ = spec->default_batch();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (const auto b = flag_value(args_, "--batch")) {
      try {
        batch_ = std::stoll(*b);
      } catch (const std::exception&) {
        throw UsageError("--batch must be a whole number of samples, not '" + *b + "'");
      }
    }
    micro_ = int_flag(args_, "--microbatches", 1);
  }

  // The job's layout settings other than dp, tp and pp, for the survivors' layouts.
  plan::Layout job_layout() const {
    plan::Layout l;
    l.batch = batch_, l.microbatches = micro_;
    l.chunks = int_flag(args_, "--chunks", 1);
    l.seq = spec_->gpt() ? int_flag(args_, "--seq", static_cast<int>(spec_->default_seq())) : 1;
    l.sequence_parallel = has_flag(args_, "--sequence-parallel");
    l.pad_vocab = has_flag(args_, "--pad-vocab");
    l.zero = int_flag(args_, "--zero", 0);
    return l;
  }

  // --events through the output policy (train/outputs.h), with the job's own paths around it:
  // it must not be the job's input, one of its outputs or a name its checkpoint directory
  // manages. The job's outputs are side files here: whether they may be replaced is train's
  // own check (its --overwrite). The directory is planned as train plans it, also on --resume
  // (its restarts all resume): a save manages `latest` and step_*, nothing else in it.
  void check_paths() const {
    try {
      train::PathPlan plan(a_.overwrite);
      if (const auto d = flag_value(args_, "--data")) plan.input_file("the job's --data", *d);
      if (const auto c = flag_value(args_, "--config")) plan.input_file("the job's --config", *c);
      if (dir_) plan.output_checkpoint_dir("the job's --checkpoint-dir", *dir_);
      if (const auto m = flag_value(args_, "--metrics")) plan.side_file("the job's --metrics", *m);
      if (const auto t = flag_value(args_, "--trace")) {
        plan.side_file("the job's --trace", *t);
        plan.side_file("the job's swimlane", train::trace_svg_path(*t));
      }
      if (!a_.events.empty()) plan.output_file("--events", a_.events, train::OutputKind::events);
      plan.check();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }

  // OpenMPI's mpirun will not start as root without its permission, and a restart would meet
  // the same refusal: said before anything runs. A --mpirun of another name may be a wrapper
  // that adds --allow-run-as-root; its refusal, if any, is caught in the job's output (loop).
  void check_mpirun_as_root() const {
    if (a_.np == 0 && a_.hosts_file.empty()) return;
    const std::string name = fs::path(a_.mpirun).filename().string();
    if (geteuid() != 0 || (name != "mpirun" && name != "mpiexec" && name != "orterun")) return;
    auto one = [](const char* var) {
      const char* v = std::getenv(var);
      return v != nullptr && std::string(v) == "1";
    };
    if (one("OMPI_ALLOW_RUN_AS_ROOT") && one("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")) return;
    throw UsageError(kRootAdvice);
  }
  static constexpr const char* kRootAdvice =
      "this process runs as root, and OpenMPI's mpirun refuses to start as root unless told: set "
      "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, or give --mpirun a wrapper that adds "
      "--allow-run-as-root, or run as another user";

  // Removes what the launcher made (see the header): the status file, the temporary file of a
  // job killed while writing it (io::write_file_atomic: .NAME.PID.N.tmp), and the checkpoint
  // directory it created, folder by folder up to the first it made, when no job ever began its
  // steps and each is empty.
  void clean_up() noexcept {
    std::error_code ec;
    if (!status_file_.empty()) {
      fs::remove(status_file_, ec);
      const fs::path status(status_file_);
      const std::string prefix = "." + status.filename().string() + ".";
      for (auto it = fs::directory_iterator(status.parent_path(), ec); !ec && it != fs::directory_iterator();
           it.increment(ec)) {
        const std::string n = it->path().filename().string();
        if (n.starts_with(prefix) && n.ends_with(".tmp")) fs::remove(it->path(), ec);
      }
    }
    if (made_dir_.empty() || ever_started_.load()) return;
    for (fs::path p = made_leaf_;; p = p.parent_path()) {
      if (!fs::is_directory(p, ec) || !fs::is_empty(p, ec) || !fs::remove(p, ec)) return;
      if (p == made_dir_ || p == p.parent_path()) return;
    }
  }

  void set_up_hosts() {
    if (!a_.hosts_file.empty()) {
      hosts_ = read_hosts(a_.hosts_file);
      this_machine_first(hosts_);
      int slots = 0;
      for (const Host& h : hosts_) slots += h.slots;
      if (slots < shape_.world())
        throw UsageError("the hosts file '" + a_.hosts_file + "' gives " + std::to_string(slots) + " slot(s), fewer than the job's " +
                         std::to_string(shape_.world()) + " ranks (" + shape_.str() + "): add hosts or slots, or ask for fewer ranks");
    } else if (a_.np > 0) {
      hosts_ = {Host{"localhost", a_.np}};
    } else {
      threads_ = Host{"threads", shape_.world()};
    }
    check_mpirun_as_root();  // after the hosts file's own faults, before anything is made
    if (mpi()) set_flag(args_, "--backend", "mpi");
    world0_ = shape_.world();
    // The job's status file (train/trainer.h), where world rank 0 can write it: the checkpoint
    // directory, which every rank of a job across hosts shares; else beside the launcher.
    const std::string name = ".launch-status-" + std::to_string(getpid());
    status_file_ = dir_ ? (std::filesystem::path(*dir_) / name).string()
                        : (std::filesystem::temp_directory_path() / ("meshtrain" + name)).string();
    if (dir_) {
      // train makes it too; the launcher polls in it first. The folders it makes here are
      // removed again when the job never begins its steps (clean_up).
      std::error_code ec;
      fs::path leaf = fs::absolute(*dir_, ec).lexically_normal();
      if (leaf.filename().empty()) leaf = leaf.parent_path();
      fs::path top;
      for (fs::path p = leaf; !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
        top = p;
        if (p == p.parent_path()) break;
      }
      fs::create_directories(leaf, ec);
      if (!ec && !top.empty()) made_dir_ = top, made_leaf_ = leaf;
    }
    setenv("MESHTRAIN_LAUNCH_STATUS", status_file_.c_str(), 1);
  }

  // The program and arguments that run the job at the current layout.
  std::pair<std::string, std::vector<std::string>> command() {
    std::error_code ec;
    std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) throw std::runtime_error("launch: cannot find its own program (/proc/self/exe)");
    // The program's file replaced since it started (a rebuild during a long job): a threads
    // child runs this very program still (/proc/self/exe opens it); mpirun needs a path the
    // hosts can run, which now holds the new build.
    if (const std::string gone = " (deleted)"; self.size() > gone.size() && self.ends_with(gone)) {
      if (!mpi()) return {"/proc/self/exe", args_};
      self.resize(self.size() - gone.size());
    }
    if (!mpi()) return {self, args_};
    // Ranks fill the usable slots host by host, as --map-by slot places them; remember which
    // host each rank is on, to know which slot a failed rank held.
    rank_host_.clear();
    for (size_t h = 0; h < hosts_.size() && static_cast<int>(rank_host_.size()) < shape_.world(); ++h)
      for (int s = 0; s < hosts_[h].usable() && static_cast<int>(rank_host_.size()) < shape_.world(); ++s)
        rank_host_.push_back(static_cast<int>(h));
    std::vector<std::string> cmd{"--host", hosts_text(hosts_, shape_.world()), "-np", std::to_string(shape_.world()), "--map-by", "slot",
                                 "-x", "MESHTRAIN_LAUNCH_STATUS", self};
    cmd.insert(cmd.end(), args_.begin(), args_.end());
    return {a_.mpirun, cmd};
  }

  int total_capacity() const { return mpi() ? capacity(hosts_) : threads_.usable(); }
  // The most ranks the job may take: --max-ranks, else its own at the start, or with --grow
  // every usable slot.
  int limit() const { return a_.max_ranks > 0 ? a_.max_ranks : a_.grow ? INT_MAX : world0_; }

  // --grow's watch while the job runs (see the header); sets grow_to_ when it asked the job to stop.
  void watch(std::atomic<bool>& done, std::atomic<bool>& started, int64_t resumed_step) {
    std::unique_lock lk(watch_m_);
    while (!done.load()) {
      watch_cv_.wait_for(lk, std::chrono::duration<double>(a_.probe_every_s), [&] { return done.load(); });
      if (done.load() || !started.load()) continue;
      std::vector<std::string> back;
      // Slots held back after their rank failed: taken back once a checkpoint was committed since.
      const bool committed_since = latest_step(dir_) > resumed_step;
      auto take_held = [&](Host& h) {
        if (h.held > 0 && h.up && committed_since) {
          back.push_back(h.name + " (" + std::to_string(h.held) + " slot(s))");
          h.held = 0;
        }
      };
      if (mpi())
        for (Host& h : hosts_) take_held(h);
      else
        take_held(threads_);
      if (probed()) {
        try {  // hosts added to the file since
          for (const Host& h : read_hosts(a_.hosts_file))
            if (std::none_of(hosts_.begin(), hosts_.end(), [&](const Host& o) { return o.name == h.name; })) {
              Host n = h;
              n.up = false;
              hosts_.push_back(n);
            }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "launch: the hosts file now reads wrong, kept the hosts it named before (%s)\n", e.what());
        }
        std::vector<std::string> down;
        for (const Host& h : hosts_)
          if (!h.up) down.push_back(h.name);
        if (!down.empty()) {
          lk.unlock();
          const auto ok = probe_all(a_.mpirun, down, a_.probe_timeout_s);
          lk.lock();
          for (size_t i = 0; i < down.size(); ++i)
            if (ok[i])
              for (Host& h : hosts_)
                if (h.name == down[i]) h.up = true, back.push_back(h.name);
        }
      }
      if (back.empty()) continue;
      const auto layouts = survivors_layouts(std::min(total_capacity(), limit()), shape_, *spec_, job_layout());
      if (layouts.empty() || layouts.front().world() <= shape_.world()) continue;
      const Shape* bigger = &layouts.front();
      grow_to_ = *bigger;
      candidates_ = layouts;
      candidate_ = 0;
      grow_asked_at_ = Clock::now();
      const pid_t c = g_child.load();
      if (c > 0) kill(c, mpi() ? SIGUSR1 : SIGTERM);  // the graceful stop: a checkpoint at the next step boundary
      events_->write({{"event", "grow"}, {"back", back}, {"layout", bigger->str()}, {"at_step", latest_step(dir_)}});
      return;
    }
  }

  void relayout(const Shape& next) {
    shape_ = next;
    set_flag(args_, "--dp", std::to_string(shape_.dp));
    set_flag(args_, "--tp", std::to_string(shape_.tp));
    set_flag(args_, "--pp", std::to_string(shape_.pp));
    // At pp 1 a schedule means nothing, except pipedream-2bw's: its single-rank reference keeps
    // the run on the same (asynchronous) recurrence.
    if (shape_.pp == 1 && flag_value(args_, "--schedule") != std::optional<std::string>("pipedream-2bw"))
      drop_flag(args_, "--schedule", true);
    drop_flag(args_, "--fail-rank", true);
    drop_flag(args_, "--fail-at-step", true);
  }

  int loop() {
    int restarts = 0;
    std::optional<Clock::time_point> restart_at;  // set while a restarted child has not yet begun its steps
    int64_t resumed_step = latest_step(dir_);
    for (;;) {
      const auto t0 = Clock::now();
      std::atomic<bool> started{false}, done{false};
      // The restart's cost: from the failure (or the stop for --grow) until the job said it resumed.
      auto on_start = [&] {
        ever_started_.store(true);
        if (!restart_at) return;
        const double restart_s = std::chrono::duration<double>(Clock::now() - *restart_at).count();
        events_->write({{"event", "resumed"}, {"restart_s", restart_s}, {"layout", shape_.str()}});
        if (every_s_ > 0)
          std::printf("launch: expected work lost per failure: %.1f s (half the %g s between checkpoints) + %.2f s "
                      "(this restart, measured) = %.1f s\n",
                      every_s_ / 2, every_s_, restart_s, every_s_ / 2 + restart_s);
      };
      grow_to_.reset();
      std::thread watcher;
      if (a_.grow) watcher = std::thread([&] { watch(done, started, resumed_step); });
      const auto [program, cmd] = command();
      ChildResult r;
      try {
        r = run_child(program, cmd, mpi(), status_file_, a_.stall_timeout_s, &started, on_start);
      } catch (...) {
        done.store(true);
        watch_cv_.notify_all();
        if (watcher.joinable()) watcher.join();
        throw;
      }
      done.store(true);
      watch_cv_.notify_all();
      if (watcher.joinable()) watcher.join();
      restart_at.reset();
      // Stopped for --grow (not finished while the stop was on its way): on at the larger layout.
      if (r.code == 0 && grow_to_ && g_signals.load() == 0 && r.out_tail.find("stopped at step") != std::string::npos) {
        const Shape was = shape_;
        relayout(*grow_to_);
        if (!has_flag(args_, "--resume")) args_.push_back("--resume");
        resumed_step = latest_step(dir_);
        nlohmann::json ev = {{"event", "restart"}, {"reason", "grow"}, {"from_layout", was.str()}, {"layout", shape_.str()},
                             {"from", "step_" + std::string(8 - std::min<size_t>(8, std::to_string(resumed_step).size()), '0') +
                                          std::to_string(resumed_step)},
                             {"from_step", resumed_step}};
        if (mpi()) ev["hosts"] = hosts_text(hosts_, shape_.world());
        events_->write(ev);
        restart_at = grow_asked_at_;  // its cost counts from the stop it asked
        continue;
      }
      // A restart at a layout that train's start-up memory check refuses: the next one that may
      // fit (threads: fewer ranks in the process; any: more tp or pp to shard the model).
      if (r.code == 2 && refused_for_memory(r.tail) && g_signals.load() == 0 && candidate_ + 1 < candidates_.size()) {
        const Shape refused = shape_;
        relayout(candidates_[++candidate_]);
        events_->write({{"event", "refused"}, {"layout", refused.str()}, {"reason", "memory"}, {"next", shape_.str()}});
        restart_at = Clock::now();
        continue;
      }
      if (r.code == 0 || r.code == 2 || g_signals.load() > 0) {
        events_->write({{"event", r.code == 0 ? "done" : "exit"}, {"code", r.code}, {"layout", shape_.str()}});
        return r.code;
      }
      // A failure: which ranks failed, which hosts still answer, and where it can resume.
      const auto failed_at = Clock::now();
      const auto failed_at_file = std::filesystem::file_time_type::clock::now();
      const std::vector<int> lost = lost_ranks(r.tail);
      std::vector<std::string> lost_hosts;
      for (int rank : lost) {
        if (!mpi()) ++threads_.held;
        else if (rank >= 0 && rank < static_cast<int>(rank_host_.size())) ++hosts_[rank_host_[rank]].held;
      }
      if (probed()) {
        std::vector<std::string> names;
        for (const Host& h : hosts_)
          if (h.up) names.push_back(h.name);
        const auto ok = probe_all(a_.mpirun, names, a_.probe_timeout_s);
        for (size_t i = 0; i < names.size(); ++i)
          if (!ok[i])
            for (Host& h : hosts_)
              if (h.name == names[i]) h.up = false, h.held = 0, lost_hosts.push_back(h.name);
      }
      const double probe_s = std::chrono::duration<double>(Clock::now() - failed_at).count();
      std::string resumed = "none (from the start)";
      // The work the failure loses: from the commit of the checkpoint it resumes from (`latest`
      // written), or the child's start when there is none, until the job ended.
      double work_lost_s = std::chrono::duration<double>(failed_at - t0).count();
      if (dir_) {
        const auto latest_path = std::filesystem::path(*dir_) / "latest";
        std::ifstream latest(latest_path);
        std::string step;
        if (latest >> step) {
          resumed = step;
          std::error_code ec;
          const auto written = std::filesystem::last_write_time(latest_path, ec);
          if (!ec)
            work_lost_s = std::max(0.0, std::chrono::duration<double>(failed_at_file - written).count());
        }
      }
      const double run_s = std::chrono::duration<double>(failed_at - t0).count();
      nlohmann::json fail = {{"event", "failure"}, {"reason", r.stalled_s > 0 ? "stalled" : "exited"}, {"code", r.code},
                             {"lost_ranks", lost}, {"layout", shape_.str()}, {"checkpoint", resumed},
                             {"seconds_run", run_s}, {"work_lost_s", work_lost_s}};
      if (r.stalled_s > 0) fail["stalled_s"] = r.stalled_s;
      if (probed()) fail["lost_hosts"] = lost_hosts, fail["probe_s"] = probe_s;
      events_->write(fail);
      // A failure that will repeat (see the header): said once, not retried.
      if (!started.load()) {
        if (mpi() && mpirun_refused_root(r.tail)) {
          events_->write({{"event", "give_up"}, {"reason", "mpirun_root"}});
          std::fprintf(stderr, "launch: mpirun refused to start the job: %s\n", kRootAdvice);
          return 2;
        }
        const std::string output = r.tail + r.out_tail;
        if (unstarted_output_ && *unstarted_output_ == output) {
          events_->write({{"event", "give_up"}, {"reason", "same_failure"}});
          std::fprintf(stderr, "launch: the job failed again before its first step with the same output (exit %d); "
                               "a restart would fail alike: giving up (its output above says what to fix)\n",
                       r.code);
          return 2;
        }
        unstarted_output_ = output;
      } else {
        unstarted_output_.reset();
      }
      if (restarts >= a_.max_restarts) {
        events_->write({{"event", "give_up"}, {"reason", "restarts"}});
        std::fprintf(stderr, "launch: the job failed %d time(s) and --max-restarts is %d; giving up (the last "
                             "checkpoint stays in %s)\n",
                     restarts + 1, a_.max_restarts, dir_ ? dir_->c_str() : "no directory");
        return 1;
      }
      const int survivors = std::min(total_capacity(), limit());
      if (survivors < a_.min_ranks) {
        events_->write({{"event", "give_up"}, {"reason", "min_ranks"}, {"survivors", survivors}});
        std::fprintf(stderr, "launch: %d rank(s) survive, fewer than --min-ranks %d; giving up\n", survivors, a_.min_ranks);
        return 1;
      }
      candidates_ = survivors_layouts(survivors, shape_, *spec_, job_layout());
      candidate_ = 0;
      const std::optional<Shape> next = candidates_.empty() ? std::nullopt : std::optional<Shape>(candidates_.front());
      if (!next) {
        events_->write({{"event", "give_up"}, {"reason", "no_layout"}, {"survivors", survivors}});
        std::fprintf(stderr, "launch: no layout of at most %d rank(s) takes the global batch %lld with %d micro-batches; "
                             "giving up (a batch divisible by more rank counts would let it go on)\n",
                     survivors, static_cast<long long>(batch_), micro_);
        return 2;  // the job's batch, not the machine, stops it: what to change is said
      }
      relayout(*next);
      if (resumed != "none (from the start)" && !has_flag(args_, "--resume")) args_.push_back("--resume");
      resumed_step = latest_step(dir_);
      ++restarts;
      nlohmann::json ev = {{"event", "restart"}, {"reason", "failure"}, {"restart", restarts}, {"layout", shape_.str()},
                           {"survivors", survivors}, {"from", resumed}, {"from_step", std::max<int64_t>(0, resumed_step)}};
      if (mpi()) ev["hosts"] = hosts_text(hosts_, shape_.world());
      events_->write(ev);
      restart_at = failed_at;
    }
  }

  LaunchArgs a_;
  std::vector<std::string> args_;
  Shape shape_;
  std::optional<std::string> dir_;
  std::shared_ptr<const model::ModelSpec> spec_;
  int64_t batch_ = 0;
  int micro_ = 1;
  std::vector<Host> hosts_;  // MPI: the hosts (--np: this machine)
  Host threads_;             // threads: the child's ranks
  int world0_ = 1;           // the job's ranks at the start
  std::vector<int> rank_host_;
  std::string status_file_;
  fs::path made_dir_, made_leaf_;         // the first folder the launcher made for the checkpoints, and the directory
  std::atomic<bool> ever_started_{false};  // a job began its steps
  std::optional<std::string> unstarted_output_;  // the output of the last attempt that failed before its first step
  double every_s_ = 0;  // train's --checkpoint-every-s
  Events* events_ = nullptr;
  std::mutex watch_m_;
  std::condition_variable watch_cv_;
  std::optional<Shape> grow_to_;
  std::vector<Shape> candidates_;  // a restart's layouts, best first
  size_t candidate_ = 0;           // the one it runs
  Clock::time_point grow_asked_at_;
};

}  // namespace

void add_launch_command(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  CLI::App* c = app.add_subcommand(
      "launch", "Run `meshtrain train` supervised; resume a failed job on the surviving ranks and hosts");
  c->add_option("--np", a->np, "Run the job as this many MPI processes on this machine (through mpirun)")
      ->check(integer<int>(1));
  c->add_option("--hosts", a->hosts_file, "Run the job as MPI processes across the hosts of this file (`NAME slots=N` per line)")
      ->check(non_empty_path());
  c->add_option("--mpirun", a->mpirun, "The mpirun program (its settings from OMPI_MCA_* variables)")->capture_default_str();
  c->add_flag("--grow", a->grow, "Take lost hosts and slots back when they answer again, at the next step boundary");
  c->add_option("--probe-every-s", a->probe_every_s, "With --grow: seconds between asking lost hosts")
      ->check(number(0, kWeekS, false))
      ->capture_default_str();
  c->add_option("--probe-timeout-s", a->probe_timeout_s, "Seconds a host has to answer before it counts as lost")
      ->check(number(0, kWeekS, false))
      ->capture_default_str();
  c->add_option("--stall-timeout-s", a->stall_timeout_s,
                "End and restart a job that makes no step for this many seconds (at least 10 x its longest gap "
                "between steps; 0: never)")
      ->check(number(0, kWeekS, true))
      ->capture_default_str();
  c->add_option("--max-restarts", a->max_restarts, "Give up after this many restarts")
      ->check(integer<int>(0))
      ->capture_default_str();
  c->add_option("--min-ranks", a->min_ranks, "Give up when fewer ranks than this survive")
      ->check(integer<int>(1))
      ->capture_default_str();
  c->add_option("--max-ranks", a->max_ranks,
                "Never run the job on more ranks than this (0: its own ranks, or with --grow every slot)")
      ->check(integer<int>(0))
      ->capture_default_str();
  c->add_option("--events", a->events, "Write one JSON line per event (failure, restart, done) to this file")
      ->check(non_empty_path());
  c->add_flag("--overwrite", a->overwrite,
              "Let --events replace an existing file that meshtrain did not write (the job's own outputs keep "
              "train's --overwrite)");
  c->add_option("train", a->train, "-- train ARGS...: the job")->expected(-1);
  c->callback([a] {
    const int code = Launcher(*a).run();
    if (code != 0) throw LaunchExit(code);
  });
}

}  // namespace meshtrain::cli
