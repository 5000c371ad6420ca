#include "meshtrain/train/stage_runner.h"

namespace meshtrain::train {

GPTStageRunner::GPTStageRunner(model::GPTStage& stage, nn::Hooks* hooks,
                               std::function<void(bool)> set_sync, int seq_shards, bool recompute)
    : stage_(stage), hooks_(hooks), set_sync_(std::move(set_sync)), seq_shards_(seq_shards), recompute_(recompute) {}

void GPTStageRunner::set_batches(const int32_t* tokens, const int32_t* targets, int64_t rows,
                                 int64_t T, float grad_scale) {
  tokens_ = tokens, targets_ = targets, rows_ = rows, T_ = T, grad_scale_ = grad_scale;
  losses_.clear();
}

Tensor GPTStageRunner::forward(nn::Context& ctx, int mb, const Tensor& input, nn::Portal& portal) {
  ctx.hooks = hooks_;
  const int64_t off = mb * rows_ * T_;
  float loss = 0;
  Tensor out;
  if (recompute_ && ctx.training) {
    nn::Context light(ctx.threads, /*training=*/false, ctx.precision);  // saves nothing
    light.weights_epoch = ctx.weights_epoch;  // the same weights
    light.hooks = hooks_;
    out = stage_.forward(light, input, tokens_ + off, targets_ + off, rows_, T_, &loss, &portal);
    std::vector<Tensor> keep;  // the input, and the skip tensor this stage adds
    keep.push_back(stage_.first() ? Tensor() : input);
    keep.push_back(portal.in);
    ctx.save(this, keep);
  } else {
    out = stage_.forward(ctx, input, tokens_ + off, targets_ + off, rows_, T_, &loss, &portal);
  }
  if (stage_.last()) {
    if (losses_.size() <= static_cast<size_t>(mb)) losses_.resize(mb + 1, 0.f);
    losses_[mb] = loss;
  }
  return out;
}

Tensor GPTStageRunner::backward(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) {
  if (recompute_) {  // the forward again, from the kept input, saving what backward needs
    std::vector<Tensor> kept = std::move(ctx.saved(this));
    ctx.release(this);
    const int64_t off = mb * rows_ * T_;
    float loss = 0;
    nn::Portal again{kept[1], Tensor()};  // the skip tensor it added; what it makes is sent already
    stage_.forward(ctx, kept[0], tokens_ + off, targets_ + off, rows_, T_, &loss, &again);
  }
  if (set_sync_) set_sync_(last);
  return stage_.backward(ctx, dy, grad_scale_, &portal);
}

// I: the input gradient now; the linears' weight gradients wait in ctx for W (layer norms,
// embeddings and the head compute theirs now: small, or needed on the way).
Tensor GPTStageRunner::backward_input(nn::Context& ctx, int mb, const Tensor& dy, bool last, nn::Portal& portal) {
  ctx.defer_weight_grads = true;
  Tensor dx = backward(ctx, mb, dy, last, portal);
  ctx.defer_weight_grads = false;
  return dx;
}

void GPTStageRunner::backward_weights(nn::Context& ctx, int mb, bool last) {
  if (set_sync_) set_sync_(last);
  ctx.run_deferred();
}

Shape GPTStageRunner::boundary_shape() const {
  return {rows_, T_ / seq_shards_, stage_.config().n_embd};
}

}  // namespace meshtrain::train
