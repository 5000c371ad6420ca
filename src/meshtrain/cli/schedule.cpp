// `meshtrain schedule`: the ideal pipeline schedule, without running anything. Generates the
// per-rank action lists with the pipeline generators, adds the communication, validates them,
// dry-runs them for deadlocks, simulates them with per-kind costs and prints the lists, a
// per-rank summary (busy time, bubble fraction, peak micro-batches in flight) and the step
// time; --svg also draws the simulated swimlane (pipeline/svg.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <sstream>
#include <string>
#include <tuple>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/pipeline/grid.h"
#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"
#include "meshtrain/pipeline/simulate.h"
#include "meshtrain/pipeline/svg.h"
#include "meshtrain/train/outputs.h"

namespace meshtrain::cli {

namespace {

namespace mp = meshtrain::pipeline;

struct ScheduleOptions {
  int pp = 4;
  int microbatches = 8;
  std::string schedule = "1f1b";
  int chunks = 1;  // 2 when not given and the schedule takes several
  std::string costs;
  std::string action_costs;  // file of measured per-action times
  std::string svg;
  bool overwrite = false;  // --svg may replace a file meshtrain did not write
};

// Above this many (stage, micro-batch) pairs the lists and the picture are unreadable anyway.
constexpr long kMaxPairs = 65536;

// The range of a cost (--costs, --action-costs): wide enough for any unit (seconds to
// nanoseconds), narrow enough that a chunk's share (a cost / --chunks) stays a normal number
// and the sum over kMaxPairs x 4 actions stays finite, so the simulated times and bubbles are
// numbers.
constexpr double kMinCost = 1e-9, kMaxCost = 1e12;

// "train" accepts zb for ZB-H1; so does schedule.
std::string generator_name(const std::string& schedule) { return schedule == "zb" ? "zb-h1" : schedule; }

// The whole of `text` as a finite number; NaN when it is not one.
double finite_number(const std::string& text) {
  std::size_t used = 0;
  double v = NAN;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return NAN;
  }
  return used == text.size() && std::isfinite(v) ? v : NAN;
}

// "F=1,B=2,I=1,W=1,send=0,transfer=0", any subset, over the defaults of mp::Costs.
mp::Costs parse_costs(const std::string& text) {
  mp::Costs c;
  if (text.empty()) return c;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    double* field = key == "F" ? &c.F : key == "B" ? &c.B : key == "I" ? &c.I : key == "W" ? &c.W
                  : key == "send" ? &c.send : key == "transfer" ? &c.transfer : nullptr;
    if (eq == std::string::npos || !field)
      throw UsageError("--costs takes KIND=NUMBER items separated by commas, KIND one of F, B, I, W, send, "
                       "transfer (e.g. F=1,B=2); '" + item + "' is not one.");
    const std::string value = item.substr(eq + 1);
    const double v = finite_number(value);
    const bool compute = field != &c.send && field != &c.transfer;
    if (std::isnan(v) || v > kMaxCost || (compute ? !(v >= kMinCost) : v < 0))
      throw UsageError("--costs: " + key + " must be a finite number " +
                       (compute ? "from 1e-09" : "from 0") + " to 1e+12, not '" + value + "'.");
    *field = v;
  }
  return c;
}

