// Finite-difference gradient checks for explicit-backward modules.
//
// Tolerance: the modules compute in float32. For a scalar objective L = sum(y * R) with fixed
// random R, accumulated in double, a central difference with step h has truncation error
// O(h^2 * L''') and round-off error about eps_f32 * |y| * sqrt(n) / h. With h = 1e-2 both stay
// near 1e-4 relative for these sizes, so the check asks the sampled analytic and numeric
// gradients to agree to 2e-2 in relative L2 norm (a wrong sign, a missing term or a
// transposed index gives errors of order 1).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/nn/param.h"
#include "meshtrain/tensor/rng.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::testing {

inline Tensor random_tensor(Shape shape, uint64_t seed, const char* name, float std = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape));
  fill_normal(t.data(), t.numel(), stream_key(seed, name), 0, std);
  return t;
}

struct GradCheckResult {
  double rel_error = 0;
  double analytic_norm = 0;
};

// Compares analytic[i] against (f(x_i + h) - f(x_i - h)) / 2h over `samples` indices of x
// (evenly spread). `f` evaluates the objective with the current contents of x.
inline GradCheckResult check_gradient(float* x, const float* analytic, int64_t n,
                                      const std::function<double()>& f, double h = 1e-2,
                                      int64_t samples = 24) {
  double num2 = 0, diff2 = 0, an2 = 0;
  const int64_t stride = std::max<int64_t>(1, n / samples);
  for (int64_t i = 0; i < n; i += stride) {
    float orig = x[i];
    x[i] = orig + static_cast<float>(h);
    double fp = f();
    x[i] = orig - static_cast<float>(h);
    double fm = f();
    x[i] = orig;
    double numeric = (fp - fm) / (2 * h);
    num2 += numeric * numeric;
    an2 += static_cast<double>(analytic[i]) * analytic[i];
    diff2 += (numeric - analytic[i]) * (numeric - analytic[i]);
  }
  GradCheckResult r;
  r.analytic_norm = std::sqrt(an2);
  r.rel_error = std::sqrt(diff2) / std::max(1e-12, std::max(std::sqrt(num2), std::sqrt(an2)));
  return r;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace meshtrain::testing
