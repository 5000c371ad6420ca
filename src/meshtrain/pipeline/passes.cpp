// add_send_recv and validate; see passes.h for the rules.
#include "meshtrain/pipeline/passes.h"

#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace meshtrain::pipeline {

// ---- add_send_recv ----

Schedule add_send_recv(const Schedule& schedule) {
  Schedule out = schedule;
  if (schedule.has_comm) return out;
  const ScheduleShape& s = schedule.shape;
  for (int r = 0; r < static_cast<int>(schedule.ranks.size()); ++r) {
    std::vector<Action> list;
    for (const Action& a : schedule.ranks[r]) {
      auto with = [&](Kind k) { return Action{a.stage, k, a.microbatch, a.chunk}; };
      const int prv = s.prev(a.stage), nxt = s.next(a.stage);
      const bool prev_remote = prv >= 0 && s.rank_of(prv) != r;
      const bool next_remote = nxt >= 0 && s.rank_of(nxt) != r;
      if (a.kind == Kind::F) {
        if (prev_remote) list.push_back(with(Kind::RECV_F));
        list.push_back(a);
        if (next_remote) list.push_back(with(Kind::SEND_F));
      } else if (is_backward(a.kind)) {
        if (next_remote) list.push_back(with(Kind::RECV_B));
        list.push_back(a);
        if (prev_remote) list.push_back(with(Kind::SEND_B));
      } else {
        list.push_back(a);
      }
    }
    out.ranks[r] = std::move(list);
  }
  out.has_comm = true;
  return out;
}

// ---- validate ----

std::string Fault::to_string() const {
  const bool missing = problem.rfind("missing", 0) == 0;
  return "rank " + std::to_string(rank) + ", position " + std::to_string(position) +
         (missing ? " (end of list)" : "") + ", action " + pipeline::to_string(action) + ": " + problem;
}

namespace {

using Key = std::tuple<Kind, int, int>;  // (kind, stage, micro-batch)
using Cell = std::pair<int, int>;        // (rank, position)

class Checker {
 public:
  explicit Checker(const Schedule& s) : sched_(s), shape_(s.shape) {
    for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r)
      for (int p = 0; p < static_cast<int>(s.ranks[r].size()); ++p) {
        const Action& a = s.ranks[r][p];
        where_[{a.kind, a.stage, a.microbatch}].push_back({r, p});
      }
  }

  std::optional<Fault> run() {
    if (static_cast<int>(sched_.ranks.size()) != shape_.pp)
      return Fault{0, 0, {}, "the schedule has " + std::to_string(sched_.ranks.size()) +
                                 " rank lists for pp " + std::to_string(shape_.pp)};
    for (int r = 0; r < shape_.pp; ++r)
      for (int p = 0; p < static_cast<int>(sched_.ranks[r].size()); ++p) {
        std::string why = check_cell(r, p);
        if (!why.empty()) return Fault{r, p, sched_.ranks[r][p], why};
      }
    return check_complete();
  }

 private:
  const std::vector<Cell>& cells(Kind k, int stage, int mb) const {
    static const std::vector<Cell> none;
    auto it = where_.find({k, stage, mb});
    return it == where_.end() ? none : it->second;
  }
  bool exists(Kind k, int stage, int mb) const { return !cells(k, stage, mb).empty(); }
  bool earlier(Kind k, int stage, int mb, int rank, int pos) const {
    for (const Cell& c : cells(k, stage, mb))
      if (c.first == rank && c.second < pos) return true;
    return false;
  }
  std::string name(int stage, Kind k, int mb) const {
    return to_string(Action{stage, k, mb, stage >= 0 ? shape_.chunk_of(stage) : 0});
  }
  // "" when exactly one `k` of (stage, mb) exists, else what is wrong.
  std::string match(Kind k, int stage, int mb, const char* what) const {
    const auto& c = cells(k, stage, mb);
    if (c.size() == 1) return "";
    if (c.empty())
      return std::string("no matching ") + what + " " + name(stage, k, mb) + " on rank " +
             std::to_string(shape_.rank_of(stage));
    return std::string("matched by ") + std::to_string(c.size()) + " " + what + "s " + name(stage, k, mb);
  }

