#include "meshtrain/model/cost.h"

#include <algorithm>

namespace meshtrain::model {

double total_flops(const std::vector<OpCost>& ops) {
  double s = 0;
  for (const OpCost& o : ops) s += o.fwd_flops + o.bwd_flops;
  return s;
}

double total_saved_bytes(const std::vector<OpCost>& ops) {
  double s = 0;
  for (const OpCost& o : ops) s += o.saved_bytes;
  return s;
}

double backward_peak_bytes(const std::vector<OpCost>& ops) {
  double prefix = 0, peak = 0;
  for (const OpCost& o : ops) {
    prefix += o.saved_bytes;
    peak = std::max(peak, prefix + o.temp_bytes);
  }
  return std::max(peak, prefix);
}

}  // namespace meshtrain::model