// The measured time of single compute actions, one per line: "<action> <time>", e.g.
// "2F0 12.5" or "5B3c2 30.1" ('#' starts a comment). Every action must be a compute action of
// `sched`, each given once; the time is in the unit of --costs.
void read_action_costs(const std::string& path, const mp::Schedule& sched, mp::Costs& costs) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError("--action-costs " + path + " is a directory; give a file of lines '<action> <time>'.");
  std::ifstream in(path);
  if (!in) throw UsageError("--action-costs: cannot read '" + path + "'; give a file of lines '<action> <time>'.");
  std::map<std::tuple<mp::Kind, int, int>, bool> wanted;
  for (const auto& list : sched.ranks)
    for (const mp::Action& a : list)
      if (mp::is_compute(a.kind)) wanted[{a.kind, a.stage, a.microbatch}] = true;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream fields(line);
    std::string action_text, time_text, extra;
    if (!(fields >> action_text)) continue;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    if (!(fields >> time_text) || (fields >> extra))
      throw UsageError("--action-costs: " + where + "expected '<action> <time>' (e.g. '2F0 12.5'), not '" + line + "'.");
    mp::Action a;
    try {
      a = mp::parse_action(action_text);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--action-costs: " + where + e.what());
    }
    const std::tuple<mp::Kind, int, int> key{a.kind, a.stage, a.microbatch};
    if (!mp::is_compute(a.kind) || !wanted.count(key))
      throw UsageError("--action-costs: " + where + action_text + " is not a compute action of this " + sched.name +
                       " schedule; give the --pp, --microbatches, --schedule and --chunks of the run it was measured in.");
    const double v = finite_number(time_text);
    if (std::isnan(v) || v < 0 || v > kMaxCost)
      throw UsageError("--action-costs: " + where + "the time of " + action_text +
                       " must be a finite number from 0 to 1e+12, not '" + time_text + "'.");
    if (!costs.measured.emplace(key, v).second)
      throw UsageError("--action-costs: " + where + action_text + " is given twice; give each action once.");
  }
  if (in.bad()) throw UsageError("--action-costs: cannot read '" + path + "'; give a file of lines '<action> <time>'.");
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// Cost figures as they were given: 1, 2.5, 0.125.
std::string short_num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void run_schedule(const ScheduleOptions& o, bool chunks_given) {
  // ---- the paths first (train/outputs.h): --svg usable, not the --action-costs file, not a
  // file meshtrain did not write (without --overwrite) ----
  try {
    train::PathPlan plan(o.overwrite);
    plan.input_file("--action-costs", o.action_costs);
    plan.output_file("--svg", o.svg, train::OutputKind::svg);
    plan.check();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  // ---- the shape, refused in words ----
  const std::string schedule = generator_name(o.schedule);
  const mp::GeneratorInfo* gen = nullptr;
  try {
    gen = &mp::find_generator(schedule);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--schedule: ") + e.what());
  }
  const int chunks = chunks_given ? o.chunks : (gen->multi_chunk ? 2 : 1);
  if (double(o.pp) * chunks * o.microbatches > kMaxPairs)
    throw UsageError("--pp x --chunks x --microbatches is " + fixed(double(o.pp) * chunks * o.microbatches, 0) +
                     "; keep it at most " + std::to_string(kMaxPairs) + " to draw a schedule.");
  // The costs are those of a rank's whole share of the model; with v chunks per rank each
  // chunk's compute action takes 1/v of them, so step times compare across schedules.
  mp::Costs costs = parse_costs(o.costs);
  const mp::Costs given = costs;
  for (double* c : {&costs.F, &costs.B, &costs.I, &costs.W}) *c /= chunks;
  mp::Schedule plain;
  try {
    plain = mp::make_schedule(schedule, {o.pp, o.microbatches, chunks});
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }

  // ---- passes: a generated schedule that fails them is a bug, reported as a failure ----
  const mp::Schedule sched = mp::add_send_recv(plain);
  if (!o.action_costs.empty()) read_action_costs(o.action_costs, sched, costs);
  if (auto fault = mp::validate(sched))
    throw std::runtime_error("the generated " + sched.name + " schedule is invalid: " + fault->to_string() + "\n" +
                             mp::format_lists(sched, fault));
  if (auto dead = mp::dry_run(sched))
    throw std::runtime_error("the generated " + sched.name + " schedule deadlocks:\n" + dead->to_string());
  const mp::Timeline t = mp::simulate(sched, costs);
  if (t.deadlock) throw std::runtime_error("the " + sched.name + " schedule deadlocks:\n" + t.deadlock->to_string());

  // Every action timed 0 (--action-costs) and free communication: no step to take a share of.
  if (!(t.makespan > 0) || !std::isfinite(t.makespan))
    throw UsageError("the simulated step takes " + short_num(t.makespan) +
                     " units, so it has no bubble to measure; give some compute action a time above 0.");

  // ---- the swimlane first, so that a failed write leaves no half report ----
  const int pp = sched.shape.pp, m = sched.shape.microbatches;
  const std::string cost_text = "F=" + short_num(given.F) + " B=" + short_num(given.B) + " I=" +
                                short_num(given.I) + " W=" + short_num(given.W) + " send=" +
                                short_num(given.send) + " transfer=" + short_num(given.transfer);
  const double mean_bubble = std::accumulate(t.bubble.begin(), t.bubble.end(), 0.0) / pp;
  if (!o.svg.empty()) {
    mp::Swimlane lane = mp::swimlane_of(
        sched, t,
        sched.name + " schedule, pp " + std::to_string(pp) + ", m " + std::to_string(m) + ", v " +
            std::to_string(chunks) + ": bubble " + fixed(100 * mean_bubble, 1) + "% (simulated)");
    lane.axis_caption = "time (simulated, costs " + cost_text + ")";
    lane.boundaries = {0, t.makespan};  // the one step drawn
    mp::write_svg(lane, o.svg);
  }

  // ---- the report ----
  std::printf("schedule %s: pp %d, %d micro-batches, %d chunk%s per rank (%d stages) - %s\n", sched.name.c_str(), pp,
              m, chunks, chunks == 1 ? "" : "s", sched.shape.stages(), std::string(gen->description).c_str());
  if (sched.period > 0)
    std::printf("asynchronous: %d steps of %d micro-batches unrolled without a flush (step k runs micro-batches "
                "k*%d .. k*%d+%d); the figures below are for all %d\n",
                mp::kUnrolledSteps, sched.period, sched.period, sched.period, sched.period - 1, mp::kUnrolledSteps);
  std::printf("simulated with costs %s%s\n", cost_text.c_str(),
              chunks == 1 ? "" : (" per rank (each chunk's action takes 1/" + std::to_string(chunks) + ")").c_str());
  if (!o.action_costs.empty()) {
    long compute = 0;
    for (const auto& list : sched.ranks)
      compute += std::count_if(list.begin(), list.end(), [](const mp::Action& a) { return mp::is_compute(a.kind); });
    std::printf("%zu of %ld compute actions timed from %s%s\n", costs.measured.size(), compute,
                o.action_costs.c_str(), long(costs.measured.size()) == compute ? "" : ", the others by kind");
  }
  std::printf("\n");
  std::printf("actions per rank, in order (communication added):\n%s\n", mp::format_lists(sched).c_str());
  std::printf("%-6s %10s %8s %16s\n", "rank", "busy", "bubble", "peak in flight");
  for (int r = 0; r < pp; ++r)
    std::printf("%-6d %10s %8s %16d\n", r, short_num(t.busy[r]).c_str(), fixed(t.bubble[r], 4).c_str(),
                t.peak_in_flight[r]);
  std::printf("\n%s time %s; bubble fraction %s (mean over ranks, %s%%)\n", sched.period > 0 ? "unrolled" : "step",
              short_num(t.makespan).c_str(), fixed(mean_bubble, 4).c_str(), fixed(100 * mean_bubble, 1).c_str());
  if (sched.period > 0) {
    // A step in the steady state: the unrolled steps' time beyond one flushed 1F1B step, shared.
    const mp::Schedule one = mp::add_send_recv(mp::make_schedule("1f1b", {pp, sched.period, 1}));
    const mp::Timeline t1 = mp::simulate(one, costs);
    const double step = (t.makespan - t1.makespan) / (mp::kUnrolledSteps - 1);
    double busy = 0;
    for (double b : t.busy) busy += b / mp::kUnrolledSteps / pp;
    std::printf("steady step time %s (1F1B's flushed step: %s); bubble fraction in the steady state %s\n",
                short_num(step).c_str(), short_num(t1.makespan).c_str(),
                fixed(step > 0 ? std::max(0.0, 1 - busy / step) : 0.0, 4).c_str());
  }

  if (!o.svg.empty()) std::printf("swimlane: %s\n", o.svg.c_str());
}

}  // namespace

