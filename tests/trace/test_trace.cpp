#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/trace/trace.h"
#include "temp_dir.h"

using namespace meshtrain::trace;

TEST(Trace, HiddenShareOfHandMadeTimeline) {
  // Rank 0: backward 0-100, comm 50-150 -> 50 of 100 hidden. Rank 1: comm fully inside compute.
  std::vector<Event> ev = {
      {0, Track::compute, "backward", "backward", 0, 100},  {0, Track::comm, "ar", "comm", 50, 150},
      {0, Track::compute, "optimizer", "optimizer", 150, 160}, {1, Track::compute, "backward", "backward", 0, 100},
      {1, Track::comm, "ar", "comm", 10, 30},                 {1, Track::comm, "ar", "comm", 20, 40}};
  EXPECT_DOUBLE_EQ(hidden_share(ev, 0, {"backward"}), 0.5);
  EXPECT_DOUBLE_EQ(hidden_share(ev, 1, {"backward"}), 1.0);
  EXPECT_DOUBLE_EQ(hidden_share(ev, 2, {"backward"}), 0.0);
  EXPECT_DOUBLE_EQ(busy_us(ev, 1, Track::comm), 30.0);  // union of overlapping spans
}

TEST(Trace, ChromeJsonHasOneProcessPerRankAndTracks) {
  Recorder r;
  { Recorder::Span s(&r, 0, Track::compute, "forward", "forward"); }
  { Recorder::Span s(&r, 1, Track::comm, "all_reduce", "comm"); }
  meshtrain::testing::TempDir tmp("trace");
  std::filesystem::path path = tmp.file("trace.json");
  r.write_chrome_json(path.string());
  nlohmann::json j;
  std::ifstream(path) >> j;
  int spans = 0, names = 0;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
    if (e["ph"] == "M" && e["name"] == "process_name") ++names;
  }
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(names, 2);
}
