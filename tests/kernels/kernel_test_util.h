// Helpers shared by the kernel tests: seeded random inputs, and a closeness check that
// reports the worst element. Tolerances are chosen per test, next to the reason for them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace meshtrain::kernels::testing {

inline std::vector<float> randn(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(gen);
  return x;
}

inline std::vector<double> to_double(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

// Every |got - want| <= atol + rtol * |want|; on failure names the worst index.
template <class G, class W>
::testing::AssertionResult all_close(const G& got, const W& want, double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  bool bad = false;
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (std::isnan(excess) || excess > 0) {
      const double e = std::isnan(excess) ? 1e300 : excess;
      if (!bad || e > worst) { worst = e; at = i; }
      bad = true;
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << "element " << at << ": got " << double(got[at])
                                         << ", want " << double(want[at]) << " (rtol " << rtol
                                         << ", atol " << atol << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace meshtrain::kernels::testing
