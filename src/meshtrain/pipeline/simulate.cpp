// The replay engine behind dry_run and simulate; see simulate.h for the rules.
#include "meshtrain/pipeline/simulate.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace meshtrain::pipeline {

double Costs::of(Kind k) const {
  switch (k) {
    case Kind::F: return F;
    case Kind::B: return B;
    case Kind::I: return I;
    case Kind::W: return W;
    case Kind::SEND_F:
    case Kind::SEND_B: return send;
    case Kind::RECV_F:
    case Kind::RECV_B: return 0;
  }
  return 0;
}

double Costs::of(const Action& a) const {
  if (!measured.empty())
    if (auto it = measured.find({a.kind, a.stage, a.microbatch}); it != measured.end()) return it->second;
  return of(a.kind);
}

std::string Deadlock::to_string() const {
  std::string s;
  for (const BlockedRank& b : blocked)
    s += "rank " + std::to_string(b.rank) + " blocked at position " + std::to_string(b.position) + " on " +
         pipeline::to_string(b.action) + ", waiting for " + b.waits + "\n";
  return s;
}

namespace {

using Key = std::tuple<Kind, int, int>;  // (kind, stage, micro-batch)

class Replay {
 public:
  Replay(const Schedule& s, const Costs& c, SendMode mode)
      : sched_(s), shape_(s.shape), costs_(c), mode_(mode), pos_(s.ranks.size(), 0), clock_(s.ranks.size(), 0) {
    out_.ranks.resize(s.ranks.size());
  }

