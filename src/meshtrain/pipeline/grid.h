// Text pictures of schedules, for logs, error messages and tests.
//
// format_lists: the lists themselves, one row per position and one column per rank (PyTorch's
// format_pipeline_order); a fault from validate() is shown by bracketing its cell, and a
// missing action gets a row of its own at the end of its rank's column, as "[1B3?]".
//
// format_timeline: a simulated run as the swimlane the papers draw, one row per rank and one
// column per `quantum` of time. A compute action writes its name in its first column and '-'
// in the others; '.' is idle. Communication is not drawn (its cost is usually 0 here).
// Actions that do not start on a multiple of the quantum are placed in the column they start in.
#pragma once

#include <optional>
#include <string>

#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/simulate.h"

namespace meshtrain::pipeline {

std::string format_lists(const Schedule& schedule, const std::optional<Fault>& mark = std::nullopt);
std::string format_timeline(const Timeline& timeline, double quantum = 1);

}  // namespace meshtrain::pipeline
