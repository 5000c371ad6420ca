// GEMM rates of the BLAS compiled in (kernels::gemm) on the products of the GPT configs, at
// 1 and 2 threads, plus a 2048^3 square product as the "SGEMM rate" reference. Build once per
// -DMESHTRAIN_BLAS=... (the library cannot be swapped inside one binary) and compare; the
// table and the command live in docs/benchmarks.md ("## Kernels").
// Names: <model>/<layer>/<fwd|dinp|dw>/threads:<t>; counter GFLOPs = 2 M N K / time.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/kernels/gemm.h"

using namespace meshtrain::kernels;

namespace {

// ---- shapes ----
struct Model {
  const char* name;
  int64_t d, n, vocab;  // width, tokens per step (B*T), vocabulary
};
constexpr Model kModels[] = {
    {"gpt-tiny", 128, 768, 256}, {"gpt-small", 384, 2048, 256}, {"gpt2-124m", 768, 256, 50257}};

struct Product {
  Trans ta, tb;
  int64_t M, N, K;
};

std::vector<float> filled(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(g);
  return x;
}

void run(benchmark::State& state, Product p, int threads) {
  const int64_t rowsA = p.ta == Trans::N ? p.M : p.K, colsA = p.ta == Trans::N ? p.K : p.M;
  const int64_t rowsB = p.tb == Trans::N ? p.K : p.N, colsB = p.tb == Trans::N ? p.N : p.K;
  auto A = filled(rowsA * colsA), B = filled(rowsB * colsB), C = filled(p.M * p.N);
  for (auto _ : state) {
    gemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f, A.data(), colsA, B.data(), colsB, 0.0f, C.data(), p.N,
         {threads});
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * p.M * p.N * p.K * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(gemm_backend());
}

// A linear layer inp(N, C) @ W(C, OC): forward NN, dinp = dout W^T (NT), dW = inp^T dout (TN).
void add_linear(const std::string& prefix, int64_t N, int64_t C, int64_t OC, int threads) {
  const Product fwd{Trans::N, Trans::N, N, OC, C};
  const Product dinp{Trans::N, Trans::T, N, C, OC};
  const Product dw{Trans::T, Trans::N, C, OC, N};
  const std::string t = "/threads:" + std::to_string(threads);
  benchmark::RegisterBenchmark((prefix + "/fwd" + t).c_str(), run, fwd, threads)
      ->UseRealTime();
  benchmark::RegisterBenchmark((prefix + "/dinp" + t).c_str(), run, dinp, threads)
      ->UseRealTime();
  benchmark::RegisterBenchmark((prefix + "/dw" + t).c_str(), run, dw, threads)
      ->UseRealTime();
}

// The tied lm_head: logits(N, V) = inp(N, d) wte(V, d)^T; dinp = dlogits wte (NN);
// dwte(V, d) += dlogits^T inp (TN).
void add_lm_head(const std::string& prefix, int64_t N, int64_t d, int64_t V, int threads) {
  const std::string t = "/threads:" + std::to_string(threads);
  benchmark::RegisterBenchmark((prefix + "/fwd" + t).c_str(), run,
                               Product{Trans::N, Trans::T, N, V, d}, threads)
      ->UseRealTime();
  benchmark::RegisterBenchmark((prefix + "/dinp" + t).c_str(), run,
                               Product{Trans::N, Trans::N, N, d, V}, threads)
      ->UseRealTime();
  benchmark::RegisterBenchmark((prefix + "/dw" + t).c_str(), run,
                               Product{Trans::T, Trans::N, V, d, N}, threads)
      ->UseRealTime();
}

int register_all() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(("square2048/fwd/threads:" + std::to_string(threads)).c_str(),
                                 run, Product{Trans::N, Trans::N, 2048, 2048, 2048}, threads)
        ->UseRealTime();
    for (const Model& m : kModels) {
      const std::string p = m.name;
      add_linear(p + "/qkv", m.n, m.d, 3 * m.d, threads);
      add_linear(p + "/attn_proj", m.n, m.d, m.d, threads);
      add_linear(p + "/fc", m.n, m.d, 4 * m.d, threads);
      add_linear(p + "/proj", m.n, 4 * m.d, m.d, threads);
      add_lm_head(p + "/lm_head", m.n, m.d, m.vocab, threads);
    }
  }
  return 0;
}
const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