  std::string check_cell(int r, int p) const {
    const Action& a = sched_.ranks[r][p];
    const int stages = shape_.stages(), mb = a.microbatch, st = a.stage;
    if (st < 0 || st >= stages)
      return "stage " + std::to_string(st) + " does not exist (the schedule has " +
             std::to_string(stages) + " stages)";
    if (shape_.rank_of(st) != r)
      return "stage " + std::to_string(st) + " lives on rank " + std::to_string(shape_.rank_of(st));
    if (a.chunk != shape_.chunk_of(st))
      return "stage " + std::to_string(st) + " is chunk " + std::to_string(shape_.chunk_of(st)) +
             " of its rank, not chunk " + std::to_string(a.chunk);
    if (mb < 0 || mb >= shape_.microbatches)
      return "micro-batch " + std::to_string(mb) + " does not exist (the schedule has " +
             std::to_string(shape_.microbatches) + ")";
    if (!shape_.runs(st, mb))
      return "micro-batch " + std::to_string(mb) + " belongs to the other pipeline, not stage " + std::to_string(st) + "'s";
    const Cell first = cells(a.kind, st, mb).front();
    if (first != Cell{r, p})
      return "duplicate of the same action at rank " + std::to_string(first.first) + ", position " +
             std::to_string(first.second);
    const int prv = shape_.prev(st), nxt = shape_.next(st);
    const bool prev_local = prv >= 0 && shape_.rank_of(prv) == r;
    const bool next_local = nxt >= 0 && shape_.rank_of(nxt) == r;
    const bool comm = sched_.has_comm;
    switch (a.kind) {
      case Kind::F:
        if (prev_local && !earlier(Kind::F, prv, mb, r, p))
          return "its input " + name(prv, Kind::F, mb) + " does not come before it";
        if (prv >= 0 && !prev_local && comm && !earlier(Kind::RECV_F, st, mb, r, p))
          return "its input " + name(st, Kind::RECV_F, mb) + " does not come before it";
        return "";
      case Kind::B:
      case Kind::I: {
        if (!earlier(Kind::F, st, mb, r, p)) return "its forward " + name(st, Kind::F, mb) + " does not come before it";
        const Kind other = a.kind == Kind::B ? Kind::I : Kind::B;
        if (exists(other, st, mb))
          return "the schedule also has " + name(st, other, mb) + "; use B or I + W, not both";
        if (next_local && !earlier(Kind::B, nxt, mb, r, p) && !earlier(Kind::I, nxt, mb, r, p))
          return "its gradient input " + name(nxt, Kind::B, mb) + " (or I) does not come before it";
        if (nxt >= 0 && !next_local && comm && !earlier(Kind::RECV_B, st, mb, r, p))
          return "its gradient input " + name(st, Kind::RECV_B, mb) + " does not come before it";
        return "";
      }
      case Kind::W:
        if (!earlier(Kind::I, st, mb, r, p))
          return "its input gradient " + name(st, Kind::I, mb) + " does not come before it";
        return "";
      case Kind::SEND_F:
        if (nxt < 0 || next_local) return "stage " + std::to_string(st) + " has no next stage on another rank";
        if (!earlier(Kind::F, st, mb, r, p)) return "the forward it sends, " + name(st, Kind::F, mb) + ", does not come before it";
        return match(Kind::RECV_F, nxt, mb, "receive");
      case Kind::RECV_F:
        if (prv < 0 || prev_local) return "stage " + std::to_string(st) + " has no previous stage on another rank";
        return match(Kind::SEND_F, prv, mb, "send");
      case Kind::SEND_B:
        if (prv < 0 || prev_local) return "stage " + std::to_string(st) + " has no previous stage on another rank";
        if (!earlier(Kind::B, st, mb, r, p) && !earlier(Kind::I, st, mb, r, p))
          return "the gradient it sends, " + name(st, Kind::B, mb) + " (or I), does not come before it";
        return match(Kind::RECV_B, prv, mb, "receive");
      case Kind::RECV_B:
        if (nxt < 0 || next_local) return "stage " + std::to_string(st) + " has no next stage on another rank";
        return match(Kind::SEND_B, nxt, mb, "send");
    }
    return "";
  }

  std::optional<Fault> check_complete() const {
    for (int st = 0; st < shape_.stages(); ++st)
      for (int mb = 0; mb < shape_.microbatches; ++mb) {
        if (!shape_.runs(st, mb)) continue;
        const int r = shape_.rank_of(st);
        const int end = static_cast<int>(sched_.ranks[r].size());
        const auto missing = [&](Kind k, const std::string& why) {
          return Fault{r, end, Action{st, k, mb, shape_.chunk_of(st)}, "missing: " + why};
        };
        if (!exists(Kind::F, st, mb))
          return missing(Kind::F, "stage " + std::to_string(st) + " never runs forward on micro-batch " +
                                      std::to_string(mb));
        if (!exists(Kind::B, st, mb) && !exists(Kind::I, st, mb))
          return missing(Kind::B, "stage " + std::to_string(st) + " never runs backward (B, or I + W) on micro-batch " +
                                      std::to_string(mb));
        if (exists(Kind::I, st, mb) && !exists(Kind::W, st, mb))
          return missing(Kind::W, "stage " + std::to_string(st) + " computes the input gradient of micro-batch " +
                                      std::to_string(mb) + " but never its weight gradient");
      }
    return std::nullopt;
  }

  const Schedule& sched_;
  const ScheduleShape& shape_;
  std::map<Key, std::vector<Cell>> where_;
};

}  // namespace

std::optional<Fault> validate(const Schedule& schedule) { return Checker(schedule).run(); }

}  // namespace meshtrain::pipeline
