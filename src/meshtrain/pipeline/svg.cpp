// Swimlanes as SVG; see svg.h for what a picture holds.
#include "meshtrain/pipeline/svg.h"

#include "meshtrain/io/file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

namespace meshtrain::pipeline {

namespace {

// ---- layout (pixels) ----
constexpr double kLeft = 70;       // lane names
constexpr double kRight = 24;
constexpr double kTop = 62;        // below the title and the legend
constexpr double kLaneHeight = 26;
constexpr double kBlockHeight = 20;
constexpr double kCharWidth = 0.62;  // average glyph width of the sans-serif font, per px of size
constexpr double kLabelSize = 11;

// ---- colours ----
struct KnownKind {
  const char* kind;
  const char* name;
  const char* colour;
};
constexpr std::array<KnownKind, 5> kKnown{{{"F", "forward", "#4e79a7"},
                                           {"B", "backward", "#59a14f"},
                                           {"I", "input gradient", "#76b7b2"},
                                           {"W", "weight gradient", "#edc948"},
                                           {"comm", "communication", "#bab0ac"}}};
constexpr std::array<const char*, 5> kPalette{"#b07aa1", "#e15759", "#f28e2b", "#9c755f", "#ff9da7"};

// Dark fills get white text, light fills black.
const char* text_colour(const std::string& fill) {
  const int r = std::stoi(fill.substr(1, 2), nullptr, 16), g = std::stoi(fill.substr(3, 2), nullptr, 16),
            b = std::stoi(fill.substr(5, 2), nullptr, 16);
  return 0.299 * r + 0.587 * g + 0.114 * b < 140 ? "#ffffff" : "#000000";
}

// The kinds of the picture in legend order, each with its colour.
std::vector<std::pair<std::string, std::string>> legend_of(const std::vector<SwimBlock>& blocks) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const KnownKind& k : kKnown)
    if (std::any_of(blocks.begin(), blocks.end(), [&](const SwimBlock& b) { return b.kind == k.kind; }))
      out.emplace_back(k.kind, k.colour);
  std::size_t next = 0;
  for (const SwimBlock& b : blocks) {
    const bool known = std::any_of(kKnown.begin(), kKnown.end(), [&](const KnownKind& k) { return b.kind == k.kind; });
    const bool listed = std::any_of(out.begin(), out.end(), [&](const auto& e) { return e.first == b.kind; });
    if (!known && !listed) out.emplace_back(b.kind, kPalette[next++ % kPalette.size()]);
  }
  return out;
}

// ---- text ----
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  return out;
}

// A coordinate: at most two decimals, no trailing zeros.
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// A tick label with as many decimals as the tick step needs.
std::string tick_label(double v, double step) {
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  return s.find_first_not_of("-0.") == std::string::npos ? std::string("0") : s;
}

}  // namespace

// ---- the generic writer ----

std::string kind_name(const std::string& kind) {
  for (const KnownKind& k : kKnown)
    if (kind == k.kind) return k.name;
  return kind;
}

std::vector<double> axis_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  target = std::max(1, target);
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  const double first = std::floor(lo / step + 1e-9);
  const double last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double i = first; i <= last + 0.5; i += 1) ticks.push_back(i * step);
  if (ticks.size() < 2) ticks.push_back((last + 1) * step);
  return ticks;
}

