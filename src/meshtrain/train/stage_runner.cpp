#include "meshtrain/train/stage_runner.h"

#include <utility>

#include "meshtrain/data/images.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/weight_stash.h"
#include "meshtrain/train/weight_versions.h"

namespace meshtrain::train {

BatchArrays image_rows(const ImageDataset& ds, const TrainOptions& o, int64_t step, int dp_rank, ImageRows& out) {
  const int64_t B = o.batch, M = o.microbatches, rows = B / o.dp / M;
  const int64_t per = ds.channels() * ds.height() * ds.width();
  out.images.resize(static_cast<size_t>(M * rows * per)), out.labels.resize(static_cast<size_t>(M * rows));
  out.first_rows.resize(static_cast<size_t>(M));
  for (int64_t mb = 0; mb < M; ++mb) {
    const int64_t r0 = out.first_rows[static_cast<size_t>(mb)] = mb * (B / M) + dp_rank * rows;
    ds.batch(Split::train, o.data_order, o.seed, step, B, r0, r0 + rows, out.images.data() + mb * rows * per,
             out.labels.data() + mb * rows, o.augment);
  }
  return {.images = out.images.data(), .sample_floats = per, .targets = out.labels.data(), .rows = rows, .T = 1,
          .step = step, .first_sample = out.first_rows.data()};
}

StageDriver::StageDriver(model::Stage& stage, nn::Hooks* hooks, std::function<void(bool)> set_sync, bool recompute)
    : stage_(stage), hooks_(hooks), set_sync_(std::move(set_sync)), recompute_(recompute) {}

void StageDriver::set_batches(const BatchArrays& batches, float grad_scale) {
  b_ = batches, grad_scale_ = grad_scale;
  results_.clear();
}

model::MicroBatch StageDriver::micro_batch(int mb) const {
  model::MicroBatch m;
  m.rows = b_.rows, m.T = b_.T;
  const int64_t first = static_cast<int64_t>(mb) * b_.rows;  // its first sample
  if (b_.tokens) m.tokens = b_.tokens + first * b_.T;
  if (b_.images) m.images = b_.images + first * b_.sample_floats;
  if (b_.targets) m.targets = b_.targets + first * b_.T;
  return m;
}

Tensor StageDriver::forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal) {
  if (!stash_ || !ctx.training) return run_forward(ctx, mb, input, portal);
  const int64_t k = b_.step * per_step_ + mb;  // PipeDream: on the version the recurrence names
  stash_->begin_forward(k);
  struct Back {
    WeightStash& s;
    int64_t k;
    ~Back() { s.end_forward(k); }
  } back{*stash_, k};
  return run_forward(ctx, mb, input, portal);
}

Tensor StageDriver::run_forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal) {
  ctx.hooks = hooks_;
  ctx.step = b_.step;
  ctx.first_sample = b_.first_sample ? b_.first_sample[mb] : 0;
  model::StageResult result;
  Tensor out;
  if (recompute_ && ctx.training) {
    nn::Context light(ctx.threads, /*training=*/false, ctx.precision);  // saves nothing
    light.weights_epoch = ctx.weights_epoch;  // the same weights
    light.step = ctx.step, light.first_sample = ctx.first_sample;  // the same dropout masks
    light.hooks = hooks_;
    out = stage_.forward(light, input, micro_batch(mb), &result, &portal);
    std::vector<Tensor> keep;  // the input, and the skip tensor this stage adds
    keep.push_back(stage_.first() ? Tensor() : input);
    keep.push_back(portal.in);
    ctx.save(this, keep);
  } else {
    out = stage_.forward(ctx, input, micro_batch(mb), &result, &portal);
  }
  if (stage_.last()) {
    if (results_.size() <= static_cast<size_t>(mb)) results_.resize(mb + 1);
    results_[mb] = result;
  }
  return out;
}

Tensor StageDriver::backward(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) {
  if (stash_) {  // PipeDream: backward on the forward's version, then this micro-batch's update
    const int64_t k = b_.step * per_step_ + mb;
    stash_->begin_backward(k);
    Tensor dx;
    {
      struct Back {
        WeightStash& s;
        int64_t k;
        ~Back() { s.end_backward(k); }
      } back{*stash_, k};
      if (set_sync_) set_sync_(true);
      dx = stage_.backward(ctx, dy, 1.f, &portal);
    }
    return dx;
  }
  if (versions_ && mb == 0) versions_->start_step(b_.step);
  if (versions_ && mb < 0) {  // the previous step's micro-batch: on the weights its forward used
    struct Stashed {
      WeightVersions& v;
      explicit Stashed(WeightVersions& w) : v(w) { v.swap_stash(); }
      ~Stashed() { v.swap_stash(); }
    } stashed(*versions_);
    if (set_sync_) set_sync_(last);
    return stage_.backward(ctx, dy, grad_scale_, &portal);
  }
  if (recompute_) {  // the forward again, from the kept input, saving what backward needs
    std::vector<Tensor> kept = std::move(ctx.saved(this));
    ctx.release(this);
    model::StageResult ignored;
    nn::Portal again{kept[1], Tensor()};  // the skip tensor it added; what it makes is sent already
    stage_.forward(ctx, kept[0], micro_batch(mb), &ignored, &again);
  }
  if (set_sync_) set_sync_(last);
  return stage_.backward(ctx, dy, grad_scale_, &portal);
}

void StageDriver::after_backward(int mb) {
  if (stash_) update_(b_.step * per_step_ + mb);  // PipeDream: the micro-batch's update
}

// I: the input gradient now; the linears' weight gradients wait in ctx for W (layer norms,
// embeddings and the head compute theirs now: small, or needed on the way).
Tensor StageDriver::backward_input(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) {
  ctx.defer_weight_grads = true;
  Tensor dx = backward(ctx, mb, dy, last, portal);
  ctx.defer_weight_grads = false;
  return dx;
}

void StageDriver::backward_weights(nn::Context& ctx, int mb, bool last) {
  if (set_sync_) set_sync_(last);
  ctx.run_deferred();
}

}  // namespace meshtrain::train
