// Passes over schedules: add the communication, and validate the order.
//
// add_send_recv puts, around every compute action whose neighbour stage lives on another
// rank, the transfer it needs: RECV_F just before an F (from stage s - 1), SEND_F just after
// it (to stage s + 1), RECV_B just before a B or I (from stage s + 1), SEND_B just after it
// (to stage s - 1). Interleaved stages chain across ranks and wrap from the last rank back to
// the first (stage pp - 1 on the last rank feeds stage pp on rank 0). Stages on the same rank
// (pp = 1 with several chunks) need no transfer. Receives placed just before their use are
// the simplest correct choice; an executor posts them earlier on its own.
//
// validate scans the cells rank by rank, position by position, and reports the FIRST cell
// that breaks a rule (see Fault); after the scan, a missing action is reported at the end of
// the list of the rank that should hold it. Rules:
//   - the action is well-formed: stage in range and placed on this rank as this chunk,
//     micro-batch in range, no duplicate of the same (kind, stage, micro-batch);
//   - F has its input before it: the RECV_F (communication added) or, for a stage on the same
//     rank, the previous stage's F; B / I have their own F before them and the gradient of the
//     next stage (RECV_B, or the same-rank B / I); W has its I before it; a schedule uses
//     either B or I + W for a (stage, micro-batch), never both;
//   - a send comes after the action it sends, has a peer stage, and is matched by exactly one
//     receive on the peer's rank; a receive is matched by exactly one send;
//   - every (stage, micro-batch) has exactly one F and one B or one I and one W.
#pragma once

#include <optional>
#include <string>

#include "meshtrain/pipeline/schedule.h"

namespace meshtrain::pipeline {

Schedule add_send_recv(const Schedule& schedule);

struct Fault {
  int rank = 0;
  int position = 0;  // index into ranks[rank]; == its size for a missing action
  Action action;     // the faulty action, or the missing one
  std::string problem;
  // "rank 1, position 3, action 1B0: ..." — one line.
  std::string to_string() const;
};

// The first broken rule, or nothing when the schedule is valid.
std::optional<Fault> validate(const Schedule& schedule);

}  // namespace meshtrain::pipeline
