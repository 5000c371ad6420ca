// Non-GEMM kernels (and the linear layer, for scale) on the shapes of the GPT configs, at 1
// and 2 threads. Per step and per layer these run once each (attention, layernorm x2, gelu)
// or once per step (embedding, cross-entropy, AdamW over all parameters), so their times
// add directly to the step time; compare with the GEMM products in bench_gemm.
// Names: <model>/<kernel>/threads:<t>; counters: GB/s of the memory a kernel must touch at
// least once, or GFLOPs for attention (causal: half the T x T products).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/kernels/adamw.h"
#include "meshtrain/kernels/attention.h"
#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/kernels/embedding.h"
#include "meshtrain/kernels/gelu.h"
#include "meshtrain/kernels/layernorm.h"
#include "meshtrain/kernels/linear.h"

using namespace meshtrain::kernels;

namespace {

// ---- shapes ----
struct Model {
  const char* name;
  int64_t B, T, d, NH, L, V;
  int64_t params() const { return L * 12 * d * d + (V + T) * d; }
};
constexpr Model kModels[] = {{"gpt-tiny", 12, 64, 128, 4, 4, 256},
                             {"gpt-small", 8, 256, 384, 6, 6, 256},
                             {"gpt2-124m", 4, 64, 768, 12, 12, 50257}};

std::vector<float> filled(int64_t n, float scale = 1.0f) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 g(1);
  std::normal_distribution<float> u(0.0f, scale);
  for (auto& v : x) v = u(g);
  return x;
}

void bytes_rate(benchmark::State& s, double bytes) {
  s.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- kernels ----
void layernorm(benchmark::State& s, Model m, int th, bool bwd) {
  const int64_t N = m.B * m.T, C = m.d;
  auto x = filled(N * C), w = filled(C), b = filled(C), dy = filled(N * C);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, th);
  for (auto _ : s) {
    if (bwd)
      layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), N, C, th);
    else
      layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, th);
    benchmark::ClobberMemory();
  }
  bytes_rate(s, (bwd ? 4.0 : 2.0) * N * C * 4);  // bwd: x, dy read, dx read+written
}

void gelu(benchmark::State& s, Model m, int th, bool bwd) {
  const int64_t n = m.B * m.T * 4 * m.d;
  auto x = filled(n), dy = filled(n);
  std::vector<float> y(n);
  for (auto _ : s) {
    if (bwd) gelu_backward(y.data(), x.data(), dy.data(), n, th);
    else gelu_forward(y.data(), x.data(), n, th);
    benchmark::ClobberMemory();
  }
  bytes_rate(s, (bwd ? 3.0 : 2.0) * n * 4);
}

void attention(benchmark::State& s, Model m, int th, bool bwd) {
  const int64_t B = m.B, T = m.T, C = m.d, NH = m.NH;
  auto qkv = filled(B * T * 3 * C), dout = filled(B * T * C);
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, th);
  for (auto _ : s) {
    if (bwd)
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C,
                         NH, th);
    else
      attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, th);
    benchmark::ClobberMemory();
  }
  // forward: q k^T and p v over T (T + 1) / 2 pairs; backward: 4 such products (s, dp, dq, dk)
  // plus dv, counted as 5 (recompute of s included).
  const double pair_flops = 2.0 * B * C * T * (T + 1) / 2.0;
  s.counters["GFLOPs"] = benchmark::Counter((bwd ? 5.0 : 2.0) * pair_flops * 1e-9,
                                            benchmark::Counter::kIsIterationInvariantRate);
}

void crossentropy(benchmark::State& s, Model m, int th, bool bwd) {
  const int64_t N = m.B * m.T, V = m.V;
  auto logits = filled(N * V, 2.0f), dl = filled(N);
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[i] = int32_t(i % V);
  std::vector<float> loss(N), lse(N), work = logits;
  crossentropy_forward(loss.data(), lse.data(), logits.data(), tg.data(), N, V, th);
  for (auto _ : s) {
    if (bwd) {
      s.PauseTiming();
      work = logits;  // the backward overwrites its input
      s.ResumeTiming();
      crossentropy_backward_inplace(work.data(), lse.data(), tg.data(), dl.data(), N, V, th);
    } else {
      crossentropy_forward(loss.data(), lse.data(), logits.data(), tg.data(), N, V, th);
    }
    benchmark::ClobberMemory();
  }
  bytes_rate(s, (bwd ? 2.0 : 1.0) * N * V * 4);
}

void embedding(benchmark::State& s, Model m, int th, bool bwd) {
  const int64_t B = m.B, T = m.T, C = m.d, V = m.V;
  std::vector<int32_t> tok(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = int32_t((i * 131) % V);
  auto wte = filled(V * C), wpe = filled(T * C), dout = filled(B * T * C);
  std::vector<float> out(B * T * C), dwte(V * C), dwpe(T * C);
  for (auto _ : s) {
    if (bwd)
      embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, 0, V, th);
    else
      embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 0, V, th);
    benchmark::ClobberMemory();
  }
  bytes_rate(s, 3.0 * B * T * C * 4);
}

void adamw(benchmark::State& s, Model m, int th, bool) {
  const int64_t n = m.params();
  std::vector<float> p = filled(n), g = filled(n), mm(n, 0.0f), vv(n, 0.0f);
  AdamWParams hp;
  for (auto _ : s) {
    adamw_update(p.data(), g.data(), mm.data(), vv.data(), n, hp, th);
    benchmark::ClobberMemory();
  }
  bytes_rate(s, 7.0 * n * 4);  // read p, g, m, v; write p, m, v
}

void linear(benchmark::State& s, Model m, int th, bool bwd) {
  const int64_t N = m.B * m.T, C = m.d, OC = 4 * m.d;  // the fc layer
  auto x = filled(N * C), w = filled(C * OC), b = filled(OC), dy = filled(N * OC);
  std::vector<float> y(N * OC), dx(N * C), dw(C * OC), db(OC);
  for (auto _ : s) {
    if (bwd)
      linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, th);
    else
      linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC, th);
    benchmark::ClobberMemory();
  }
  s.counters["GFLOPs"] = benchmark::Counter((bwd ? 4.0 : 2.0) * N * C * OC * 1e-9,
                                            benchmark::Counter::kIsIterationInvariantRate);
}

using Fn = void (*)(benchmark::State&, Model, int, bool);

int register_all() {
  const std::pair<const char*, Fn> kernels[] = {
      {"layernorm", layernorm}, {"gelu", gelu},   {"attention", attention}, {"crossentropy", crossentropy},
      {"embedding", embedding}, {"linear_fc", linear}};
  for (const Model& m : kModels)
    for (auto [name, fn] : kernels)
      for (bool bwd : {false, true})
        for (int th : {1, 2}) {
          const std::string n = std::string(m.name) + "/" + name + (bwd ? "_bwd" : "_fwd") +
                                "/threads:" + std::to_string(th);
          benchmark::RegisterBenchmark(n.c_str(), fn, m, th, bwd)->UseRealTime();
        }
  for (const Model& m : kModels)
    for (int th : {1, 2})
      benchmark::RegisterBenchmark(
          (std::string(m.name) + "/adamw/threads:" + std::to_string(th)).c_str(), adamw, m, th,
          false)->UseRealTime();
  return 0;
}
const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
