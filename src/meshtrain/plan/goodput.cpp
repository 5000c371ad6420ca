#include "meshtrain/plan/goodput.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshtrain::plan {

std::vector<int64_t> goodput_batches(int64_t base, int64_t max) {
  if (base < 1) throw std::invalid_argument("the base batch must be at least 1");
  if (max < base) throw std::invalid_argument("the largest batch must be at least the base batch");
  std::vector<int64_t> out;
  for (int64_t b = base; b <= max; b *= 2) {
    out.push_back(b);
    if (b > std::numeric_limits<int64_t>::max() / 2) break;
  }
  return out;
}

GoodputRanking rank_goodput(std::vector<Prediction> per_batch, double noise_scale, int64_t base,
                            const Efficiency& efficiency) {
  if (per_batch.empty()) throw std::invalid_argument("no batch to rank by goodput");
  if (!(noise_scale >= 0) || !std::isfinite(noise_scale))
    throw std::invalid_argument("the noise scale must be a finite number of samples, at least 0");
  if (base < 1) throw std::invalid_argument("the base batch must be at least 1");
  GoodputRanking r;
  for (Prediction& p : per_batch) {
    if (!(p.step_s > 0)) {
      std::string what = "the prediction at batch ";
      what += std::to_string(p.layout.batch);
      what += " has no positive step time";
      throw std::invalid_argument(what);
    }
    GoodputRow row;
    row.efficiency = efficiency(noise_scale, static_cast<double>(base), static_cast<double>(p.layout.batch));
    row.goodput = p.samples_per_s * row.efficiency;
    row.prediction = std::move(p);
    r.rows.push_back(std::move(row));
  }
  for (size_t i = 1; i < r.rows.size(); ++i) {
    const GoodputRow &x = r.rows[i], &best = r.rows[r.best];
    if (x.goodput > best.goodput || (x.goodput == best.goodput && x.batch() < best.batch())) r.best = i;
  }
  return r;
}

}  // namespace meshtrain::plan
