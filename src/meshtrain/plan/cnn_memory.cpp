#include "meshtrain/plan/cnn_memory.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "meshtrain/comm/world.h"
#include "meshtrain/nn/context.h"
#include "meshtrain/parallel/branch/cnn_branch.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/parallel/spatial/cnn_spatial.h"
#include "meshtrain/parallel/tensor/cnn_tp.h"

namespace meshtrain::plan {

namespace {

// One rank's kept and peak bytes for a micro-batch of `rows` zero images. The first stage reads
// whole images (its layout cuts its own part out of them), so the buffer holds whole images
// whatever the rank's input shape is.
std::pair<double, double> run_once(const model::CNNConfig& cfg, model::CNNStage& stage, int64_t rows) {
  std::vector<float> images(static_cast<size_t>(rows * cfg.channels * cfg.height * cfg.width), 0.f);
  std::vector<int32_t> targets(static_cast<size_t>(rows), 0);
  const model::MicroBatch mb{.images = images.data(), .targets = targets.data(), .rows = rows};
  const int64_t before = tensor_bytes_live_thread();
  reset_tensor_bytes_peak_thread();
  int64_t kept = 0;
  {
    nn::Context ctx(1, true);
    model::StageResult r;
    Tensor y = stage.forward(ctx, Tensor(), mb, &r, nullptr);
    y = Tensor();
    kept = tensor_bytes_live_thread() - before;
    stage.backward(ctx, Tensor(), 1.0f, nullptr);
  }
  return {static_cast<double>(kept), static_cast<double>(tensor_bytes_peak_thread() - before)};
}

}  // namespace

const std::map<std::string, std::vector<double>>& branch_costs(const model::CNNConfig& cfg, int64_t rows, int threads) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, int64_t, int64_t, int>, std::map<std::string, std::vector<double>>> cache;
  const int64_t r = std::min<int64_t>(32, rows);
  const auto key = std::make_tuple(cfg.name, cfg.height, r, threads);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  return cache[key] = model::measure_branch_costs(cfg, r, std::max(1, threads));
}

SplitMemory split_memory(const model::CNNConfig& cfg, Layout::Split split, int tp, const std::string& balance,
                         int64_t rows, const std::map<std::string, std::vector<double>>& measured) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, int, std::string, int64_t, int64_t, int64_t, std::string>, SplitMemory> cache;
  std::string placed;  // the measured costs, as part of the key
  for (const auto& [name, c] : measured)
    for (double x : c) placed += std::to_string(x) + ",";
  const auto key = std::make_tuple(cfg.name, static_cast<int>(split), tp, balance, cfg.height, cfg.width, rows, placed);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  SplitMemory out;
  out.params.assign(static_cast<size_t>(tp), 0.0);
  out.kept.assign(static_cast<size_t>(tp), 0.0);
  out.peak.assign(static_cast<size_t>(tp), 0.0);
  const int64_t units = model::cnn_num_units(cfg);
  comm::run_world(comm::Backend::threads, tp, [&](comm::Communicator& world) {
    parallel::DeviceMesh mesh(world, {1, tp, 1});
    std::shared_ptr<const model::CNNLayout> layout;
    switch (split) {
      case Layout::Split::tensor: layout = parallel::cnn_tp_layout(mesh.tp_ptr()); break;
      case Layout::Split::spatial: layout = parallel::cnn_spatial_layout(mesh.tp_ptr(), cfg); break;
      case Layout::Split::branch: layout = parallel::cnn_branch_layout(mesh.tp_ptr(), balance, measured); break;
    }
    model::CNNStage stage(cfg, 0, 0, units, true, true, layout);
    stage.set_batch_stats_reduce(layout->stats_reduce(nullptr));
    const auto [kept, peak] = run_once(cfg, stage, rows);
    std::vector<nn::Param*> ps;
    stage.collect_params(ps);
    double params = 0;
    for (const nn::Param* q : ps) params += static_cast<double>(q->value.numel());
    const size_t r = static_cast<size_t>(world.rank());  // each rank writes its own entries
    out.params[r] = params, out.kept[r] = kept, out.peak[r] = peak;
  });
  std::lock_guard<std::mutex> lock(mu);
  return cache[key] = out;
}

}  // namespace meshtrain::plan
