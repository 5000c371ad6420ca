// Per-step measurements (DESIGN decision 8): one JSON object per step, appended to a
// JSON-lines file and written at once (checked) so nothing is lost on a crash; process memory; and the
// machine's measured SGEMM rate, the reference for MFU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/io/file.h"
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

// Appends JSON lines to a file, one write per line (nothing buffered, so a kill loses no line
// it wrote); a null writer (empty path) does nothing. Every write is checked: a failure (a full
// disk) throws io::WriteError naming the file and the cause, and leaves the file holding whole
// lines only (io::AppendFile). close() fsyncs and closes, checked; the destructor closes
// without reporting.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& line);
  void close();

 private:
  std::unique_ptr<io::AppendFile> f_;
};

// Prepares the metrics file of a resumed run that continues after `step` completed steps, so
// that it holds exactly one line for each of steps 1..`step`:
//  - keeps the last line written for a step (lines a killed run wrote twice collapse: the later
//    one is the run that went on from there); drops lines of later steps (the resumed run
//    writes them again) and lines that do not parse (cut by a kill) or that the strict reading
//    refuses (a key given twice: io/json.h);
//  - rebuilds the line of a step in 1..`step` that the file lacks from `source` (the line a
//    checkpoint of that step recorded: a run killed between committing the checkpoint and
//    writing the line, or one that had no --metrics), and lists the steps it cannot rebuild;
//  - rewrites the file atomically when anything changed (also when its last line lacks its
//    newline); the run then appends. When a line is dropped, the file as it was is first
//    kept as PATH.old (a second name for it where the file system allows, else a copy).
// An absent file is created when a line can be rebuilt. Nothing happens when PATH is empty.
// Throws std::runtime_error (io::WriteError for a failed write) naming the file.
struct MetricsTrim {
  int64_t kept = 0;     // lines kept from the file (one per step)
  int64_t dropped = 0;  // lines removed: of later steps, cut, or earlier copies of a step
  int64_t duplicates = 0;        // of those, earlier copies of a kept step (1..step)
  std::vector<int64_t> rebuilt;  // steps whose missing line `source` gave
  std::vector<int64_t> missing;  // steps in 1..step that still have no line
  bool existed = false;          // whether PATH existed
  std::string backup;            // PATH.old when written
};
// The line (one JSON object, no newline) a checkpoint recorded for a step, or nullopt.
using MetricsLineSource = std::function<std::optional<std::string>(int64_t step)>;
MetricsTrim trim_metrics_for_resume(const std::string& path, int64_t step, const MetricsLineSource& source = {});
// "3", "1-4, 7, 9-10": steps (sorted) as ranges, for notes.
std::string format_steps(const std::vector<int64_t>& steps);

// Uses glibc's malloc settings that suit training: large blocks are kept for reuse instead of
// being returned to the kernel and faulted in again every step (a step frees and reallocates
// the same activation sizes). Call once at start-up.
void configure_allocator();

}  // namespace meshtrain::train
