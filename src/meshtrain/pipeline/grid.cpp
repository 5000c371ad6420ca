// Text pictures of schedules; see grid.h.
#include "meshtrain/pipeline/grid.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace meshtrain::pipeline {

namespace {

std::string pad(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string format_lists(const Schedule& schedule, const std::optional<Fault>& mark) {
  const int ranks = static_cast<int>(schedule.ranks.size());
  std::vector<std::vector<std::string>> cols(ranks);
  for (int r = 0; r < ranks; ++r) {
    for (int p = 0; p < static_cast<int>(schedule.ranks[r].size()); ++p) {
      std::string cell = to_string(schedule.ranks[r][p]);
      if (mark && mark->rank == r && mark->position == p) {
        cell.insert(cell.begin(), '[');
        cell += ']';
      }
      cols[r].push_back(cell);
    }
    if (mark && mark->rank == r && mark->position == static_cast<int>(schedule.ranks[r].size())) {
      std::string cell = "[";  // appended piece by piece: GCC 12 misreports "[" + string (-Wrestrict)
      cell += to_string(mark->action);
      cell += "?]";
      cols[r].push_back(cell);
    }
  }
  std::size_t width = 6, rows = 0;
  for (const auto& c : cols) {
    rows = std::max(rows, c.size());
    for (const auto& cell : c) width = std::max(width, cell.size());
  }
  width += 2;
  std::string out = pad("step", 6);
  for (int r = 0; r < ranks; ++r) out += pad("rank " + std::to_string(r), width);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += "\n";
  for (std::size_t i = 0; i < rows; ++i) {
    std::string line = pad(std::to_string(i), 6);
    for (int r = 0; r < ranks; ++r) line += pad(i < cols[r].size() ? cols[r][i] : "", width);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string format_timeline(const Timeline& timeline, double quantum) {
  const int ranks = static_cast<int>(timeline.ranks.size());
  const int columns = static_cast<int>(std::ceil(timeline.makespan / quantum - 1e-9));
  std::size_t width = 3;
  for (const auto& list : timeline.ranks)
    for (const TimedAction& t : list)
      if (is_compute(t.action.kind)) width = std::max(width, to_string(t.action).size());
  width += 1;
  std::string out = pad("time", 8);
  for (int c = 0; c < columns; ++c) out += pad(std::to_string(c), width);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += "\n";
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> cells(columns, ".");
    for (const TimedAction& t : timeline.ranks[r]) {
      if (!is_compute(t.action.kind)) continue;
      const int first = static_cast<int>(std::floor(t.start / quantum + 1e-9));
      const int last = std::max(first + 1, static_cast<int>(std::ceil(t.end / quantum - 1e-9)));
      for (int c = first; c < last && c < columns; ++c) cells[c] = c == first ? to_string(t.action) : "-";
    }
    std::string line = pad("rank " + std::to_string(r), 8);
    for (const auto& cell : cells) line += pad(cell, width);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace meshtrain::pipeline
