// Running a schedule without running a model: the dry run (does it finish, or which ranks
// wait forever?) and the simulator (when does each action run, given a cost per kind?).
//
// Both replay every rank's list in order, all ranks together. An action starts when the
// rank's previous action has finished and its inputs are there:
//   - F of stage s needs its RECV_F (communication added) or, for a same-rank stage or a
//     schedule without communication, F of stage s - 1 directly;
//   - B / I need their own F and the RECV_B (or B / I of stage s + 1); W needs its I;
//   - a receive blocks until the matching send has been posted (plus the transfer time);
//   - a send depends on the action it sends. How it completes is the SendMode:
//       buffered   — the send returns at once (the message is queued for the peer). This is
//                    what the executor does: asynchronous sends, posted early, waited late.
//       rendezvous — the send returns only when the peer reaches the matching receive
//                    (a synchronous send). Orders that only work because sends are queued,
//                    such as 1F1B's steady state where neighbours send to each other before
//                    receiving, deadlock here.
// When no rank can move and some have actions left, the run is stuck: every unfinished rank
// is reported with its position, its blocked action and what that action waits for.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/pipeline/schedule.h"

namespace meshtrain::pipeline {

enum class SendMode { buffered, rendezvous };

// Time each kind takes. Defaults: backward costs twice a forward, and splits evenly into I
// and W; communication is free. Only ratios matter for the bubble fraction.
//
// `measured` overrides the per-kind figure for single compute actions, keyed by (kind, stage,
// micro-batch): a replay of durations measured in a run (bench/pipeline_bubble.py feeds it a
// trace's F, B, I, W spans), so uneven stages and the spread of one action's time from the
// next count as they did in the run.
struct Costs {
  double F = 1, B = 2, I = 1, W = 1;
  double send = 0;      // time the sending rank spends posting a send
  double transfer = 0;  // time from the end of a send until the receive can complete
  std::map<std::tuple<Kind, int, int>, double> measured = {};
  double of(Kind k) const;
  double of(const Action& a) const;  // the measured figure when there is one, else of(kind)
};

struct BlockedRank {
  int rank = 0;
  int position = 0;
  Action action;      // the action it cannot start
  std::string waits;  // what it waits for, e.g. "1SEND_F0 on rank 1"
};

struct Deadlock {
  std::vector<BlockedRank> blocked;  // every rank with actions left, by rank
  std::string to_string() const;     // one line per blocked rank
};

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct Timeline {
  std::vector<std::vector<TimedAction>> ranks;  // the actions each rank completed, in order
  std::optional<Deadlock> deadlock;             // set when the replay got stuck
  double makespan = 0;                          // end of the last action (the step time)
  std::vector<double> busy;                     // per rank: time spent in F, B, I, W
  std::vector<double> bubble;                   // per rank: (makespan - busy) / makespan
  std::vector<int> peak_in_flight;              // per rank: see peak_in_flight()
};

// Replays the schedule with the given costs.
Timeline simulate(const Schedule& schedule, const Costs& costs = {}, SendMode mode = SendMode::buffered);

// The deadlock check alone (unit costs): nothing when every rank finishes.
std::optional<Deadlock> dry_run(const Schedule& schedule, SendMode mode = SendMode::buffered);

// Per rank: the most (stage, micro-batch) pairs whose forward has run and whose backward has
// not finished yet (B, or W when backward is split: the weights' gradient still needs the
// saved activations). For interleaved schedules a pair is one chunk's activations.
std::vector<int> peak_in_flight(const Schedule& schedule);

}  // namespace meshtrain::pipeline