  Timeline run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < ranks(); ++r)
        while (pos_[r] < size(r) && step(r)) progress = true;
    }
    Deadlock stuck;
    for (int r = 0; r < ranks(); ++r)
      if (pos_[r] < size(r)) {
        const Action& a = current(r);
        stuck.blocked.push_back({r, pos_[r], a, waits_for(r, a)});
      }
    if (!stuck.blocked.empty()) out_.deadlock = stuck;
    finish();
    return std::move(out_);
  }

 private:
  int ranks() const { return static_cast<int>(sched_.ranks.size()); }
  int size(int r) const { return static_cast<int>(sched_.ranks[r].size()); }
  const Action& current(int r) const { return sched_.ranks[r][pos_[r]]; }
  bool remote(int stage, int r) const { return shape_.rank_of(stage) != r; }
  Action named(int stage, Kind k, int mb) const { return Action{stage, k, mb, shape_.chunk_of(stage)}; }

  // End time of a completed action, if it completed.
  std::optional<double> done(Kind k, int stage, int mb) const {
    auto it = done_.find({k, stage, mb});
    if (it == done_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<double> grad_done(int stage, int mb) const {
    if (auto t = done(Kind::B, stage, mb)) return t;
    return done(Kind::I, stage, mb);
  }

  // The inputs of `a` other than its matching send (for receives) or receive (rendezvous
  // sends), as (what, ready time); the ready time is empty while the input is missing.
  std::vector<std::pair<Action, std::optional<double>>> inputs(int r, const Action& a) const {
    const int st = a.stage, mb = a.microbatch, prv = shape_.prev(st), nxt = shape_.next(st);
    const bool comm = sched_.has_comm;
    switch (a.kind) {
      case Kind::F:
        if (prv < 0) return {};
        if (comm && remote(prv, r)) return {{named(st, Kind::RECV_F, mb), done(Kind::RECV_F, st, mb)}};
        return {{named(prv, Kind::F, mb), done(Kind::F, prv, mb)}};
      case Kind::B:
      case Kind::I: {
        std::vector<std::pair<Action, std::optional<double>>> in{{named(st, Kind::F, mb), done(Kind::F, st, mb)}};
        if (nxt >= 0) {
          if (comm && remote(nxt, r)) in.push_back({named(st, Kind::RECV_B, mb), done(Kind::RECV_B, st, mb)});
          else in.push_back({named(nxt, Kind::B, mb), grad_done(nxt, mb)});
        }
        return in;
      }
      case Kind::W: return {{named(st, Kind::I, mb), done(Kind::I, st, mb)}};
      case Kind::SEND_F: return {{named(st, Kind::F, mb), done(Kind::F, st, mb)}};
      case Kind::SEND_B: return {{named(st, Kind::B, mb), grad_done(st, mb)}};
      case Kind::RECV_F: return {{named(prv, Kind::SEND_F, mb), posted(Kind::SEND_F, prv, mb)}};
      case Kind::RECV_B: return {{named(nxt, Kind::SEND_B, mb), posted(Kind::SEND_B, nxt, mb)}};
    }
    return {};
  }
  std::optional<double> posted(Kind k, int stage, int mb) const {
    auto it = posted_.find({k, stage, mb});
    if (it == posted_.end()) return std::nullopt;
    return it->second;
  }
  // The receive matching a send.
  Action matching_recv(const Action& a) const {
    return a.kind == Kind::SEND_F ? named(shape_.next(a.stage), Kind::RECV_F, a.microbatch)
                                  : named(shape_.prev(a.stage), Kind::RECV_B, a.microbatch);
  }

  std::string waits_for(int r, const Action& a) const {
    for (const auto& [what, t] : inputs(r, a))
      if (!t) return pipeline::to_string(what) + " on rank " + std::to_string(shape_.rank_of(what.stage));
    if (is_send(a.kind)) {
      const Action recv = matching_recv(a);
      return "rank " + std::to_string(shape_.rank_of(recv.stage)) + " to reach " + pipeline::to_string(recv);
    }
    if (is_recv(a.kind)) return "its send (receives complete with the sender under rendezvous)";
    return "?";
  }

  void complete(int r, const Action& a, double start, double end) {
    out_.ranks[r].push_back({a, start, end});
    done_.emplace(Key{a.kind, a.stage, a.microbatch}, end);
    clock_[r] = end;
    ++pos_[r];
  }

  // Runs the current action of rank r if it can; false when it is blocked.
  bool step(int r) {
    const Action a = current(r);
    double ready = clock_[r];
    for (const auto& [what, t] : inputs(r, a)) {
      if (!t) return false;
      ready = std::max(ready, *t);
    }
    if (is_recv(a.kind) && mode_ == SendMode::rendezvous) return false;  // the sender completes it
    if (is_send(a.kind)) {
      const double end = ready + costs_.of(a.kind);
      if (mode_ == SendMode::rendezvous) {
        const Action recv = matching_recv(a);
        const int peer = shape_.rank_of(recv.stage);
        if (peer < 0 || peer >= ranks() || pos_[peer] >= size(peer) || !(current(peer) == recv)) return false;
        const double start = std::max(ready, clock_[peer]);
        const double send_end = start + costs_.of(a.kind);
        complete(r, a, start, send_end);
        complete(peer, recv, clock_[peer], send_end + costs_.transfer);
        return true;
      }
      posted_.emplace(Key{a.kind, a.stage, a.microbatch}, end + costs_.transfer);
      complete(r, a, ready, end);
      return true;
    }
    complete(r, a, ready, ready + costs_.of(a));
    return true;
  }

  void finish() {
    const int n = ranks();
    out_.busy.assign(n, 0);
    for (int r = 0; r < n; ++r)
      for (const TimedAction& t : out_.ranks[r]) {
        out_.makespan = std::max(out_.makespan, t.end);
        if (is_compute(t.action.kind)) out_.busy[r] += t.end - t.start;
      }
    out_.bubble.assign(n, 0);
    for (int r = 0; r < n; ++r)
      if (out_.makespan > 0) out_.bubble[r] = (out_.makespan - out_.busy[r]) / out_.makespan;
    out_.peak_in_flight = peak_in_flight(sched_);
  }

  const Schedule& sched_;
  const ScheduleShape& shape_;
  Costs costs_;
  SendMode mode_;
  std::vector<int> pos_;
  std::vector<double> clock_;
  std::map<Key, double> done_;
  std::map<Key, double> posted_;  // send -> time its message is available to the receiver
  Timeline out_;
};

}  // namespace

Timeline simulate(const Schedule& schedule, const Costs& costs, SendMode mode) {
  return Replay(schedule, costs, mode).run();
}

std::optional<Deadlock> dry_run(const Schedule& schedule, SendMode mode) {
  return simulate(schedule, Costs{}, mode).deadlock;
}

std::vector<int> peak_in_flight(const Schedule& schedule) {
  std::vector<int> peak;
  for (const auto& list : schedule.ranks) {
    int now = 0, most = 0;
    for (const Action& a : list) {
      if (a.kind == Kind::F) most = std::max(most, ++now);
      else if (a.kind == Kind::B || a.kind == Kind::W) --now;
    }
    peak.push_back(most);
  }
  return peak;
}

}  // namespace meshtrain::pipeline
