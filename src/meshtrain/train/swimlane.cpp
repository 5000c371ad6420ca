#include "meshtrain/train/swimlane.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "meshtrain/io/json.h"

namespace meshtrain::train {

namespace {

// "forward 3 (stage 1)" or "input gradient 3" -> "3": the first number; none gives "".
std::string microbatch_label(const std::string& name) {
  const size_t start = name.find_first_of("0123456789");
  if (start == std::string::npos) return "";
  const size_t end = name.find_first_not_of("0123456789", start);
  return name.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

std::string kind_of(const trace::Event& e) {
  if (e.category == "forward") return "F";
  if (e.category == "backward") return "B";
  if (e.category == "input-grad") return "I";
  if (e.category == "weight-grad") return "W";
  if (e.track == trace::Track::comm) return "comm";
  return e.category;  // optimizer, wait, ...
}

}  // namespace

pipeline::Swimlane measured_swimlane(const std::vector<trace::Event>& events, const std::string& title) {
  double t0 = std::numeric_limits<double>::infinity();
  for (const auto& e : events)
    if (e.category == "forward") t0 = std::min(t0, e.t0_us);
  if (!std::isfinite(t0)) throw std::invalid_argument("the trace holds no forward computation to draw");
  // Lanes: every rank's compute track, then its communication track when it has events.
  std::map<std::pair<int, int>, int> lane_of;  // (rank, track) -> lane
  std::vector<std::pair<int, int>> keys;
  for (const auto& e : events)
    if (e.track != trace::Track::kernels) keys.push_back({e.rank, e.track == trace::Track::comm ? 1 : 0});
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  pipeline::Swimlane lane;
  lane.title = title;
  lane.axis_caption = "time (ms) from the first step";
  for (auto& k : keys) {
    lane_of[k] = static_cast<int>(lane.lanes.size());
    lane.lanes.push_back("rank " + std::to_string(k.first) + (k.second ? " comm" : ""));
  }
  for (const auto& e : events) {
    if (e.t1_us < t0) continue;  // start-up (before the first step)
    if (e.track == trace::Track::kernels) continue;  // inside the compute blocks drawn
    pipeline::SwimBlock b;
    b.lane = lane_of[{e.rank, e.track == trace::Track::comm ? 1 : 0}];
    b.start = (std::max(e.t0_us, t0) - t0) / 1e3;
    b.end = (e.t1_us - t0) / 1e3;
    b.kind = kind_of(e);
    b.label = (b.kind == "F" || b.kind == "B" || b.kind == "I" || b.kind == "W") ? microbatch_label(e.name) : "";
    b.tooltip = e.name;
    lane.blocks.push_back(b);
  }
  // Step boundaries: where the lowest rank's optimizer ends (the step's last action there).
  const int first_rank = keys.front().first;
  for (const auto& e : events)
    if (e.rank == first_rank && e.category == "optimizer" && e.t1_us >= t0) lane.boundaries.push_back((e.t1_us - t0) / 1e3);
  std::sort(lane.boundaries.begin(), lane.boundaries.end());
  lane.boundaries.insert(lane.boundaries.begin(), 0.0);
  return lane;
}

std::vector<trace::Event> read_chrome_trace(const std::string& path) {
  // The strict reading (io/json.h): a key given twice or an overflowing number is refused.
  const nlohmann::json doc =
      io::read_json_file_strict(path, "the trace " + path, "give the JSON file `train --trace` wrote");
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
    throw std::invalid_argument(path + " has no traceEvents array; give the file `train --trace` wrote");
  std::vector<trace::Event> out;
  try {
    for (const auto& e : doc["traceEvents"]) {
      if (e.value("ph", "") != "X") continue;
      trace::Event ev;
      ev.rank = e.at("pid").get<int>();
      const int tid = e.at("tid").get<int>();
      ev.track = tid == 1 ? trace::Track::comm : tid == 2 ? trace::Track::kernels : trace::Track::compute;
      ev.name = e.at("name").get<std::string>();
      ev.category = e.value("cat", "");
      ev.t0_us = e.at("ts").get<double>();
      ev.t1_us = ev.t0_us + e.at("dur").get<double>();
      out.push_back(ev);
    }
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(path + " holds an event without pid, tid, name, ts or dur; give the file `train --trace` wrote");
  }
  return out;
}

}  // namespace meshtrain::train
