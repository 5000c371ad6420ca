// A network meshtrain does not ship, written in code with the graph builder (its calls mirror a
// model file's JSON fields, docs/models.md), trained on Fashion-MNIST at one rank and at
// dp 2 x pp 2 (four ranks, threads of this process). Prints both loss curves and exits 1 if they
// part by more than 1e-5 relative: every layout gives the single-rank curve.
//
//   train_my_net [DATA]   DATA: fashion-mnist (the Debian package, default) or a folder of IDX files
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include "meshtrain/model/builder.h"
#include "meshtrain/train/trainer.h"

namespace mt = meshtrain;

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "fashion-mnist";
  // A residual CNN: a 3x3 stem, a block whose output is added back to the stem's, a pool and a
  // two-layer classifier (column- then row-parallel under --tp).
  mt::model::GraphBuilder g("my-net", {1, 28, 28}, 10);
  g.conv2d("stem", {.out_channels = 16, .kernel_size = 3, .padding = 1, .bias = false})
      .batchnorm2d("stem_bn")
      .relu("stem_relu")
      .conv2d("block.conv", {.out_channels = 16, .kernel_size = 3, .padding = 1})
      .relu("block.relu")
      .add("block.sum", {"stem_relu", "block.relu"})
      .maxpool2d("pool", {.kernel_size = 2})
      .flatten("flat")
      .linear("fc1", {.out_features = 64})
      .relu("fc1_relu")
      .linear("fc2", {.out_features = 10});
  try {
    const auto graph = g.build();
    auto run = [&](int dp, int pp) {
      mt::train::TrainOptions o;
      o.graph = graph;
      o.data = data;
      o.dp = dp, o.pp = pp;
      o.batch = 32, o.microbatches = 2, o.steps = 8, o.threads = 1;
      o.optim.warmup_steps = 2;
      o.eval_every = 0, o.eval_batches = 1;
      o.quiet = true;
      return mt::train::train(o);
    };
    const mt::train::TrainResult one = run(1, 1), mesh = run(2, 2);
    int parted = 0;
    std::printf("step  one rank    dp 2 x pp 2\n");
    for (size_t s = 0; s < one.steps.size(); ++s) {
      const float a = one.steps[s].loss, b = mesh.steps.at(s).loss;
      const bool same = std::abs(a - b) <= 1e-5f * std::abs(a);
      parted += !same;
      std::printf("%4zu  %.6f    %.6f%s\n", s + 1, a, b, same ? "" : "  <- parted");
    }
    std::printf("%s: %zu steps, %s\n", graph->name.c_str(), one.steps.size(),
                parted ? "the curves parted" : "the same curve at both layouts");
    return parted ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_my_net: %s\n", e.what());
    return 2;
  }
}
