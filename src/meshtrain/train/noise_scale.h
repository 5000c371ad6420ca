// The gradient noise scale and goodput of data-parallel training (McCandlish et al. 2018,
// "An Empirical Model of Large-Batch Training", appendix A; Pollux/AdaptDL's estimator).
//
// Under dp = N, each rank's local gradient G_small is the gradient of the mean loss over its
// b = B / N rows; the all-reduced G_big is that over the B rows of the global batch. With
// |G_small|^2 the mean over the N ranks of their local squared norms, both are unbiased:
//   |G|^2     = (B |G_big|^2 - b |G_small|^2) / (B - b)
//   tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1/b - 1/B)
// where Sigma is the per-sample gradient covariance. One step's estimates are noisy (|G|^2 may
// even be negative), so each is smoothed by an exponential moving average with bias correction
// (kNoiseSmoothing), and the simple noise scale is their ratio, B_noise = tr(Sigma) / |G|^2.
// Statistical efficiency of the global batch B against the base batch B0 (Pollux):
//   E(B) = (B_noise + B0) / (B_noise + B)
// the share of B's samples that buy progress a B0 batch would buy per sample; goodput is the
// throughput in samples per second times E(B). The trainer takes B0 = b, one rank's batch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace meshtrain::train {

// The weight of the past in the moving averages (about a 20-step window).
inline constexpr double kNoiseSmoothing = 0.95;

// One step's unbiased estimates.
struct NoiseEstimate {
  double grad_sq = 0;  // |G|^2, the squared norm of the true gradient
  double trace = 0;    // tr(Sigma), the summed per-sample gradient variance
};

// From the small-batch (b rows, mean over the ranks) and big-batch (B rows) squared norms;
// needs B > b > 0.
NoiseEstimate noise_estimate(double sq_small, double sq_big, double b_small, double b_big);

// Pollux's efficiency E(B) relative to B0; 1 at B = B0.
double stat_efficiency(double noise_scale, double b0, double b);

// The moving averages of |G|^2 and tr(Sigma) over the steps, with bias correction (the average
// after one step is that step's value).
class GradNoiseScale {
 public:
  explicit GradNoiseScale(double smoothing = kNoiseSmoothing) : theta_(smoothing) {}
  void update(const NoiseEstimate& e);
  double grad_sq() const { return weight_ > 0 ? grad_sq_ / weight_ : 0.0; }
  double trace() const { return weight_ > 0 ? trace_ / weight_ : 0.0; }
  // tr(Sigma) / |G|^2 from the averages; none while the averaged |G|^2 is not positive or the
  // averaged trace is negative (too few steps to tell).
  std::optional<double> scale() const;

 private:
  double theta_;
  double grad_sq_ = 0, trace_ = 0, weight_ = 0;  // the biased averages and the weight they carry
};

// The last noise scale a metrics file of `meshtrain train --metrics` holds (its last line with
// `grad_noise_scale`), for `meshtrain plan --goodput --noise-from`; none when no line has one
// (a run at dp 1, with --exact-sums, or too short for the averages to define a scale). A last
// line cut by a kill (no newline, not JSON) is skipped. Throws std::invalid_argument naming the
// file for a file that cannot be read or another line that is not a JSON object.
struct MeasuredNoiseScale {
  double value = 0;
  int64_t step = 0;  // the line's `step` (0 where it has none)
};
std::optional<MeasuredNoiseScale> last_noise_scale(const std::string& metrics_path);

}  // namespace meshtrain::train
