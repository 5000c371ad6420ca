// What `meshtrain calibrate` measures of the kernels the transformers run (plan/machine.h
// GemmRate, ElementwiseRate, AttentionRate):
//   - GEMMs (kernels/gemm.h) at a few shape classes x thread counts, float32, and bf16 where
//     kernels::bf16_isa() is not "emulated" (bf16 times include converting A and B); float32
//     also with its operands from memory (copies rotating through twice the last-level cache);
//   - element-wise kernels: c = a + b over arrays far larger than the caches, and the layers'
//     own memory-bound kernels (layer norm, GELU, AdamW, add) in the caches and from memory;
//   - attention forward + backward at GPT-like shapes.
// Each row is measured in rounds over the whole list (calibrate: three, quick mode one) and
// keeps the median of its rounds' figures, as the CNN rows do (plan/calibrate_cnn.h); each
// round gets its share of the time one measurement took, and the large arrays are allocated
// once for the calibration.
// Internal to plan/: calibrate.cpp adds these tasks to its list, and times its other figures
// (call overhead, ranks sharing cores) by median_seconds_of below.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/plan/machine.h"

namespace meshtrain::plan::detail {

struct RoundTasks;  // plan/calibrate_cnn.h

// The median time of one run of `fn` (median_seconds): one warm-up run, then at least `reps`
// runs and at least `min_total` seconds of them.
double median_seconds_of(const std::function<void()>& fn, int reps, double min_total);

// printf of one number, for the progress lines.
std::string fmt(const char* f, double a);

// The largest cache level's size of cpu0 as sysfs gives it ("32768K"), 0 when unknown.
int64_t llc_bytes();

// Adds one task per kernel row and round (`rounds` of them) to `tasks`, each returning its line
// of progress, and a keep that pushes every row's median into `p`.
void add_kernel_tasks(MachineProfile& p, const std::vector<int>& threads, bool quick, bool bf16, RoundTasks& tasks,
                      int rounds);

}  // namespace meshtrain::plan::detail
