#include "meshtrain/model/stage.h"

#include <stdexcept>
#include <vector>

#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/kernels/embedding.h"
#include "meshtrain/kernels/gemm.h"

namespace meshtrain::model {

// ---- the plain (single-rank) layout ----

nn::ShardSpec GPTLayout::wte_shard(const GPTConfig&) const { return {}; }

std::unique_ptr<Block> GPTLayout::block(int64_t i, const GPTConfig& cfg, uint64_t seed) const {
  return std::make_unique<Block>("h." + std::to_string(i), cfg, seed);
}

Tensor GPTLayout::embed(nn::Context& ctx, const nn::Param& wte, const nn::Param& wpe,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t V) const {
  const int64_t C = wte.value.dim(1);
  Tensor x = Tensor::empty({B, T, C});
  kernels::embedding_forward(x.data(), tokens, wte.value.data(), wpe.value.data(), B, T, C, 0, V,
                             ctx.threads);
  return x;
}

void GPTLayout::embed_backward(nn::Context& ctx, nn::Param& wte, nn::Param& wpe, const Tensor& dx,
                               const int32_t* tokens, int64_t B, int64_t T, int64_t V) const {
  kernels::embedding_backward(wte.grad.data(), wpe.grad.data(), dx.data(), tokens, B, T,
                              wte.value.dim(1), 0, V, ctx.threads);
}

GPTLayout::Loss GPTLayout::head(nn::Context& ctx, const void* key, const Tensor& hN,
                                const nn::Param& wte, const int32_t* targets, int64_t B, int64_t T,
                                int64_t V) const {
  const int64_t C = hN.dim(2), N = B * T;
  Tensor logits = Tensor::empty({N, V});
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, N, V, C, 1.f, hN.data(), C,
                wte.value.data(), C, 0.f, logits.data(), V, ctx.gemm_with(wte));
  Tensor losses = Tensor::empty({N}), lse = Tensor::empty({N});
  kernels::crossentropy_forward(losses.data(), lse.data(), logits.data(), targets, N, V,
                                ctx.threads);
  Loss out;
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] >= 0) out.sum += losses[i], ++out.valid;
  if (ctx.training) {
    ctx.save(key, {hN, logits, lse});
    auto& t = ctx.ints(key);
    t.assign(targets, targets + N);
    t.push_back(static_cast<int32_t>(out.valid));
  }
  return out;
}

Tensor GPTLayout::head_backward(nn::Context& ctx, const void* key, nn::Param& wte,
                                float grad_scale, int64_t V) const {
  auto& s = ctx.saved(key);
  Tensor hN = s[0], logits = s[1], lse = s[2];
  std::vector<int32_t> targets = std::move(ctx.ints(key));
  const int64_t valid = targets.back();
  targets.pop_back();
  ctx.release(key);
  const int64_t N = logits.dim(0), C = hN.dim(2);
  // dloss_i = grad_scale / valid for every counted row (the loss is a mean).
  Tensor dloss = Tensor::empty({N});
  dloss.fill(valid ? grad_scale / static_cast<float>(valid) : 0.f);
  kernels::crossentropy_backward_inplace(logits.data(), lse.data(), targets.data(), dloss.data(),
                                         N, V, ctx.threads);
  Tensor& dlogits = logits;  // (N, V)
  // Tied output projection: dwte += dlogits^T hN; dh = dlogits wte. In bf16 dlogits, the
  // largest operand of the step, is converted once for both.
  thread_local std::vector<kernels::bf16_t> dlogits16;
  kernels::GemmOptions dw = ctx.gemm(), dx = ctx.gemm_with(wte);
  dw.a16 = dx.a16 = kernels::bf16_operand(dlogits.data(), N * V, dlogits16, dw);
  kernels::gemm(kernels::Trans::T, kernels::Trans::N, V, C, N, 1.f, dlogits.data(), V,
                hN.data(), C, 1.f, wte.grad.data(), C, dw);
  Tensor dh = Tensor::empty(hN.shape());
  kernels::gemm(kernels::Trans::N, kernels::Trans::N, N, C, V, 1.f, dlogits.data(), V,
                wte.value.data(), C, 0.f, dh.data(), C, dx);
  return dh;
}

