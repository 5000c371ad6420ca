// Tensor-parallel figures for docs/benchmarks.md ("## Tensor parallelism"). Disabled in the
// suite (it times steps); run with
//   test_parallel --gtest_also_run_disabled_tests --gtest_filter='*TPBench*'
// Prints, per layout, against the single-rank peer run in the same process: step time (median
// of 3 after a warm-up), the process's CPU time per step (all ranks and their communication
// threads; least of 3: load inflates wall time far more than CPU time), bytes sent by the tp group per rank per step, the peak of saved
// activations and the parameter bytes of rank 0. Every rank runs its kernels on one thread, so
// tp p uses p cores where tp 1 uses one (on a 2-core machine tp 4 is oversubscribed).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <span>

#include "meshtrain/comm/threads_backend.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"

using namespace meshtrain;

namespace {

double process_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

struct Figures {
  double step_ms = 0, cpu_ms = 0;
  uint64_t bytes = 0;
  int64_t peak_saved = 0, param_bytes = 0;
};

Figures measure(const model::GPTConfig& cfg, int p, bool sp, int64_t B, int64_t T) {
  Figures f;
  auto body = [&](std::shared_ptr<comm::Communicator> tp, int threads) {
    auto gpt = parallel::build_gpt(cfg, 1, tp, {.sequence_parallel = sp});
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (int64_t i = 0; i < B * T; ++i) tok[i] = (i * 7) % 256, tgt[i] = (i * 3 + 1) % 256;
    std::vector<double> ms, cpu;
    int64_t peak = 0;
    uint64_t bytes = 0;
    for (int s = 0; s < 4; ++s) {
      if (tp) tp->barrier();
      if (tp) tp->reset_stats();
      auto t0 = std::chrono::steady_clock::now();
      const double c0 = process_cpu_ms();
      nn::Context ctx(threads);
      gpt->forward(ctx, tok.data(), tgt.data(), B, T);
      gpt->backward(ctx, 1.0f);
      bytes = tp ? tp->stats().bytes_sent : 0;
      if (tp) tp->barrier();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      cpu.push_back(process_cpu_ms() - c0);
      peak = ctx.peak_saved_bytes();
    }
    if (tp && tp->rank() != 0) return;
    ms.erase(ms.begin());
    cpu.erase(cpu.begin());
    std::sort(ms.begin(), ms.end());
    std::sort(cpu.begin(), cpu.end());
    f.step_ms = ms[1];
    f.cpu_ms = cpu[0];
    f.peak_saved = peak;
    f.bytes = bytes;
    for (nn::Param* q : gpt->params()) f.param_bytes += q->value.bytes();
  };
  if (p == 1) {
    body(nullptr, 1);
  } else {
    comm::run_threads(p, [&](comm::Communicator& world) {
      parallel::DeviceMesh mesh(world, {1, p, 1});
      body(mesh.tp_ptr(), 1);
    });
  }
  return f;
}

void report(const model::GPTConfig& cfg, int64_t B, int64_t T, std::vector<std::pair<int, bool>> layouts) {
  Figures base = measure(cfg, 1, false, B, T);
  std::printf("[ tp bench ] %s B=%lld T=%lld\n", cfg.name.c_str(), static_cast<long long>(B),
              static_cast<long long>(T));
  std::printf("| layout | step ms (wall) | vs tp 1 | CPU ms, all ranks | vs tp 1 | tp bytes/rank/step | peak saved activations (MiB) | vs tp 1 | parameter MiB/rank |\n");
  auto row = [&](const char* name, const Figures& f) {
    std::printf("| %s | %.1f | %.2fx | %.1f | %.2fx | %llu | %.2f | %.2fx | %.2f |\n", name,
                f.step_ms, f.step_ms / base.step_ms, f.cpu_ms, f.cpu_ms / base.cpu_ms,
                static_cast<unsigned long long>(f.bytes),
                f.peak_saved / 1048576.0, static_cast<double>(f.peak_saved) / base.peak_saved,
                f.param_bytes / 1048576.0);
  };
  row("tp 1", base);
  EXPECT_GT(base.step_ms, 0.0);
  for (auto [p, sp] : layouts) {
    std::string name = "tp " + std::to_string(p) + (sp ? " + SP" : "");
    Figures f = measure(cfg, p, sp, B, T);
    row(name.c_str(), f);
    // What tensor parallelism is for, checked on the measured figures: the tp group moved
    // bytes, and each rank holds fewer parameters and saved activations than one rank does.
    EXPECT_GT(f.bytes, 0u) << name;
    EXPECT_LT(f.param_bytes, base.param_bytes) << name;
    EXPECT_LT(f.peak_saved, base.peak_saved) << name;
  }
}

}  // namespace

TEST(TPBench, DISABLED_StepTimeBytesAndMemory) {
  report(model::gpt_config("gpt-tiny"), 12, 64, {{2, false}, {2, true}, {4, false}, {4, true}});
  report(model::gpt_config("gpt-small"), 4, 128, {{2, false}, {2, true}});
}
