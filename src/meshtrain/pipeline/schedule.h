// Pipeline schedules as data: per rank, the ordered list of actions it performs for one step
// (one flush of m micro-batches), and the generators that write them.
//
// Placement. A schedule has pp ranks and v model chunks per rank, so pp * v stages. Stage s
// lives on rank s % pp as that rank's chunk s / pp (Megatron's virtual pipeline: rank r holds
// stages r, r + pp, r + 2 pp, ...). With v = 1 this is one stage per rank, stage r on rank r.
//
// Generators emit compute actions only (F, B, I, W); passes.h adds the communication
// (add_send_recv), checks the order (validate) and proves it runs (dry_run in simulate.h).
//
// Adding a schedule: write one function `RankLists my_schedule(const ScheduleShape&)` in
// generators.cpp and add one row to the table there. Nothing else changes: callers reach it
// by name through make_schedule() / find_generator(), and the passes and the simulator work
// on any list.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/pipeline/action.h"

namespace meshtrain::pipeline {

using RankLists = std::vector<std::vector<Action>>;  // [rank][position]

// What a generator is asked for: pp ranks, m micro-batches, v chunks per rank.
// Stages are numbered 0 .. pp v - 1; stage s is chunk s / pp of rank s % pp and hands its output
// to stage s + 1 (one pipeline, looping over the ranks v times).
// Bidirectional (Chimera): two pipelines over the same ranks in opposite directions, v = 2.
// Stages 0 .. pp-1 are the "down" pipeline (stage s on rank s, chunk 0) and pp .. 2pp-1 the "up"
// one (stage pp + s holds the model's stage s on rank pp-1-s, chunk 1); each pipeline runs half
// the micro-batches (down 0 .. m/2-1, up m/2 .. m-1), and its first stage reads the inputs.
struct ScheduleShape {
  int pp = 1;
  int microbatches = 1;
  int chunks = 1;
  bool bidirectional = false;
  int stages() const { return pp * chunks; }
  int rank_of(int stage) const { return bidirectional && stage >= pp ? 2 * pp - 1 - stage : stage % pp; }
  int chunk_of(int stage) const { return stage / pp; }
  int stage_of(int rank, int chunk) const {
    return bidirectional && chunk == 1 ? 2 * pp - 1 - rank : chunk * pp + rank;
  }
  // The stage whose output this one takes (-1: a pipeline's first stage) and the one it feeds
  // (-1: a pipeline's last stage, which computes the loss).
  int prev(int stage) const { return bidirectional ? (stage % pp == 0 ? -1 : stage - 1) : stage - 1; }
  int next(int stage) const {
    return bidirectional ? (stage % pp == pp - 1 ? -1 : stage + 1) : (stage + 1 < stages() ? stage + 1 : -1);
  }
  // The model's stage a stage holds (bidirectional: both pipelines hold every model stage).
  int model_stage(int stage) const { return bidirectional ? stage % pp : stage; }
  // Whether micro-batch mb passes through the stage (bidirectional: its pipeline's half).
  bool runs(int stage, int mb) const { return !bidirectional || (stage < pp) == (mb < microbatches / 2); }
};

struct Schedule {
  std::string name;        // the generator's name ("1f1b"), or "custom" for hand-made lists
  ScheduleShape shape;
  bool has_comm = false;   // true once add_send_recv ran: F/B then need their RECVs
  RankLists ranks;         // ranks[r]: rank r's actions in the order it performs them
  // Asynchronous schedules (pipedream-2bw, pipedream): the micro-batches of one step. 0 for the others,
  // which flush every step. An asynchronous schedule's lists hold kUnrolledSteps steps one after
  // another without a flush (shape.microbatches = kUnrolledSteps * period, step k's micro-batches
  // k period .. (k + 1) period - 1), so the passes, the simulator and the drawings see what runs;
  // the executor cuts each rank's list into the window one step runs (executor.h).
  int period = 0;
};

inline constexpr int kUnrolledSteps = 3;

using GeneratorFn = RankLists (*)(const ScheduleShape&);

// One row of the generator table.
struct GeneratorInfo {
  std::string_view name;         // "gpipe", "1f1b", ...
  GeneratorFn generate;
  bool multi_chunk;              // accepts chunks > 1 (otherwise chunks must be 1)
  bool splits_backward;          // emits I + W instead of B
  bool asynchronous;             // no flush between steps (Schedule::period)
  std::string_view description;  // one line for --help and docs
};

// All generators, in the order the docs list them.
std::span<const GeneratorInfo> generators();
// The row named `name`; throws std::invalid_argument listing the known names otherwise.
const GeneratorInfo& find_generator(std::string_view name);

// Checks the shape against the generator's constraints (pp >= 1, m >= 1, chunks, and
// interleaved's "m a multiple of pp"), then generates. Throws std::invalid_argument with a
// sentence saying what to change.
Schedule make_schedule(std::string_view name, const ScheduleShape& shape);

// ---- the generators (also reachable through the table) ----
RankLists naive_schedule(const ScheduleShape& shape);
RankLists gpipe_schedule(const ScheduleShape& shape);
RankLists one_f_one_b_schedule(const ScheduleShape& shape);
RankLists interleaved_schedule(const ScheduleShape& shape);
RankLists zb_h1_schedule(const ScheduleShape& shape);
// PipeDream-2BW's order: 1F1B over the micro-batches of consecutive steps (shape.microbatches
// of them) with no flush between steps.
RankLists pipedream_2bw_schedule(const ScheduleShape& shape);
// PipeDream's order: the same, with an update after every micro-batch (train/weight_stash.h).
RankLists pipedream_schedule(const ScheduleShape& shape);
// Chimera's: two pipelines in opposite directions (shape.bidirectional, chunks 2).
RankLists chimera_schedule(const ScheduleShape& shape);

}  // namespace meshtrain::pipeline
