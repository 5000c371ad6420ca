#include "meshtrain/pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace meshtrain::pipeline {

std::vector<LayerSpan> balance_layers(const std::vector<double>& block_costs, int stages,
                                      double first_extra, double last_extra) {
  const int n = static_cast<int>(block_costs.size());
  if (stages < 1) throw std::invalid_argument("a pipeline needs at least one stage");
  if (n < stages)
    throw std::invalid_argument("the model has " + std::to_string(n) + " blocks, fewer than the " +
                                std::to_string(stages) + " pipeline stages; every stage needs at least one block, "
                                "so use --pp (x chunks) of at most " + std::to_string(n));
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + block_costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest possible largest cost when stages 0..s-1 hold blocks [0, i).
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= n - (stages - s); ++i)
      for (int j = i - 1; j >= s - 1; --j) {  // stage s-1 holds [j, i); larger j first: ties keep later cuts
        double c = prefix[i] - prefix[j] + (s == 1 ? first_extra : 0) + (s == stages ? last_extra : 0);
        double v = std::max(best[s - 1][j], c);
        if (v < best[s][i]) best[s][i] = v, cut[s][i] = j;
      }
  std::vector<LayerSpan> spans(stages);
  for (int s = stages, i = n; s >= 1; --s) {
    const int j = cut[s][i];
    spans[s - 1] = {j, i};
    i = j;
  }
  return spans;
}

std::vector<LayerSpan> equal_layers(int64_t n_layers, int stages) {
  if (stages < 1 || n_layers % stages != 0)
    throw std::invalid_argument("the model's " + std::to_string(n_layers) + " blocks do not split evenly over " +
                                std::to_string(stages) + " stages");
  std::vector<LayerSpan> spans;
  const int64_t per = n_layers / stages;
  for (int s = 0; s < stages; ++s) spans.push_back({s * per, (s + 1) * per});
  return spans;
}

std::vector<LayerSpan> layers_from_counts(const std::string& text, int stages, int64_t n_layers) {
  std::vector<int64_t> counts;
  if (text.empty() || text.front() == ',' || text.back() == ',')
    throw std::invalid_argument("--pp-balance '" + text +
                                "' has an empty item; give one positive block count per stage, e.g. 3,3,2,2");
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v < 1)
      throw std::invalid_argument("--pp-balance " + text + ": '" + item +
                                  "' is not a positive number of blocks; give one count per stage, e.g. 3,3,2,2");
    counts.push_back(v);
  }
  if (static_cast<int>(counts.size()) != stages)
    throw std::invalid_argument("--pp-balance " + text + " gives " + std::to_string(counts.size()) +
                                " stage(s) but the pipeline has " + std::to_string(stages) +
                                "; give one block count per stage");
  int64_t sum = 0;
  for (int64_t c : counts) sum += c;
  if (sum != n_layers)
    throw std::invalid_argument("--pp-balance " + text + " adds up to " + std::to_string(sum) +
                                " blocks but the model has " + std::to_string(n_layers) +
                                "; make the counts sum to " + std::to_string(n_layers));
  std::vector<LayerSpan> spans;
  int64_t first = 0;
  for (int64_t c : counts) spans.push_back({first, first + c}), first += c;
  return spans;
}

std::string to_string(const std::vector<LayerSpan>& spans) {
  std::string out;
  for (size_t s = 0; s < spans.size(); ++s) {
    if (s) out += " | ";
    out += "stage " + std::to_string(s) + ": blocks " + std::to_string(spans[s].first) + "-" +
           std::to_string(spans[s].end - 1);
  }
  return out;
}

}  // namespace meshtrain::pipeline
