// `meshtrain trace render FILE.json -o FILE.svg`: draws the measured swimlane of a run's trace
// (train/swimlane.h) — the same picture `train --trace` writes beside its JSON. The paths are
// checked first by the output policy (train/outputs.h): -o must be writable, must not be the
// trace, and must not replace a file meshtrain did not write unless --overwrite is given.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/pipeline/svg.h"
#include "meshtrain/train/outputs.h"
#include "meshtrain/train/swimlane.h"

namespace meshtrain::cli {

namespace {
struct RenderOptions {
  std::string input, output;
  bool overwrite = false;
};

void render(const RenderOptions& o) {
  std::vector<trace::Event> events;
  pipeline::Swimlane lane;
  try {
    // Before anything is read: the output's directory, the trace itself, a file not ours.
    train::PathPlan plan(o.overwrite);
    plan.input_file("the trace", o.input);
    plan.output_file("-o", o.output, train::OutputKind::svg);
    plan.check();
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
  r->add_option("trace", opt->input, "The Chrome-trace JSON written by train --trace")->required()->check(non_empty_path());
  r->add_option("-o,--output", opt->output, "The SVG file to write")->required()->check(non_empty_path());
  r->add_flag("--overwrite", opt->overwrite, "Let -o replace an existing file meshtrain did not write");
  r->callback([opt] { render(*opt); });
}

}  // namespace meshtrain::cli
