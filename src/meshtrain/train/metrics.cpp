#include "meshtrain/train/metrics.h"

#include <malloc.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "meshtrain/kernels/gemm.h"

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
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
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
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) throw std::runtime_error("cannot open metrics file '" + path + "' for writing");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (!f_) return;
  std::string s = line.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);
}

MetricsTrim trim_metrics_for_resume(const std::string& path, int64_t step) {
  namespace fs = std::filesystem;
  MetricsTrim t;
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return t;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read metrics file '" + path + "' to continue it");
  std::map<int64_t, std::string> by_step;  // the last line of each kept step
  std::string line;
  int64_t lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    // A line cut by a kill does not parse and is dropped with the rest.
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t s = j["step"].get<int64_t>();
    if (s >= 1 && s <= step) by_step[s] = line;
  }
  t.kept = static_cast<int64_t>(by_step.size());
  t.dropped = lines - t.kept;
  if (t.dropped == 0) return t;
  t.backup = path + ".old";
  fs::copy_file(path, t.backup, fs::copy_options::overwrite_existing, ec);
  if (ec) throw std::runtime_error("cannot keep the metrics file '" + path + "' as " + t.backup + ": " + ec.message());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& [s, l] : by_step) out << l << '\n';
    out.flush();
    if (!out) throw std::runtime_error("cannot write '" + tmp + "' (rewriting the metrics file to continue it)");
  }
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot replace the metrics file '" + path + "': " + ec.message());
  return t;
}

void configure_allocator() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 8);
}

}  // namespace meshtrain::train
