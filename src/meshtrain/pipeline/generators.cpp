// The schedule generators and their table. Each generator writes, for every rank, the order
// of its compute actions; the dependencies between ranks (an F needs the previous stage's F,
// a B the next stage's B) are what turn these orders into the familiar pictures, and the
// simulator (simulate.h) replays them to measure bubbles.
#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>

#include "meshtrain/pipeline/schedule.h"

namespace meshtrain::pipeline {

namespace {

Action compute(const ScheduleShape& s, int rank, int chunk, Kind kind, int mb) {
  return Action{s.stage_of(rank, chunk), kind, mb, chunk};
}

}  // namespace

// ---- naive ----
// One micro-batch at a time: rank r runs F then B of micro-batch k and nothing else until
// it has. Because B of k on stage 0 waits for the whole pipeline, micro-batch k + 1 enters
// only after k has left: no two stages ever work at once.
RankLists naive_schedule(const ScheduleShape& s) {
  RankLists out(s.pp);
  for (int r = 0; r < s.pp; ++r)
    for (int k = 0; k < s.microbatches; ++k) {
      // Several chunks on a rank (only at pp 1: --schedule pipedream's reference, all stages on
      // one rank): the micro-batch forward through them in order, then backward in reverse.
      for (int c = 0; c < s.chunks; ++c) out[r].push_back(compute(s, r, c, Kind::F, k));
      for (int c = s.chunks - 1; c >= 0; --c) out[r].push_back(compute(s, r, c, Kind::B, k));
    }
  return out;
}

// ---- GPipe ----
// All forwards, then all backwards in the same micro-batch order (as PyTorch's ScheduleGPipe).
// Every rank holds all m micro-batches' activations at the turn.
RankLists gpipe_schedule(const ScheduleShape& s) {
  RankLists out(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    for (int k = 0; k < s.microbatches; ++k) out[r].push_back(compute(s, r, 0, Kind::F, k));
    for (int k = 0; k < s.microbatches; ++k) out[r].push_back(compute(s, r, 0, Kind::B, k));
  }
  return out;
}

// ---- 1F1B ----
// PipeDream-flush / Megatron's non-interleaved schedule. Rank r warms up with
// min(pp - r - 1, m) forwards, then alternates one forward and one backward, then drains the
// remaining backwards. At most min(m, pp - r) micro-batches are in flight on rank r.
RankLists one_f_one_b_schedule(const ScheduleShape& s) {
  RankLists out(s.pp);
  const int m = s.microbatches;
  for (int r = 0; r < s.pp; ++r) {
    const int warmup = std::min(s.pp - r - 1, m);
    auto& list = out[r];
    for (int k = 0; k < warmup; ++k) list.push_back(compute(s, r, 0, Kind::F, k));
    for (int k = 0; k < m - warmup; ++k) {
      list.push_back(compute(s, r, 0, Kind::F, warmup + k));
      list.push_back(compute(s, r, 0, Kind::B, k));
    }
    for (int k = m - warmup; k < m; ++k) list.push_back(compute(s, r, 0, Kind::B, k));
  }
  return out;
}

// ---- interleaved 1F1B ----
// Megatron's virtual pipeline (Narayanan et al. 2021): each rank holds v chunks (stages r,
// r + pp, ...), and works through m * v "virtual micro-batches". Virtual micro-batch k runs
// chunk (k mod pp v) / pp (counted from the last chunk for backward) on micro-batch
// (k / (pp v)) pp + k mod pp, i.e. groups of pp micro-batches go through one chunk, then the
// next. Rank r warms up with (pp - r - 1) * 2 + (v - 1) * pp forwards, then alternates.
// Constraints (Megatron's): v >= 2 (v = 1 is plain 1F1B) and m a multiple of pp, so every
// group of pp micro-batches is complete. (Megatron also runs all forwards first when m == pp;
// with asynchronous sends that is not needed, and the dry run shows this order runs.)
RankLists interleaved_schedule(const ScheduleShape& s) {
  const int pp = s.pp, v = s.chunks, m = s.microbatches;
  if (v < 2)
    throw std::invalid_argument("interleaved needs at least 2 chunks per rank (got --chunks " +
                                std::to_string(v) + "); use 1f1b for one chunk.");
  if (m % pp != 0)
    throw std::invalid_argument("interleaved needs the micro-batch count to be a multiple of pp (got " +
                                std::to_string(m) + " micro-batches for pp " + std::to_string(pp) +
                                "); use a multiple of " + std::to_string(pp) + ".");
  const int total = m * v;
  auto virtual_action = [&](int r, int k, bool forward) {
    const int in_group = k % (pp * v);
    int chunk = in_group / pp;
    if (!forward) chunk = v - 1 - chunk;
    const int mb = (k / (pp * v)) * pp + k % pp;
    return compute(s, r, chunk, forward ? Kind::F : Kind::B, mb);
  };
  RankLists out(pp);
  for (int r = 0; r < pp; ++r) {
    const int warmup = std::min((pp - r - 1) * 2 + (v - 1) * pp, total);
    auto& list = out[r];
    for (int k = 0; k < warmup; ++k) list.push_back(virtual_action(r, k, true));
    for (int k = 0; k < total - warmup; ++k) {
      list.push_back(virtual_action(r, warmup + k, true));
      list.push_back(virtual_action(r, k, false));
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(virtual_action(r, k, false));
  }
  return out;
}

// ---- zero bubble ZB-H1 ----
// Qi et al. 2023, "Zero Bubble Pipeline Parallelism", the schedule whose peak memory does not
// exceed 1F1B's: backward is split into I (input gradient, on the critical path) and W
// (weight gradient, needed only by the optimizer). Rank r keeps 1F1B's warm-up and its
// F-I alternation, but holds back r weight gradients: in the steady phase, after F and I it
// runs the W of the micro-batch r places behind; the held-back W's fill the cool-down, where
// 1F1B's rank r would wait for gradients. In flight (F done, W not yet) on rank r:
// (pp - r - 1) + 1 + r = pp, 1F1B's peak on rank 0. With F = I = W the bubble falls from
// 1F1B's (pp - 1)(F + I + W) to (pp - 1)(F + I - W).
RankLists zb_h1_schedule(const ScheduleShape& s) {
  RankLists out(s.pp);
  const int m = s.microbatches;
  for (int r = 0; r < s.pp; ++r) {
    const int warmup = std::min(s.pp - r - 1, m);
    auto& list = out[r];
    int next_w = 0;  // the next micro-batch whose W is due
    for (int k = 0; k < warmup; ++k) list.push_back(compute(s, r, 0, Kind::F, k));
    for (int k = 0; k < m - warmup; ++k) {
      list.push_back(compute(s, r, 0, Kind::F, warmup + k));
      list.push_back(compute(s, r, 0, Kind::I, k));
      if (k - r >= next_w) list.push_back(compute(s, r, 0, Kind::W, next_w++));
    }
    for (int k = m - warmup; k < m; ++k) {
      list.push_back(compute(s, r, 0, Kind::I, k));
      if (k - r >= next_w) list.push_back(compute(s, r, 0, Kind::W, next_w++));
    }
    while (next_w < m) list.push_back(compute(s, r, 0, Kind::W, next_w++));
  }
  return out;
}

// ---- PipeDream-2BW ----
// Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training" (ICML 2021). The order
// is 1F1B's, but over the micro-batches of consecutive steps with no flush between them: the
// next step's first forwards fill the cool-down in which 1F1B's ranks would wait for
// gradients, so in the steady state no rank idles. The price is one step of staleness: step
// t's micro-batches run forward and backward on the weights before the latest update, W(t-1),
// while W(t) is being made (the update of step t applies the gradient computed at W(t-1)). A
// stage keeps two weight versions (the "2 buffered weights") and its gradient accumulates over
// the step's micro-batches as in 1F1B. Needs m >= pp (the paper's m >= d), so that each step's
// last backward on a rank comes before the step after next begins there.
RankLists pipedream_2bw_schedule(const ScheduleShape& s) { return one_f_one_b_schedule(s); }

// ---- PipeDream ----
// PipeDream's own order (Harlap et al. 2018) is the same 1F1B without a flush; what differs is
// the update: each stage applies every micro-batch's gradient right after its backward, and a
// micro-batch's backward runs on the weights its forward used (train/weight_stash.h). Stage s of
// p then runs forward on weights p - 1 - s updates old. Needs m >= pp as 2BW does, for the
// windows the executor cuts (one step's micro-batches in flight at most).
RankLists pipedream_schedule(const ScheduleShape& s) { return one_f_one_b_schedule(s); }

// ---- Chimera ----
// Li & Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with Bidirectional
// Pipelines" (SC'21). Two pipelines over the same pp ranks in opposite directions
// (ScheduleShape::bidirectional): rank r holds stage r of the down pipeline and stage pp-1-r of
// the up one, and each pipeline takes half the micro-batches. While one pipeline fills (its
// first stages busy, its last ones waiting), the other fills from the opposite end, so each
// rank's idle slots of one pipeline take the other's work.
// The order on each rank is found by running both pipelines on unit costs (F and B 1, as the
// paper counts them; transfers free) and letting each idle rank take, of what is ready, a backward first (the oldest
// micro-batch), else a forward (the lowest index within its pipeline, down before up) while
// its stage holds fewer than pp - s micro-batches in flight (1F1B's bound for model stage s).
// Any list taken from such a run is deadlock-free: each action's inputs ran earlier in it.
RankLists chimera_schedule(const ScheduleShape& s) {
  if (!s.bidirectional || s.chunks != 2)
    throw std::invalid_argument("chimera runs two pipelines over the ranks: a bidirectional shape of 2 chunks");
  const int pp = s.pp, m = s.microbatches, half = m / 2, stages = s.stages();
  struct Cell {
    int f_end = -1, b_end = -1;  // completion times (-1: not yet)
  };
  std::vector<std::vector<Cell>> at(static_cast<size_t>(stages), std::vector<Cell>(static_cast<size_t>(m)));
  std::vector<int> busy_until(static_cast<size_t>(pp), 0), in_flight(static_cast<size_t>(stages), 0);
  RankLists out(static_cast<size_t>(pp));
  auto cell = [&](int st, int mb) -> Cell& { return at[static_cast<size_t>(st)][static_cast<size_t>(mb)]; };
  int left = 2 * pp * m;  // each pipeline: pp stages x m/2 micro-batches x (F, B)
  for (int t = 0; left > 0; ++t) {
    if (t > 100 * (pp + m) * 3) throw std::logic_error("chimera: the generator made no progress");
    for (int r = 0; r < pp; ++r) {
      if (busy_until[static_cast<size_t>(r)] > t) continue;
      std::optional<Action> pick;
      int best = 0;
      for (int c = 0; c < 2; ++c) {
        const int st = s.stage_of(r, c), lo = c == 0 ? 0 : half;
        for (int mb = lo; mb < lo + half; ++mb) {
          const Cell& x = cell(st, mb);
          const int nxt = s.next(st), prv = s.prev(st);
          const bool b_ready = x.f_end >= 0 && x.f_end <= t && x.b_end < 0 &&
                               (nxt < 0 || (cell(nxt, mb).b_end >= 0 && cell(nxt, mb).b_end <= t));
          const bool f_ready = x.f_end < 0 && (prv < 0 || (cell(prv, mb).f_end >= 0 && cell(prv, mb).f_end <= t)) &&
                               in_flight[static_cast<size_t>(st)] < pp - s.model_stage(st);
          // Rank of a choice: backwards first, by micro-batch; then forwards by index in their pipeline.
          const int score = b_ready ? mb : f_ready ? 4 * m + 2 * (mb - lo) + c : -1;
          if (score >= 0 && (!pick || score < best)) pick = Action{st, b_ready ? Kind::B : Kind::F, mb, c}, best = score;
        }
      }
      if (!pick) continue;
      Cell& x = cell(pick->stage, pick->microbatch);
      const int cost = 1;
      if (pick->kind == Kind::F) x.f_end = t + cost, ++in_flight[static_cast<size_t>(pick->stage)];
      else x.b_end = t + cost, --in_flight[static_cast<size_t>(pick->stage)];
      busy_until[static_cast<size_t>(r)] = t + cost;
      out[static_cast<size_t>(r)].push_back(*pick);
      --left;
    }
  }
  return out;
}

// ---- the table ----
namespace {

constexpr std::array<GeneratorInfo, 8> kGenerators{{
    {"naive", naive_schedule, false, false, false, "one micro-batch at a time through all stages"},
    {"gpipe", gpipe_schedule, false, false, false, "all forwards, then all backwards (GPipe)"},
    {"1f1b", one_f_one_b_schedule, false, false, false,
     "warm-up forwards, then one forward one backward (PipeDream-flush)"},
    {"interleaved", interleaved_schedule, true, false, false,
     "1F1B over v model chunks per rank (Megatron's virtual pipeline); m a multiple of pp"},
    {"zb-h1", zb_h1_schedule, false, true, false,
     "1F1B with backward split into I and W, W deferred into the bubble (zero bubble H1)"},
    {"pipedream-2bw", pipedream_2bw_schedule, false, false, true,
     "1F1B without a flush between steps, one step of weight staleness (PipeDream-2BW); m >= pp"},
    {"pipedream", pipedream_schedule, false, false, true,
     "1F1B without a flush, an update after every micro-batch, stashed weights (PipeDream); m >= pp"},
    {"chimera", chimera_schedule, false, false, false,
     "two pipelines in opposite directions over the same ranks, half the micro-batches each (Chimera); pp and m even"},
}};

}  // namespace

std::span<const GeneratorInfo> generators() { return kGenerators; }

const GeneratorInfo& find_generator(std::string_view name) {
  std::string known;
  for (const GeneratorInfo& g : kGenerators) {
    if (g.name == name) return g;
    known += (known.empty() ? "" : ", ") + std::string(g.name);
  }
  throw std::invalid_argument("unknown pipeline schedule '" + std::string(name) + "'; choose one of " +
                              known + ".");
}

Schedule make_schedule(std::string_view name, const ScheduleShape& shape) {
  const GeneratorInfo& g = find_generator(name);
  if (shape.pp < 1)
    throw std::invalid_argument("a pipeline needs at least 1 rank (got pp " + std::to_string(shape.pp) + ").");
  if (shape.microbatches < 1)
    throw std::invalid_argument("a pipeline needs at least 1 micro-batch (got " +
                                std::to_string(shape.microbatches) + ").");
  if (shape.chunks < 1)
    throw std::invalid_argument("the chunk count per rank must be at least 1 (got " +
                                std::to_string(shape.chunks) + ").");
  if (!g.multi_chunk && shape.chunks != 1)
    throw std::invalid_argument("schedule " + std::string(g.name) + " runs one chunk per rank (got " +
                                std::to_string(shape.chunks) + "); use interleaved for several.");
  if (name == "chimera") {
    if (shape.pp < 2 || shape.pp % 2 != 0)
      throw std::invalid_argument("schedule chimera pairs rank r with rank pp-1-r; it needs an even pp of 2 or more (got " +
                                  std::to_string(shape.pp) + ")");
    if (shape.microbatches % 2 != 0)
      throw std::invalid_argument("schedule chimera gives each of its two pipelines half the micro-batches; use an even "
                                  "number (got " + std::to_string(shape.microbatches) + ")");
    ScheduleShape two = shape;
    two.chunks = 2, two.bidirectional = true;
    return Schedule{std::string(g.name), two, false, g.generate(two)};
  }
  if (g.asynchronous) {
    if (shape.microbatches < shape.pp)
      throw std::invalid_argument("schedule " + std::string(g.name) + " needs at least as many micro-batches as " +
                                  "pipeline ranks (got " + std::to_string(shape.microbatches) + " for pp " +
                                  std::to_string(shape.pp) + "); use --microbatches " + std::to_string(shape.pp) +
                                  " or more.");
    ScheduleShape unrolled = shape;
    unrolled.microbatches = kUnrolledSteps * shape.microbatches;
    Schedule out{std::string(g.name), unrolled, false, g.generate(unrolled)};
    out.period = shape.microbatches;
    return out;
  }
  return Schedule{std::string(g.name), shape, false, g.generate(shape)};
}

}  // namespace meshtrain::pipeline
