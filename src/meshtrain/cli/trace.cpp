// `meshtrain trace render FILE.json -o FILE.svg`: draws the measured swimlane of a run's trace
// (train/swimlane.h) — the same picture `train --trace` writes beside its JSON.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "meshtrain/cli/commands.h"
#include "meshtrain/pipeline/svg.h"
#include "meshtrain/train/swimlane.h"

namespace meshtrain::cli {

namespace {
struct RenderOptions {
  std::string input, output;
};

void render(const RenderOptions& o) {
  const std::filesystem::path out(o.output);
  if (!out.parent_path().empty() && !std::filesystem::is_directory(out.parent_path()))
    throw UsageError("-o " + o.output + ": the directory " + out.parent_path().string() + " does not exist");
  std::vector<trace::Event> events;
  pipeline::Swimlane lane;
  try {
    events = train::read_chrome_trace(o.input);
    lane = train::measured_swimlane(events, "measured: " + std::filesystem::path(o.input).filename().string());
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  pipeline::write_svg(lane, o.output);
  std::printf("swimlane: %s (%zu events, %zu lanes)\n", o.output.c_str(), lane.blocks.size(), lane.lanes.size());
}
}  // namespace

void add_trace_command(CLI::App& app) {
  CLI::App* trace = app.add_subcommand("trace", "Work with run traces (train --trace)");
  trace->require_subcommand(1);
  auto opt = std::make_shared<RenderOptions>();
  CLI::App* r = trace->add_subcommand("render", "Draw a trace's measured swimlane as SVG");
  r->add_option("trace", opt->input, "The Chrome-trace JSON written by train --trace")->required();
  r->add_option("-o,--output", opt->output, "The SVG file to write")->required();
  r->callback([opt] { render(*opt); });
}

}  // namespace meshtrain::cli
