// GEMM against a double-precision triple loop, for every transpose combination, odd sizes,
// leading dimensions larger than the row length, alpha/beta, and the thread budget.
#include <gtest/gtest.h>

#include <omp.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "kernel_test_util.h"
#include "meshtrain/kernels/gemm.h"

using namespace meshtrain::kernels;
using namespace meshtrain::kernels::testing;

namespace {

// ---- reference ----
// C = alpha op(A) op(B) + beta C, row-major, in double.
std::vector<double> ref_gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha,
                             const std::vector<float>& A, int64_t lda, const std::vector<float>& B,
                             int64_t ldb, double beta, const std::vector<float>& C, int64_t ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta == Trans::N ? A[i * lda + k] : A[k * lda + i];
        const double b = tb == Trans::N ? B[k * ldb + j] : B[j * ldb + k];
        s += a * b;
      }
      out[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
    }
  return out;
}

struct Case {
  int64_t M, N, K;
};

}  // namespace

// ---- correctness ----
TEST(Gemm, AllTransposesOddSizes) {
  // float32 products with K <= 70 terms of N(0,1) inputs: error ~ sqrt(K) * 6e-8 * |terms|;
  // atol 1e-4 on outputs of magnitude ~sqrt(K) ~ 8 leaves a wide but still sensitive margin
  // (a wrong index or transpose gives errors of order 1).
  const Case cases[] = {{1, 1, 1}, {1, 17, 5}, {13, 1, 7}, {7, 9, 70}, {33, 31, 17}, {64, 48, 32}};
  for (auto [M, N, K] : cases)
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T})
        for (int threads : {1, 2}) {
          const int64_t lda = (ta == Trans::N ? K : M) + 3;  // padded rows
          const int64_t ldb = (tb == Trans::N ? N : K) + 1;
          const int64_t ldc = N + 2;
          auto A = randn((ta == Trans::N ? M : K) * lda, 1);
          auto B = randn((tb == Trans::N ? K : N) * ldb, 2);
          auto C = randn(M * ldc, 3);
          auto want = ref_gemm(ta, tb, M, N, K, 0.5, A, lda, B, ldb, 0.25, C, ldc);
          gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, C.data(), ldc,
               {threads});
          EXPECT_TRUE(all_close(C, want, 1e-5, 1e-4))
              << "M=" << M << " N=" << N << " K=" << K << " ta=" << int(ta)
              << " tb=" << int(tb) << " threads=" << threads;
        }
}

TEST(Gemm, BetaZeroIgnoresNaNInC) {
  // BLAS semantics: beta = 0 must overwrite C, even when C holds NaN.
  auto A = randn(4 * 3, 1), B = randn(3 * 5, 2);
  std::vector<float> C(4 * 5, std::nanf(""));
  auto want = ref_gemm(Trans::N, Trans::N, 4, 5, 3, 1.0, A, 3, B, 5, 0.0,
                       std::vector<float>(20, 0.0f), 5);
  gemm(Trans::N, Trans::N, 4, 5, 3, 1.0f, A.data(), 3, B.data(), 5, 0.0f, C.data(), 5);
  EXPECT_TRUE(all_close(C, want, 1e-5, 1e-5));
}

TEST(Gemm, ZeroKScalesC) {
  std::vector<float> C = {1, 2, 3, 4};
  gemm(Trans::N, Trans::N, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 2.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{2, 4, 6, 8}));
}

TEST(Gemm, BackendName) {
  const std::string name = gemm_backend();
  EXPECT_TRUE(name == "openblas" || name == "blis" || name == "dnnl") << name;
}

// ---- thread budget ----
// Two std::threads (two "ranks") call gemm concurrently with their own budgets; results must
// match the single-threaded answer, and the calling threads' OpenMP settings must be their own.
TEST(Gemm, ConcurrentCallersKeepTheirBudgets) {
  const int64_t n = 192;
  auto A = randn(n * n, 4), B = randn(n * n, 5);
  std::vector<float> want(n * n, 0.0f);
  gemm(Trans::N, Trans::N, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, want.data(), n, {1});
  std::atomic<int> bad{0};
  auto rank = [&](int budget) {
    std::vector<float> C(n * n, 0.0f);
    for (int rep = 0; rep < 20; ++rep) {
      gemm(Trans::N, Trans::N, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, C.data(), n,
           {budget});
      for (int64_t i = 0; i < n * n; ++i)
        if (std::fabs(C[i] - want[i]) > 1e-3f * (1.0f + std::fabs(want[i]))) ++bad;
    }
    // OpenMP-driven backends keep the budget in this thread's own ICV.
    if (std::string(gemm_backend()) != "blis" && omp_get_max_threads() != budget) ++bad;
  };
  std::thread t1(rank, 1), t2(rank, 2);
  t1.join();
  t2.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- busy threads ----
// CPU ticks (utime + stime) of every thread of this process, from /proc/self/task.
namespace {
std::map<int, long> thread_ticks() {
  std::map<int, long> ticks;
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return ticks;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string line;
    std::getline(f, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    long ut = 0, st = 0;
    for (int k = 3; k <= 15 && rest >> field; ++k) {
      if (k == 14) ut = std::stol(field);
      if (k == 15) st = std::stol(field);
    }
    ticks[std::atoi(e->d_name)] = ut + st;
  }
  closedir(dir);
  return ticks;
}

// Runs `callers` std::threads, each doing `products` 384^3 products with budget `budget`, and
// returns how many threads of the process did a real share of the work: those whose CPU
// time grew by at least a quarter of the busiest one's. The work is a fixed count, not a
// time window, so each working thread's CPU time is the same on an idle or a loaded machine
// (load stretches the wall time, not the CPU time); it is long enough for many 10 ms
// scheduler ticks. Callers wait for a final sample before exiting, since OpenMP pool threads
// of a caller end with it.
int busy_threads(int callers, int budget, int products) {
  const int64_t n = 384;
  auto A = randn(n * n, 1), B = randn(n * n, 2);
  const auto before = thread_ticks();
  std::atomic<int> finished{0};
  std::atomic<bool> sampled{false};
  std::vector<std::thread> ts;
  for (int c = 0; c < callers; ++c)
    ts.emplace_back([&] {
      std::vector<float> C(n * n);
      for (int i = 0; i < products; ++i)
        gemm(Trans::N, Trans::N, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, C.data(), n,
             {budget});
      ++finished;
      while (!sampled) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  while (finished < callers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto after = thread_ticks();
  sampled = true;
  for (auto& t : ts) t.join();
  long most = 0;
  std::vector<long> grew;
  for (auto [tid, t] : after) {
    const auto it = before.find(tid);
    grew.push_back(t - (it == before.end() ? 0 : it->second));
    most = std::max(most, grew.back());
  }
  return static_cast<int>(std::count_if(grew.begin(), grew.end(),
                                         [&](long g) { return g * 4 >= most && g > 0; }));
}
}  // namespace

// Two ranks with one thread each: exactly two threads work (no library pool of its own
// size); one rank with two threads: two threads work; one rank with one thread: one.
TEST(Gemm, ThreadBudgetDecidesBusyThreads) {
  if (thread_ticks().empty()) GTEST_SKIP() << "no /proc/self/task";
  // About 0.4 s of one core per call on this machine's class (113 MFLOP a product).
  EXPECT_EQ(busy_threads(1, 1, 400), 1);
  EXPECT_EQ(busy_threads(1, 2, 400), 2);
  EXPECT_EQ(busy_threads(2, 1, 400), 2);
}