Tensor GPTLayout::logits(nn::Context& ctx, const Tensor& hN, const nn::Param& wte, int64_t B, int64_t T,
                         int64_t V) const {
  const int64_t C = hN.dim(2);
  Tensor out = Tensor::empty({B, T, V});
  kernels::gemm(kernels::Trans::N, kernels::Trans::T, B * T, V, C, 1.f, hN.data(), C, wte.value.data(), C, 0.f,
                out.data(), V, ctx.gemm());
  return out;
}

Tensor GPTLayout::final_norm_backward(nn::Context& ctx, nn::LayerNorm& ln_f, const Tensor& dy) const {
  return ln_f.backward(ctx, dy);
}

std::shared_ptr<const GPTLayout> plain_layout() {
  static const auto layout = std::make_shared<const GPTLayout>();
  return layout;
}

// ---- GPTStage ----

namespace {
// a + b in a new tensor: the skip connection's sum in forward, and its gradient's in backward.
Tensor sum_of(const Tensor& a, const Tensor& b, int threads) {
  Tensor sum = Tensor::empty(a.shape());
  kernels::add(sum.data(), a.data(), b.data(), a.numel(), threads);
  return sum;
}

Portal* portal_or_throw(Portal* p, const char* pass) {
  if (!p)
    throw std::logic_error(std::string("GPTStage: the skip connection crosses stages, but ") + pass +
                           " was given no portal to carry it");
  return p;
}
}  // namespace

GPTStage::GPTStage(const GPTConfig& cfg, uint64_t seed, StageSpec spec,
                   std::shared_ptr<const GPTLayout> layout)
    : cfg_(cfg), spec_(spec), layout_(std::move(layout)) {
  cfg_.validate();
  if (spec_.end_layer < 0) spec_.end_layer = cfg.n_layer;
  if (spec_.first_layer < 0 || spec_.first_layer > spec_.end_layer || spec_.end_layer > cfg.n_layer)
    throw std::invalid_argument("GPTStage: blocks " + std::to_string(spec_.first_layer) + ".." +
                                std::to_string(spec_.end_layer) + " outside the model's " +
                                std::to_string(cfg.n_layer) + " layers");
  // The same names and draws as model::GPT, so every stage holds what the whole model holds.
  if (spec_.embedding || spec_.head) {
    wte = nn::Param("wte.weight", {cfg.vocab_size, cfg.n_embd}, layout_->wte_shard(cfg));
    nn::init_normal(wte, seed, 0.02f);
  }
  if (spec_.embedding) {
    wpe = nn::Param("wpe.weight", {cfg.block_size, cfg.n_embd});
    nn::init_normal(wpe, seed, 0.02f);
  }
  for (int64_t i = spec_.first_layer; i < spec_.end_layer; ++i) h.push_back(layout_->block(i, cfg, seed));
  if (spec_.head) ln_f = std::make_unique<nn::LayerNorm>("ln_f", cfg.n_embd);
}

Tensor GPTStage::trunk(nn::Context& ctx, const Tensor& x_in, const int32_t* tokens, int64_t B, int64_t T,
                       Portal* portal) {
  Tensor x = x_in;
  if (spec_.embedding) {
    check_tokens(cfg_, tokens, B, T);
    layout_->check_seq(T);
    x = layout_->embed(ctx, wte, wpe, tokens, B, T, cfg_.vocab_size);
    if (ctx.training) ctx.ints(this).assign(tokens, tokens + B * T);
  }
  Tensor skip;  // the skip connection's tensor, when both its ends are here
  for (size_t k = 0; k < h.size(); ++k) {
    const int64_t i = spec_.first_layer + static_cast<int64_t>(k);
    if (i == cfg_.skip_to) {  // x + the output of block skip_from
      const Tensor& s = holds(cfg_.skip_from) ? skip : portal_or_throw(portal, "forward")->in;
      if (s.shape() != x.shape()) throw std::logic_error("GPTStage: the skip tensor's shape differs from block " + std::to_string(i) + "'s input");
      x = sum_of(x, s, ctx.threads);
    }
    ctx.pre_forward(h[k].get());
    x = h[k]->forward(ctx, x);
    ctx.post_forward(h[k].get());
    if (i == cfg_.skip_from) (holds(cfg_.skip_to) ? skip : portal_or_throw(portal, "forward")->out) = x;
  }
  return x;
}

