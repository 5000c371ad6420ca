// What a rank reads: its rows of each step's batch and of the validation batches (evaluation),
// and the launcher's heartbeat that a long evaluation keeps beating.
#include <algorithm>
#include <array>
#include <vector>

#include "meshtrain/io/file.h"
#include "meshtrain/train/rank_trainer.h"

namespace meshtrain::train::detail {

// ---- evaluation: every dp rank takes its rows of each validation batch ----

// Under `meshtrain launch`, rank 0 touches the status file after each step and each chunk of
// evaluation batches: the launcher's stall watchdog takes a file that stops changing for
// --stall-timeout-s as a stalled job, so a long evaluation must not look like one.
void RankTrainer::heartbeat() {
  if (lead_ && !o_.launch_status_file.empty()) io::touch(o_.launch_status_file);
}

// Evaluation batches run through the executor in chunks of kEvalChunk (a heartbeat between).
std::pair<float, std::optional<float>> RankTrainer::evaluate() {
  flush_pipeline();  // asynchronous pipelines: evaluate the weights of the recurrence, nothing in flight
  const int64_t B = o_.batch, T = o_.seq, rows = B / o_.dp, r0 = mesh_.coord().dp * rows;
  if (images()) {
    // The test split in order, batches of B (the last padded with uncounted rows): the loss and
    // accuracy over every counted image, summed over dp and pp.
    const ImageDataset& d = *sh_.images;
    const int64_t n = std::min(o_.eval_batches, d.num_eval_batches(Split::val, B));
    const int64_t per = d.channels() * d.height() * d.width();
    std::vector<float> img(n * rows * per);
    std::vector<int32_t> lab(n * rows);
    for (int64_t j = 0; j < n; ++j) d.eval_batch(Split::val, j, B, r0, r0 + rows, img.data() + j * rows * per, lab.data() + j * rows);
    std::array<double, 3> a{0, 0, 0};  // loss sum, correct, counted
    for (int64_t j0 = 0; j0 < n; j0 += kEvalChunk) {
      const int64_t k = std::min(kEvalChunk, n - j0);
      for (auto& r : runners_)
        r->set_batches({.images = img.data() + j0 * rows * per, .sample_floats = per, .targets = lab.data() + j0 * rows,
                        .rows = rows, .T = 1},
                       1.f);
      exec_->forward_only(static_cast<int>(k));
      if (stages_[eval_chunk()]->last())
        for (const model::StageResult& r : runners_[eval_chunk()]->results())
          a[0] += static_cast<double>(r.loss) * static_cast<double>(r.counted), a[1] += static_cast<double>(r.correct),
              a[2] += static_cast<double>(r.counted);
      heartbeat();
    }
    if (o_.dp > 1) mesh_.dp_group().all_reduce(a);
    if (o_.pp > 1) mesh_.pp_group().all_reduce(a);
    return {static_cast<float>(a[0] / std::max(1.0, a[2])), static_cast<float>(a[1] / std::max(1.0, a[2]))};
  }
  const int64_t n = o_.eval_batches;
  std::vector<int32_t> tok(n * rows * T), tgt(n * rows * T);
  for (int64_t j = 0; j < n; ++j)
    sh_.tokens->batch(Split::val, DataOrder::random, o_.seed, j, B, T, r0, r0 + rows, tok.data() + j * rows * T,
                      tgt.data() + j * rows * T);
  double sum = 0;  // batch losses in order, as one rank adds them
  for (int64_t j0 = 0; j0 < n; j0 += kEvalChunk) {
    const int64_t k = std::min(kEvalChunk, n - j0);
    for (auto& r : runners_)
      r->set_batches({.tokens = tok.data() + j0 * rows * T, .targets = tgt.data() + j0 * rows * T, .rows = rows, .T = T},
                     1.f);
    exec_->forward_only(static_cast<int>(k));
    if (stages_[eval_chunk()]->last())
      for (const model::StageResult& r : runners_[eval_chunk()]->results()) sum += r.loss;
    heartbeat();
  }
  return {static_cast<float>(dp_mean(pp_sum(sum) / static_cast<double>(n))), std::nullopt};
}

// This rank's rows of the step's batch. Token models: the rank's B / dp rows, cut into its
// micro-batches (under --schedule pipedream, micro-batch k's rows split over dp, as images'). Image models: train/stage_runner.h's image_rows (micro-batch k is rows
// [k B / M, (k+1) B / M) of the global batch split over the dp ranks, so batch norm synchronised
// over dp sees the single rank's micro-batch k, whatever the layout).
void RankTrainer::fill_batch(int64_t step) {
  const int64_t B = o_.batch, T = o_.seq, M = o_.microbatches, rows = B / o_.dp / M;
  const int64_t d = mesh_.coord().dp;
  if (images()) {
    const BatchArrays arrays = image_rows(*sh_.images, o_, step, static_cast<int>(d), image_rows_);
    for (auto& r : runners_) r->set_batches(arrays, 1.0f / static_cast<float>(M));
    return;
  }
  tok_.resize(M * rows * T), tgt_.resize(M * rows * T), first_rows_.resize(M);
  // PipeDream updates after every micro-batch, so micro-batch k must be the same rows whatever
  // the dp layout: rows [k B / M, (k+1) B / M) split over the dp ranks, as for images.
  const bool per_microbatch = !stashes_.empty();
  const int64_t rank_row0 = d * (B / o_.dp);
  for (int64_t mb = 0; mb < M; ++mb) {
    const int64_t r0 = first_rows_[mb] = per_microbatch ? mb * (B / M) + d * rows : rank_row0 + mb * rows;
    sh_.tokens->batch(Split::train, o_.data_order, o_.seed, step, B, T, r0, r0 + rows, tok_.data() + mb * rows * T,
                      tgt_.data() + mb * rows * T);
  }
  for (auto& r : runners_)
    r->set_batches({.tokens = tok_.data(), .targets = tgt_.data(), .rows = rows, .T = T, .step = step,
                    .first_sample = first_rows_.data()},
                   1.0f / static_cast<float>(M));
}

}  // namespace meshtrain::train::detail
