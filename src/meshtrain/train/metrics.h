// Per-step measurements (DESIGN decision 8): one JSON object per step, appended to a
// JSON-lines file and flushed at once so nothing is lost on a crash; process memory; and the
// machine's measured SGEMM rate, the reference for MFU.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/kernels/bf16.h"

namespace meshtrain::train {

// Peak and current resident set size of this process, in MiB (/proc/self/status).
double peak_rss_mb();
double current_rss_mb();

// Measured float32 GEMM rate (GFLOP/s) for `threads` threads: the best of several 1024^3
// products on one thread, times `threads` (the denominator of the MFU this project reports:
// what the machine's BLAS reaches per core, not a datasheet peak). One thread is measured
// because a short multi-thread measurement is ruined by any other process on the machine (an
// OpenMP barrier waits for a descheduled worker), while one thread only needs one free core.
// Takes about a tenth of a second; cached per precision (bf16: the rate of kernels::gemm with
// bf16 operands, so a bf16 run's MFU is against the bf16 rate of the same machine).
double measured_gemm_gflops(int threads, kernels::Precision precision = kernels::Precision::f32);

// Appends JSON lines to a file; a null writer (empty path) does nothing.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& line);

 private:
  std::FILE* f_ = nullptr;
};

// Prepares the metrics file of a resumed run that continues after `step` completed steps:
// keeps one line per step for steps 1..`step` (the last one written for a step, so lines a
// killed run wrote twice collapse), drops the rest (steps the resumed run will write again),
// and rewrites the file atomically; the run then appends. When anything is dropped, the file
// as it was is first copied to PATH.old. Nothing happens when PATH is empty or absent.
struct MetricsTrim {
  int64_t kept = 0, dropped = 0;
  std::string backup;  // PATH.old when written
};
MetricsTrim trim_metrics_for_resume(const std::string& path, int64_t step);

// Uses glibc's malloc settings that suit training: large blocks are kept for reuse instead of
// being returned to the kernel and faulted in again every step (a step frees and reallocates
// the same activation sizes). Call once at start-up.
void configure_allocator();

}  // namespace meshtrain::train
