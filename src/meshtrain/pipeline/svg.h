// Swimlanes as SVG: the picture pipeline papers draw, one lane per rank and time to the right.
//
// The writer takes plain blocks — {lane, start, end, kind, label} — so it draws any timeline:
// the ideal one the simulator computes (swimlane_of() below) and, later, a measured trace read
// back from its JSON. It writes plain SVG text and needs no library.
//
// What a picture holds, top to bottom:
//   - a title line;
//   - a legend: one swatch per kind that occurs, in the order F, B, I, W, comm, then any other
//     kind in order of first appearance, each with its name ("F forward", ...);
//   - one lane per entry of Swimlane::lanes, its name at the left; each block a rect coloured
//     by its kind with its label written on it (when the block is wide enough for text of at
//     least 4 px) and a tooltip (<title>);
//   - dashed vertical lines at Swimlane::boundaries (step boundaries of a measured trace);
//   - a time axis from Swimlane::start to the last block end or boundary, with ticks at
//     round values (1, 2 or 5 times a power of ten), their labels and the axis caption.
//
// The elements carry classes so that tests and scripts can read the picture back: a block is
// <g class="block" data-lane=".." data-kind=".."> holding one <rect>, its <text> label and its
// <title>; the legend is <g class="legend"> of <g class="legend-entry" data-kind="..">; the axis
// is <g class="axis"> with a <text class="tick-label"> per tick; boundaries are
// <line class="boundary">.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/pipeline/simulate.h"

namespace meshtrain::pipeline {

// ---- the generic writer ----

struct SwimBlock {
  int lane = 0;            // index into Swimlane::lanes
  double start = 0, end = 0;
  std::string kind;        // colour key: "F", "B", "I", "W", "comm", or any other name
  std::string label;       // written on the block, e.g. the micro-batch number
  std::string tooltip;     // shown on hover; the label when empty
};

struct Swimlane {
  std::string title;
  std::vector<std::string> lanes;  // lane names, top to bottom ("rank 0", ...)
  std::vector<SwimBlock> blocks;
  std::string axis_caption = "time";
  std::vector<double> boundaries;  // dashed vertical lines (step boundaries)
  double start = 0;                // where the time axis begins
  // Width of the drawing area in pixels; 0 picks one where every label fits its block
  // (between 480 and 2400 px).
  double width = 0;
};

// The picture as SVG text. Throws std::invalid_argument when a block names a lane that does
// not exist or ends before it starts.
std::string to_svg(const Swimlane& swimlane);

// The comment every SVG meshtrain writes carries, by which the output policy (train/outputs.h)
// recognises a file it may replace.
inline constexpr const char* kSvgMark = "<!-- written by meshtrain -->";

// Writes to_svg() to `path` atomically (io/file.h); throws io::WriteError (a std::runtime_error)
// naming the path and the cause when it cannot, leaving a previous file at `path` as it was.
void write_svg(const Swimlane& swimlane, const std::string& path);

// Round tick values (1, 2 or 5 times a power of ten) covering [lo, hi], about `target` of
// them, increasing, the first <= lo and the last >= hi.
std::vector<double> axis_ticks(double lo, double hi, int target = 10);

// The legend name of a kind: "F" -> "forward", "B" -> "backward", "I" -> "input gradient",
// "W" -> "weight gradient", "comm" -> "communication"; any other kind is its own name (and is
// coloured from a fixed palette, by order of first appearance in the picture).
std::string kind_name(const std::string& kind);

// ---- simulated schedules ----

// The simulated run as a swimlane: one lane per rank ("rank r"), a block per compute action
// (kind "F", "B", "I" or "W") and per communication action that takes time (kind "comm";
// with the default free communication there are none). The label is the micro-batch, with
// "c<chunk>" after it when the schedule has several chunks per rank ("3c1"). The axis caption
// says the time unit is the simulator's cost unit.
Swimlane swimlane_of(const Schedule& schedule, const Timeline& timeline, const std::string& title);

}  // namespace meshtrain::pipeline