std::string to_svg(const Swimlane& s) {
  const int lanes = static_cast<int>(s.lanes.size());
  double t_end = s.start;
  for (const SwimBlock& b : s.blocks) {
    if (b.lane < 0 || b.lane >= lanes)
      throw std::invalid_argument("swimlane block '" + b.label + "' names lane " + std::to_string(b.lane) +
                                  ", but the picture has " + std::to_string(lanes) + " lanes.");
    if (!(b.end >= b.start))
      throw std::invalid_argument("swimlane block '" + b.label + "' on lane " + std::to_string(b.lane) +
                                  " ends before it starts.");
    t_end = std::max(t_end, b.end);
  }
  for (double t : s.boundaries) t_end = std::max(t_end, t);

  // The axis runs from start to the first round tick at or after the last event.
  std::vector<double> ticks = axis_ticks(s.start, t_end);
  const double step = ticks[1] - ticks[0];
  const double t_hi = ticks.back();
  std::erase_if(ticks, [&](double t) { return t < s.start - 1e-9 * step; });
  const double span = t_hi - s.start;

  // Auto width: wide enough for every label at the full label size.
  double width = s.width;
  if (width <= 0) {
    double px_per_unit = 0;
    for (const SwimBlock& b : s.blocks)
      if (b.end > b.start)
        px_per_unit = std::max(px_per_unit, (b.label.size() * kCharWidth * kLabelSize + 6) / (b.end - b.start));
    width = std::clamp(px_per_unit * span, 480.0, 2400.0);
  }
  const double scale = width / span;
  auto x_of = [&](double t) { return kLeft + (t - s.start) * scale; };

  const auto legend = legend_of(s.blocks);
  std::map<std::string, std::string> colour(legend.begin(), legend.end());
  double legend_end = kLeft;
  for (const auto& entry : legend)
    legend_end += 18 + (entry.first.size() + 1 + kind_name(entry.first).size()) * 7.0 + 16;  // at most

  const double axis_y = kTop + lanes * kLaneHeight + 4;
  const double total_w = std::max({kLeft + width + kRight, legend_end + kRight,
                                    kLeft + s.title.size() * 8.0 + kRight});
  const double total_h = axis_y + 48;

  std::string out;
  out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(total_w) + "\" height=\"" + num(total_h) +
         "\" viewBox=\"0 0 " + num(total_w) + " " + num(total_h) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out += std::string(kSvgMark) + "\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  out += "<text class=\"title\" x=\"" + num(kLeft) + "\" y=\"22\" font-size=\"14\" font-weight=\"bold\">" +
         escape(s.title) + "</text>\n";

  // ---- legend ----
  out += "<g class=\"legend\">\n";
  double lx = kLeft;
  for (const auto& [kind, c] : legend) {
    const std::string name = kind_name(kind);
    const std::string text = name == kind ? kind : kind + " " + name;  // "F forward"; "optimizer"
    out += "<g class=\"legend-entry\" data-kind=\"" + escape(kind) + "\"><rect x=\"" + num(lx) +
           "\" y=\"34\" width=\"12\" height=\"12\" fill=\"" + c + "\"/><text x=\"" + num(lx + 18) + "\" y=\"44\">" +
           escape(text) + "</text></g>\n";
    lx += 18 + text.size() * 7.0 + 16;
  }
  out += "</g>\n";

  // ---- lanes ----
  for (int l = 0; l < lanes; ++l) {
    const double y = kTop + l * kLaneHeight;
    out += "<text class=\"lane-name\" x=\"6\" y=\"" + num(y + kLaneHeight / 2 + 4) + "\">" + escape(s.lanes[l]) +
           "</text>\n";
    out += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(y + kLaneHeight) + "\" x2=\"" + num(kLeft + width) +
           "\" y2=\"" + num(y + kLaneHeight) + "\" stroke=\"#eeeeee\"/>\n";
  }
  for (const SwimBlock& b : s.blocks) {
    const double x = x_of(b.start), w = std::max(0.5, (b.end - b.start) * scale);
    const double y = kTop + b.lane * kLaneHeight + (kLaneHeight - kBlockHeight) / 2;
    const std::string& fill = colour.at(b.kind);
    out += "<g class=\"block\" data-lane=\"" + std::to_string(b.lane) + "\" data-kind=\"" + escape(b.kind) +
           "\"><rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
           num(kBlockHeight) + "\" fill=\"" + fill + "\" stroke=\"#ffffff\" stroke-width=\"0.5\"/>";
    const double size = b.label.empty() ? 0 : std::min(kLabelSize, (w - 3) / (b.label.size() * kCharWidth));
    if (size >= 4)
      out += "<text x=\"" + num(x + w / 2) + "\" y=\"" + num(y + kBlockHeight / 2 + size * 0.35) +
             "\" text-anchor=\"middle\" font-size=\"" + num(size) + "\" fill=\"" + text_colour(fill) + "\">" +
             escape(b.label) + "</text>";
    out += "<title>" + escape(b.tooltip.empty() ? b.label : b.tooltip) + "</title></g>\n";
  }

  // ---- boundaries ----
  for (double t : s.boundaries)
    out += "<line class=\"boundary\" x1=\"" + num(x_of(t)) + "\" y1=\"" + num(kTop - 4) + "\" x2=\"" + num(x_of(t)) +
           "\" y2=\"" + num(axis_y) + "\" stroke=\"#333333\" stroke-dasharray=\"4 3\"/>\n";

  // ---- time axis ----
  out += "<g class=\"axis\">\n";
  out += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(axis_y) + "\" x2=\"" + num(kLeft + width) + "\" y2=\"" +
         num(axis_y) + "\" stroke=\"#000000\"/>\n";
  for (double t : ticks) {
    const double x = x_of(t);
    out += "<line class=\"tick\" x1=\"" + num(x) + "\" y1=\"" + num(axis_y) + "\" x2=\"" + num(x) + "\" y2=\"" +
           num(axis_y + 5) + "\" stroke=\"#000000\"/><text class=\"tick-label\" x=\"" + num(x) + "\" y=\"" +
           num(axis_y + 18) + "\" text-anchor=\"middle\" font-size=\"10\">" + tick_label(t, step) + "</text>\n";
  }
  out += "<text class=\"axis-caption\" x=\"" + num(kLeft + width / 2) + "\" y=\"" + num(axis_y + 38) +
         "\" text-anchor=\"middle\">" + escape(s.axis_caption) + "</text>\n";
  out += "</g>\n</svg>\n";
  return out;
}

void write_svg(const Swimlane& swimlane, const std::string& path) {
  io::write_file_atomic(path, to_svg(swimlane), "the swimlane file");
}

// ---- simulated schedules ----

Swimlane swimlane_of(const Schedule& schedule, const Timeline& timeline, const std::string& title) {
  Swimlane s;
  s.title = title;
  s.axis_caption = "time (cost units of the simulator)";
  const bool chunks = schedule.shape.chunks > 1;
  for (std::size_t r = 0; r < timeline.ranks.size(); ++r) {
    s.lanes.push_back("rank " + std::to_string(r));
    for (const TimedAction& t : timeline.ranks[r]) {
      const bool compute = is_compute(t.action.kind);
      if (!compute && !(t.end > t.start)) continue;  // free communication takes no room
      SwimBlock b;
      b.lane = static_cast<int>(r);
      b.start = t.start;
      b.end = t.end;
      b.kind = compute ? to_string(t.action.kind) : "comm";
      b.label = std::to_string(t.action.microbatch);
      if (chunks) {  // appended piece by piece: GCC 12 misreports "c" + string (-Wrestrict)
        b.label += 'c';
        b.label += std::to_string(t.action.chunk);
      }
      b.tooltip = "rank " + std::to_string(r) + ": " + to_string(t.action) + " (stage " +
                  std::to_string(t.action.stage) + ", micro-batch " + std::to_string(t.action.microbatch) +
                  ") from " + num(t.start) + " to " + num(t.end);
      s.blocks.push_back(std::move(b));
    }
  }
  return s;
}

}  // namespace meshtrain::pipeline