void add_schedule_command(CLI::App& app) {
  auto opt = std::make_shared<ScheduleOptions>();
  std::string names;
  for (const auto& g : pipeline::generators()) names += (names.empty() ? "" : ", ") + std::string(g.name);
  CLI::App* c = app.add_subcommand(
      "schedule", "Print (and draw) the ideal pipeline schedule: action lists, simulated bubble, swimlane SVG");
  c->add_option("--pp", opt->pp, "Pipeline ranks")->check(integer<int>(1))->capture_default_str();
  c->add_option("--microbatches", opt->microbatches, "Micro-batches per step")
      ->check(integer<int>(1))
      ->capture_default_str();
  c->add_option("--schedule", opt->schedule, "Pipeline schedule: " + names + " (zb: zb-h1, as train takes it)")
      ->capture_default_str();
  CLI::Option* chunks = c->add_option("--chunks", opt->chunks,
                                      "Model chunks per rank (interleaved; default 2 there, else 1)")
                            ->check(integer<int>(1));
  c->add_option("--costs", opt->costs,
                "Simulated time per kind, e.g. F=1,B=2,I=1,W=1,send=0,transfer=0 (these are the defaults)");
  c->add_option("--action-costs", opt->action_costs,
                "File of measured times of single actions, one '<action> <time>' per line (e.g. '2F0 12.5'), "
                "replayed instead of the per-kind --costs")
      ->check(non_empty_path());
  c->add_option("--svg", opt->svg, "Also draw the simulated swimlane into this SVG file")->check(non_empty_path());
  c->add_flag("--overwrite", opt->overwrite, "Let --svg replace an existing file meshtrain did not write");
  c->callback([opt, chunks] { run_schedule(*opt, chunks->count() > 0); });
}

}  // namespace meshtrain::cli