Tensor GPTStage::forward(nn::Context& ctx, const Tensor& x_in, const int32_t* tokens,
                         const int32_t* targets, int64_t B, int64_t T, float* loss, Portal* portal) {
  ctx.pre_forward(this);
  Tensor x = trunk(ctx, x_in, tokens, B, T, portal);
  if (spec_.head) {
    Tensor hN = ln_f->forward(ctx, x);
    const GPTLayout::Loss l = layout_->head(ctx, &head_, hN, wte, targets, B, T, cfg_.vocab_size);
    if (loss) *loss = l.valid ? static_cast<float>(l.sum / static_cast<double>(l.valid)) : 0.f;
    x = Tensor();
  }
  ctx.post_forward(this);
  return x;
}

Tensor GPTStage::logits(nn::Context& ctx, const int32_t* tokens, int64_t B, int64_t T) {
  if (!spec_.embedding || !spec_.head || spec_.first_layer != 0 || spec_.end_layer != cfg_.n_layer)
    throw std::logic_error("GPTStage::logits needs the whole model in one stage");
  nn::Context eval(ctx.threads, /*training=*/false, ctx.precision);
  Tensor hN = ln_f->forward(eval, trunk(eval, Tensor(), tokens, B, T, nullptr));
  return layout_->logits(eval, hN, wte, B, T, cfg_.vocab_size);
}

Tensor GPTStage::backward(nn::Context& ctx, const Tensor& dy, float grad_scale, Portal* portal) {
  const int64_t V = cfg_.vocab_size;
  ctx.pre_backward(this);
  Tensor dx = dy;
  if (spec_.head) {
    Tensor dhN = layout_->head_backward(ctx, &head_, wte, grad_scale, V);
    dx = layout_->final_norm_backward(ctx, *ln_f, dhN);
  }
  Tensor dskip;  // the skip tensor's gradient, when both its ends are here
  for (size_t k = h.size(); k-- > 0;) {
    const int64_t i = spec_.first_layer + static_cast<int64_t>(k);
    if (i == cfg_.skip_from) {  // block skip_from's output also fed block skip_to's input
      const Tensor& g = holds(cfg_.skip_to) ? dskip : portal_or_throw(portal, "backward")->in;
      dx = sum_of(dx, g, ctx.threads);
    }
    ctx.pre_backward(h[k].get());
    dx = h[k]->backward(ctx, dx);
    ctx.post_backward(h[k].get());
    if (i == cfg_.skip_to) (holds(cfg_.skip_from) ? dskip : portal_or_throw(portal, "backward")->out) = dx.clone();
  }
  if (spec_.embedding) {
    std::vector<int32_t> tokens = std::move(ctx.ints(this));
    ctx.release(this);
    const int64_t B = dx.dim(0), T = static_cast<int64_t>(tokens.size()) / B;  // dx may be a T shard
    layout_->embed_backward(ctx, wte, wpe, dx, tokens.data(), B, T, V);
    ctx.grad_ready(&wpe);
    dx = Tensor();
  }
  if (spec_.embedding || spec_.head) ctx.grad_ready(&wte);
  ctx.post_backward(this);
  return dx;
}

void GPTStage::collect_params(std::vector<nn::Param*>& out) {
  if (spec_.embedding || spec_.head) out.push_back(&wte);
  if (spec_.embedding) out.push_back(&wpe);
  for (auto& b : h) b->collect_params(out);
  if (ln_f) ln_f->collect_params(out);
}

// ---- as a model::Stage ----

Tensor GPTStage::forward(nn::Context& ctx, const Tensor& x, const MicroBatch& mb, StageResult* result,
                         Portal* portal) {
  float loss = 0;
  Tensor out = forward(ctx, x, mb.tokens, mb.targets, mb.rows, mb.T, &loss, portal);
  if (result && last()) *result = StageResult{loss, 0, 0};
  return out;
}

Shape GPTStage::input_shape(int64_t rows, int64_t T) const {
  return {rows, T / layout_->seq_shards(), cfg_.n_embd};
}

std::vector<StageUnit> GPTStage::units() {
  std::vector<StageUnit> out;
  StageUnit ends{this, {}};
  for (nn::Param* p : params())
    if (p->name.rfind("h.", 0) != 0) ends.params.push_back(p);
  if (!ends.params.empty()) out.push_back(std::move(ends));
  for (auto& b : h) out.push_back({b.get(), b->params()});
  return out;
}

}  // namespace meshtrain::model
