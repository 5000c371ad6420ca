// The run every layout test compares against the single-rank one: gpt-tiny at B=12, T=32 for
// 30 steps on a small generated corpus, one kernel thread per rank.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "meshtrain/train/trainer.h"
#include "temp_dir.h"

namespace meshtrain::testing {

// Written once per test process into its own temporary directory (removed at exit).
inline std::string layout_corpus_path() {
  static TempDir dir("layout");
  static std::string path = [] {
    const std::string p = dir.file("corpus.txt");
    std::ofstream f(p);
    const char* lines[] = {"It is a truth universally acknowledged, that a single man\n",
                           "in possession of a good fortune, must be in want of a wife.\n",
                           "However little known the feelings or views of such a man\n",
                           "may be on his first entering a neighbourhood, this truth\n"};
    for (int i = 0; i < 600; ++i) f << lines[(i * 7) % 4];
    return p;
  }();
  return path;
}

inline train::TrainOptions layout_options(int dp) {
  train::TrainOptions o;
  o.model = "gpt-tiny";
  o.data = layout_corpus_path();
  o.batch = 12;
  o.seq = 32;
  o.steps = 30;
  o.optim.warmup_steps = 5;
  o.eval_every = 0;
  o.eval_batches = 2;
  o.quiet = true;
  o.threads = 1;
  o.dp = dp;
  return o;
}

// One cell of a layout matrix: gpt-tiny at B=12 over (dp, tp, pp), a ZeRO stage and a
// schedule, two micro-batches when pipelined (3 or 6 rows each), and its printable name.
inline train::TrainOptions matrix_options(int steps, int dp, int tp, int pp, int zero, const std::string& schedule) {
  auto o = layout_options(dp);
  o.steps = steps;
  o.tp = tp;
  o.pp = pp;
  o.zero = zero;
  o.schedule = schedule;
  o.microbatches = pp > 1 ? 2 : 1;
  return o;
}

inline std::string matrix_name(int dp, int tp, int pp, int zero, const std::string& schedule) {
  return "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_zero" +
         std::to_string(zero) + "_" + (schedule == "1f1b" ? std::string("onef1b") : schedule);
}

}  // namespace meshtrain::testing
