#include "meshtrain/train/metrics.h"

#include <malloc.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "meshtrain/io/json.h"
#include "meshtrain/kernels/gemm.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::train {

static double status_field_mb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = key;
  while (std::getline(f, line))
    if (line.compare(0, k.size(), k) == 0) return std::stod(line.substr(k.size())) / 1024.0;
  return 0.0;
}

double peak_rss_mb() { return status_field_mb("VmHWM:"); }
double current_rss_mb() { return status_field_mb("VmRSS:"); }

double measured_gemm_gflops(int threads, kernels::Precision precision) {
  static std::mutex mu;
  static std::map<kernels::Precision, double> cache;  // one thread's rate
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(precision); it != cache.end()) return it->second * threads;
  const int64_t n = 1024;
  // Tensors, not vectors: their 4 MiB blocks come from the tensor arena, where training reuses
  // them, instead of leaving 12 MiB resident in the calling thread's malloc arena.
  Tensor a = Tensor::empty({n * n}), b = Tensor::empty({n * n}), c = Tensor::empty({n * n});
  a.fill(0.5f);
  b.fill(0.25f);
  auto run = [&] {
    kernels::gemm(kernels::Trans::N, kernels::Trans::N, n, n, n, 1.f, a.data(), n, b.data(), n,
                  0.f, c.data(), n, {1, precision});
  };
  run();  // warm up (thread pool, packing buffers)
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double gflops = 2.0 * n * n * n / best / 1e9;
  cache[precision] = gflops;
  return gflops * threads;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  if (path.empty()) return;
  f_ = std::make_unique<io::AppendFile>(path, /*truncate=*/!append, "metrics file");
}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::write(const nlohmann::json& line) {
  if (f_) f_->append(line.dump() + "\n");
}

void MetricsWriter::close() {
  if (f_) f_->close();
}

MetricsTrim trim_metrics_for_resume(const std::string& path, int64_t step, const MetricsLineSource& source) {
  namespace fs = std::filesystem;
  MetricsTrim t;
  if (path.empty()) return t;
  std::error_code ec;
  t.existed = fs::exists(path, ec);
  std::map<int64_t, std::string> by_step;  // the last line of each kept step
  int64_t lines = 0;
  bool ends_with_newline = true;
  if (t.existed) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read metrics file '" + path + "' to continue it");
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    ends_with_newline = text.empty() || text.back() == '\n';
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      const std::string line = text.substr(at, nl - at);
      at = nl + 1;
      ++lines;
      // A line cut by a kill does not parse and is dropped with the rest; so is a line the
      // strict reading refuses (a key given twice, io/json.h).
      nlohmann::json j;
      try {
        j = io::parse_json_strict(line, path, "");
      } catch (const io::JsonError&) {
        continue;
      }
      if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      const int64_t s = j["step"].get<int64_t>();
      if (s < 1 || s > step) continue;
      t.duplicates += by_step.count(s) ? 1 : 0;
      by_step[s] = line;
    }
  }
  t.kept = static_cast<int64_t>(by_step.size());
  t.dropped = lines - t.kept;
  for (int64_t s = 1; s <= step; ++s) {
    if (by_step.count(s)) continue;
    std::optional<std::string> line = source ? source(s) : std::nullopt;
    if (line) {
      by_step[s] = std::move(*line);
      t.rebuilt.push_back(s);
    } else {
      t.missing.push_back(s);
    }
  }
  if (t.dropped == 0 && t.rebuilt.empty() && ends_with_newline) return t;
  if (t.dropped > 0) {
    // The file as it was stays as PATH.old: a second name for it (the rewrite below puts a new
    // file at PATH and leaves this one untouched), or a copy where the file system has no links.
    t.backup = path + ".old";
    fs::remove(t.backup, ec);
    fs::create_hard_link(path, t.backup, ec);
    if (ec) fs::copy_file(path, t.backup, fs::copy_options::overwrite_existing, ec);
    if (ec) throw std::runtime_error("cannot keep the metrics file '" + path + "' as " + t.backup + ": " + ec.message());
  }
  std::string text;
  for (const auto& [s, l] : by_step) text += l + '\n';
  io::write_file_atomic(path, text, "metrics file");
  return t;
}

std::string format_steps(const std::vector<int64_t>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(steps[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(steps[j]);
    }
    i = j + 1;
  }
  return out;
}

void configure_allocator() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 8);
}

}  // namespace meshtrain::train
