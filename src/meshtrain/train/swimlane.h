// The measured swimlane: a run's trace events (trace/trace.h) drawn as the SVG swimlane of
// pipeline/svg.h — one lane per rank's compute track (and one per communication track that has
// events), F / B / optimizer / communication coloured and labelled with their micro-batch,
// dashed lines at step boundaries, the time axis starting at the first step (start-up left out).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/pipeline/svg.h"
#include "meshtrain/trace/trace.h"

namespace meshtrain::train {

// Events of any number of ranks; `title` heads the picture. Times in milliseconds from the
// first forward of the run. Throws std::invalid_argument when there is no forward to start at.
pipeline::Swimlane measured_swimlane(const std::vector<trace::Event>& events, const std::string& title);

// Reads a Chrome-trace JSON written by `train --trace` back into events; throws
// std::invalid_argument naming the file when it is missing or not such a trace.
std::vector<trace::Event> read_chrome_trace(const std::string& path);

}  // namespace meshtrain::train
