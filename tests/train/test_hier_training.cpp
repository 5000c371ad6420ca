// --allreduce hier on emulated hosts (--ranks-per-host): data parallelism over 2 hosts x 2
// ranks trains on the default all-reduce's loss curve (gpt-tiny and resnet-small), sends fewer
// bytes across hosts, and the host options are refused with a sentence where they cannot work.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cnn_runs.h"
#include "meshtrain/train/trainer.h"
#include "temp_dir.h"

using namespace meshtrain;
using meshtrain::testing::expect_same_curve;
using meshtrain::testing::losses;
using meshtrain::testing::max_rel;
using meshtrain::testing::TempDir;

namespace {

// A text of a few repeated sentences: enough for gpt-tiny's windows.
std::string corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; text.size() < 20000; ++i) {
    text += "ranks on one host share memory; hosts share a slower wire. ";
    text += std::to_string(i % 97);
    text += '\n';
  }
  std::ofstream(dir.file("corpus.txt")) << text;
  return dir.file("corpus.txt");
}

// gpt-tiny on `data` with the short CNN runs' settings (cnn_runs.h: SGD, batch 16 in 2
// micro-batches, one thread a rank), 5 steps of 32 tokens at dp 4.
train::TrainOptions gpt_options(const std::string& data) {
  train::TrainOptions o = meshtrain::testing::cnn_options("gpt-tiny", 4, 1, 0);
  o.data = data;
  o.seq = 32;
  o.steps = 5;
  return o;
}

uint64_t cross_host_bytes(const train::TrainResult& r) {
  uint64_t b = 0;
  for (const auto& s : r.steps) b += s.comm_bytes_cross_host;
  return b;
}

// The default all-reduce and hier on 2 hosts x 2 ranks: the same curve; hier sends less across.
void expect_hier_on_the_default_curve(train::TrainOptions o, const std::string& what) {
  const train::TrainResult flat = [&] {
    train::TrainOptions f = o;
    f.ranks_per_host = 2;  // emulated hosts, default all-reduce: counts what a flat one sends across
    return train::train(f);
  }();
  o.ranks_per_host = 2;
  o.allreduce = "hier";
  const train::TrainResult hier = train::train(o);
  expect_same_curve(losses(flat), losses(hier), what);
  std::printf("%s: hier against the default all-reduce: max relative difference %.2e (%s); cross-host bytes %llu "
              "against %llu\n",
              what.c_str(), max_rel(losses(flat), losses(hier)), losses(flat) == losses(hier) ? "bit-identical" : "not bit-identical",
              static_cast<unsigned long long>(cross_host_bytes(hier)), static_cast<unsigned long long>(cross_host_bytes(flat)));
  EXPECT_GT(cross_host_bytes(hier), 0u) << what;
  EXPECT_LT(cross_host_bytes(hier), cross_host_bytes(flat)) << what;
}

}  // namespace

TEST(HierTraining, GptTinyOnTwoHostsFollowsTheDefaultCurve) {
  TempDir dir("hier_gpt");
  expect_hier_on_the_default_curve(gpt_options(corpus(dir)), "gpt-tiny dp 4");
}

TEST(HierTraining, ResnetSmallOnTwoHostsFollowsTheDefaultCurve) {
  train::TrainOptions o = meshtrain::testing::cnn_options("resnet-small", 4, 1, 0);
  o.steps = 4;
  expect_hier_on_the_default_curve(o, "resnet-small dp 4");
}

TEST(HierTraining, HostOptionsThatCannotWorkAreRefused) {
  TempDir dir("hier_refused");
  const std::string data = corpus(dir);
  auto refused = [&](auto edit, const std::string& words) {
    train::TrainOptions o = gpt_options(data);
    edit(o);
    try {
      train::train(o);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([](train::TrainOptions& o) { o.allreduce = "hier"; }, "--ranks-per-host K");  // one host
  refused([](train::TrainOptions& o) { o.allreduce = "hier", o.ranks_per_host = 4; }, "smaller --ranks-per-host");
  refused([](train::TrainOptions& o) { o.ranks_per_host = 3; }, "does not divide the 4 ranks");
  refused([](train::TrainOptions& o) { o.ranks_per_host = -1; }, "at least 1");
  refused([](train::TrainOptions& o) { o.allreduce = "hier", o.ranks_per_host = 2, o.zero = 2; }, "reduce-scatters");
  refused([](train::TrainOptions& o) { o.allreduce = "bogus"; }, "--allreduce must be");
  // tp 2 x dp 3 on hosts of 3: the dp group {0, 2, 4} has 2 ranks on host 0 and 1 on host 1.
  refused([](train::TrainOptions& o) { o.allreduce = "hier", o.ranks_per_host = 3, o.dp = 3, o.tp = 2, o.batch = 12; },
          "as many data-parallel ranks on each host");
}
