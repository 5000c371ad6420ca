#include "meshtrain/model/cnn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/nn/activation.h"
#include "meshtrain/nn/conv.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/nn/pool.h"
#include "meshtrain/nn/shape.h"

namespace meshtrain::model {

// ---- configs ----

nlohmann::json CNNConfig::to_json() const {
  nlohmann::json j = {{"family", "cnn"}, {"name", name},       {"channels", channels}, {"height", height},
                      {"width", width},  {"classes", classes}, {"batch", batch}};
  if (scale != 1) j["scale"] = scale;  // absent at 1, as checkpoints before it wrote
  return j;
}

std::vector<std::string> cnn_config_names() { return {"cnn-small", "resnet-small", "inception-small"}; }

CNNConfig cnn_config(const std::string& name) {
  for (const std::string& n : cnn_config_names())
    if (n == name) {
      CNNConfig c;
      c.name = name;
      return c;
    }
  throw std::invalid_argument("unknown CNN '" + name + "'; the named CNNs are cnn-small, resnet-small and inception-small");
}

namespace {

Tensor sum_of(const Tensor& a, const Tensor& b, int threads) {
  Tensor s = Tensor::empty(a.shape());
  kernels::add(s.data(), a.data(), b.data(), a.numel(), threads);
  return s;
}

// The memory layouts (kernels/layout.h) of a convolution's input and output; 0: NCHW.
struct Blocks {
  int in = 0, out = 0;
};

// conv (no bias: the batch norm's shift takes its place) -> batch norm (-> ReLU), the conv's
// input and output channels laid out as `in_c` and `out_c` (cnn_layout.h: pairing), its input
// and output activations (and the batch norm's) in the memory layouts `blocks`.
// `hw`: the input's (C, H, W) or (H, W) (the last two are used).
void conv_bn(LayerSequence& s, const CNNLayout& L, const std::string& conv, const std::string& bn, int64_t in,
             int64_t out, int64_t k, int64_t stride, const Shape& hw, uint64_t seed,
             std::vector<nn::BatchNorm2d*>& bns, bool relu = true, Channels in_c = Channels::full,
             Channels out_c = Channels::full, bool input_grad = true, Blocks blocks = {}) {
  const size_t d = hw.size();
  s.add(L.conv(ConvDef{.name = conv, .in = in, .out = out, .kernel = k, .stride = stride, .padding = k / 2,
                       .height = hw[d - 2], .width = hw[d - 1], .bias = false, .seed = seed, .input = in_c,
                       .output = out_c, .input_grad = input_grad, .in_block = blocks.in, .out_block = blocks.out}));
  bns.push_back(s.add(L.batch_norm(bn, out, out_c)));
  bns.back()->relu_after = relu;  // the ReLU inside the batch norm's passes
  bns.back()->block = blocks.out;
}

// A unit that is a plain sequence, with its output shape given by a function of the input's.
class SequenceUnit : public CNNUnit {
 public:
  Tensor forward(nn::Context& ctx, const Tensor& x) override { return seq.forward(ctx, x); }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override { return seq.backward(ctx, dy); }
  void collect_params(std::vector<nn::Param*>& out) override { seq.collect_params(out); }
  void collect_buffers(std::vector<nn::Param*>& out) override { seq.collect_buffers(out); }
  void collect_batch_norms(std::vector<nn::BatchNorm2d*>& out) override { out.insert(out.end(), bns.begin(), bns.end()); }
  Shape out_chw(const Shape&) const override { return out_shape; }
  LayerSequence seq;
  std::vector<nn::BatchNorm2d*> bns;
  Shape out_shape;
};

// A basic residual block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the shortcut
// the identity or a 1x1 convolution with batch norm when the shape changes. conv1's output
// channels stay split where the layout splits them, conv2 takes them split (the pairing).
// Every activation, the block's input and output included, is in the memory layout the layout
// gives for its channels (CNNLayout::activation_block): all its layers take the blocked one.
class ResidualUnit : public CNNUnit {
 public:
  ResidualUnit(const CNNLayout& L, const std::string& name, int64_t in, int64_t out, int64_t stride, uint64_t seed,
               const Shape& in_chw)
      : out_shape_{out, (in_chw[1] - 1) / stride + 1, (in_chw[2] - 1) / stride + 1} {
    const int bi = L.activation_block(in), bo = L.activation_block(out);
    conv_bn(main_, L, name + ".conv1", name + ".bn1", in, out, 3, stride, in_chw, seed, bns_, true,
            Channels::full, Channels::split, true, {bi, bo});
    conv_bn(main_, L, name + ".conv2", name + ".bn2", out, out, 3, 1, out_shape_, seed, bns_, /*relu=*/false,
            Channels::split, Channels::full, true, {bo, bo});
    if (stride != 1 || in != out) {
      shortcut_ = std::make_unique<LayerSequence>();
      shortcut_->add(L.conv(ConvDef{.name = name + ".downsample.0", .in = in, .out = out, .kernel = 1,
                                    .stride = stride, .padding = 0, .height = in_chw[1], .width = in_chw[2],
                                    .bias = false, .seed = seed, .in_block = bi, .out_block = bo}));
      bns_.push_back(shortcut_->add(L.batch_norm(name + ".downsample.1", out, Channels::full)));
      bns_.back()->block = bo;
    }
  }
  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    Tensor y = main_.forward(ctx, x);
    Tensor s = shortcut_ ? shortcut_->forward(ctx, x) : x;
    return relu_.forward_sum(ctx, y, s);
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    Tensor dz = relu_.backward(ctx, dy);
    Tensor dx = main_.backward(ctx, dz);
    Tensor ds = shortcut_ ? shortcut_->backward(ctx, dz) : dz;
    return sum_of(dx, ds, ctx.threads);
  }
  void collect_params(std::vector<nn::Param*>& out) override {
    main_.collect_params(out);
    if (shortcut_) shortcut_->collect_params(out);
  }
  void collect_buffers(std::vector<nn::Param*>& out) override {
    main_.collect_buffers(out);
    if (shortcut_) shortcut_->collect_buffers(out);
  }
  void collect_batch_norms(std::vector<nn::BatchNorm2d*>& out) override { out.insert(out.end(), bns_.begin(), bns_.end()); }
  Shape out_chw(const Shape&) const override { return out_shape_; }

 private:
  LayerSequence main_;
  std::unique_ptr<LayerSequence> shortcut_;
  nn::ReLU relu_;
  std::vector<nn::BatchNorm2d*> bns_;
  Shape out_shape_;
};

// An Inception block: four branches on the same input, joined along channels. The layout says
// which branches this rank computes (branch parallelism) and joins their outputs; inside a
// branch, a 1x1 reduction's output channels stay split where the layout splits them and the
// 3x3 after it takes them split.
class InceptionUnit : public CNNUnit {
 public:
  // c1: branch 1's channels; r2, c2: branch 2's reduction and 3x3; r3, c3: branch 3's reduction
  // and its two 3x3; c4: branch 4's 1x1 after the pool.
  InceptionUnit(const CNNLayout& L, const std::string& name, int64_t in, int64_t c1, int64_t r2, int64_t c2,
                int64_t r3, int64_t c3, int64_t c4, uint64_t seed, const Shape& in_chw)
      : out_shape_{c1 + c2 + c3 + c4, in_chw[1], in_chw[2]}, in_channels_(in), name_(name) {
    const double hw = static_cast<double>(in_chw[1] * in_chw[2]);
    // Forward + backward FLOPs per sample of each branch (6 per multiply-add of its convolutions).
    const std::vector<double> costs = {6 * hw * in * c1, 6 * hw * (in * r2 + 9.0 * r2 * c2),
                                       6 * hw * (in * r3 + 9.0 * r3 * c3 + 9.0 * c3 * c3), 6 * hw * in * c4};
    here_ = L.branches_here(name, costs);
    const std::string n = name + ".branch";
    const Channels F = Channels::full, S = Channels::split;
    for (int b = 0; b < 4; ++b) {
      if (!here_[b]) continue;
      auto seq = std::make_unique<LayerSequence>();
      if (b == 0) conv_bn(*seq, L, n + "1.conv", n + "1.bn", in, c1, 1, 1, in_chw, seed, bns_);
      if (b == 1) {
        conv_bn(*seq, L, n + "2.0.conv", n + "2.0.bn", in, r2, 1, 1, in_chw, seed, bns_, true, F, S);
        conv_bn(*seq, L, n + "2.1.conv", n + "2.1.bn", r2, c2, 3, 1, in_chw, seed, bns_, true, S, F);
      }
      if (b == 2) {
        conv_bn(*seq, L, n + "3.0.conv", n + "3.0.bn", in, r3, 1, 1, in_chw, seed, bns_, true, F, S);
        conv_bn(*seq, L, n + "3.1.conv", n + "3.1.bn", r3, c3, 3, 1, in_chw, seed, bns_, true, S, F);
        conv_bn(*seq, L, n + "3.2.conv", n + "3.2.bn", c3, c3, 3, 1, in_chw, seed, bns_);
      }
      if (b == 3) {
        seq->add(L.max_pool(3, in_chw, nn::Pool2dOptions{.stride = 1, .padding = 1}));
        conv_bn(*seq, L, n + "4.1.conv", n + "4.1.bn", in, c4, 1, 1, in_chw, seed, bns_);
      }
      branches_.push_back(std::move(seq));
    }
    join_ = L.branch_join({c1, c2, c3, c4}, here_);
  }
  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    std::vector<Tensor> outs;
    for (auto& b : branches_) outs.push_back(b->forward(ctx, x));
    return join_->forward(ctx, outs);
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    std::vector<Tensor> d = join_->backward(ctx, dy);
    if (ctx.grad_slices > 0) {  // exact sums: the branches' input gradients added in float64, rounded once
      const Shape in{dy.dim(0), in_channels_, dy.dim(2), dy.dim(3)};
      std::vector<double> sum(static_cast<size_t>(shape_numel(in)), 0.0);
      for (size_t b = 0; b < branches_.size(); ++b) {
        const Tensor db = branches_[b]->backward(ctx, d[b]);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<double>(db.data()[i]);
      }
      return join_->input_grad_exact(ctx, std::move(sum), in);
    }
    Tensor dx;
    for (size_t b = 0; b < branches_.size(); ++b) {
      Tensor db = branches_[b]->backward(ctx, d[b]);
      dx = b == 0 ? db : sum_of(dx, db, ctx.threads);
    }
    if (branches_.empty()) {  // no branch here: the input gradient is the others' alone
      dx = Tensor::empty(dy.ndim() == 4 ? Shape{dy.dim(0), in_channels_, dy.dim(2), dy.dim(3)} : dy.shape());
      dx.zero();
    }
    return join_->input_grad(ctx, dx);
  }
  void collect_params(std::vector<nn::Param*>& out) override {
    for (auto& b : branches_) b->collect_params(out);
  }
  void collect_buffers(std::vector<nn::Param*>& out) override {
    for (auto& b : branches_) b->collect_buffers(out);
  }
  void collect_batch_norms(std::vector<nn::BatchNorm2d*>& out) override { out.insert(out.end(), bns_.begin(), bns_.end()); }
  Shape out_chw(const Shape&) const override { return out_shape_; }
  std::string block_name() const override { return name_; }
  std::vector<nn::Layer*> branch_layers() override {
    std::vector<nn::Layer*> out;
    for (auto& b : branches_) out.push_back(b.get());
    return out;
  }

 private:
  std::vector<bool> here_;
  std::vector<std::unique_ptr<LayerSequence>> branches_;  // those computed here, in branch order
  std::unique_ptr<BranchJoin> join_;
  std::vector<nn::BatchNorm2d*> bns_;
  Shape out_shape_;
  int64_t in_channels_ = 0;
  std::string name_;
};

// `chw`: the classifier's input (C, H, W); a global pool leaves C features, a flatten C H W.
// `block`: the memory layout of its input (a global pool takes the blocked one; flatten NCHW).
std::unique_ptr<SequenceUnit> classifier(const CNNLayout& L, const Shape& chw, int64_t hidden, int64_t classes,
                                         bool global_pool, uint64_t seed, int block = 0) {
  auto u = std::make_unique<SequenceUnit>();
  const int64_t in_features = global_pool ? chw[0] : chw[0] * chw[1] * chw[2];
  if (!global_pool && block != 0) throw std::logic_error("classifier: flatten takes NCHW only");
  if (global_pool) u->seq.add(L.global_pool(chw, block));
  else if (auto whole = L.whole_map(chw)) u->seq.add(std::move(whole));
  u->seq.add(std::make_unique<nn::Flatten>());
  auto fc = [&](const std::string& name, int64_t in, int64_t out) {
    // PyTorch's default bound for a linear layer, as a normal of the same variance.
    const float std = 1.0f / std::sqrt(3.0f * static_cast<float>(in));
    u->seq.add(std::make_unique<nn::Linear>(name, in, out, nn::LinearOptions{.bias = true, .init_std = std, .seed = seed}));
  };
  if (hidden > 0) {
    fc("fc1", in_features, hidden);
    u->seq.add(std::make_unique<nn::ReLU>());
    fc("fc2", hidden, classes);
  } else {
    fc("fc", in_features, classes);
  }
  u->out_shape = {classes};
  return u;
}

}  // namespace

// ---- the named architectures ----

std::vector<std::unique_ptr<CNNUnit>> build_cnn_units(const CNNConfig& cfg, uint64_t seed, const CNNLayout& L) {
  std::vector<std::unique_ptr<CNNUnit>> units;
  Shape chw{cfg.channels, cfg.height, cfg.width};
  auto push = [&](std::unique_ptr<CNNUnit> u) {
    chw = u->out_chw(chw);
    units.push_back(std::move(u));
  };
  auto pooled = [](const Shape& s, int64_t c) { return Shape{c, s[1] / 2, s[2] / 2}; };
  if (cfg.name == "cnn-small") {
    int64_t in = cfg.channels;
    for (int i = 1; i <= 2; ++i) {
      const int64_t out = i == 1 ? 32 : 64;
      auto u = std::make_unique<SequenceUnit>();
      // conv1's output channels stay split where the layout splits them; conv2 takes them split.
      conv_bn(u->seq, L, "conv" + std::to_string(i), "bn" + std::to_string(i), in, out, 3, 1, chw, seed, u->bns, true,
              i == 1 ? Channels::full : Channels::split, i == 1 ? Channels::split : Channels::full, i != 1);
      u->seq.add(L.max_pool(2, {out, chw[1], chw[2]}));
      u->out_shape = pooled(chw, out);
      push(std::move(u));
      in = out;
    }
    push(classifier(L, chw, 128, cfg.classes, false, seed));
  } else if (cfg.name == "resnet-small") {
    // Every activation after the images in the layout's memory layout for its channels (the
    // blocked one where oneDNN's convolutions run on it): no layer here needs NCHW.
    auto stem = std::make_unique<SequenceUnit>();
    conv_bn(stem->seq, L, "conv1", "bn1", cfg.channels, 32, 3, 1, chw, seed, stem->bns, true, Channels::full,
            Channels::full, false, {0, L.activation_block(32)});
    stem->out_shape = {32, chw[1], chw[2]};
    push(std::move(stem));
    const int64_t widths[] = {32, 64, 128};
    for (int l = 0; l < 3; ++l) {
      const int64_t in = chw[0], stride = l == 0 ? 1 : 2;
      push(std::make_unique<ResidualUnit>(L, "layer" + std::to_string(l + 1) + ".0", in, widths[l], stride, seed, chw));
    }
    push(classifier(L, chw, 0, cfg.classes, true, seed, L.activation_block(chw[0])));
  } else if (cfg.name == "inception-small") {
    auto stem = std::make_unique<SequenceUnit>();
    conv_bn(stem->seq, L, "conv1", "bn1", cfg.channels, 32, 3, 1, chw, seed, stem->bns, true, Channels::full,
            Channels::full, false);
    stem->seq.add(L.max_pool(2, {32, chw[1], chw[2]}));
    stem->out_shape = pooled(chw, 32);
    push(std::move(stem));
    push(std::make_unique<InceptionUnit>(L, "inception1", chw[0], 16, 16, 24, 8, 12, 12, seed, chw));
    push(std::make_unique<InceptionUnit>(L, "inception2", chw[0], 32, 32, 48, 16, 24, 24, seed, chw));
    push(classifier(L, chw, 0, cfg.classes, true, seed));
  } else {
    cnn_config(cfg.name);  // throws, naming the known ones
  }
  return units;
}

int64_t cnn_num_units(const CNNConfig& cfg) { return static_cast<int64_t>(cnn_unit_shapes(cfg).size()) - 1; }

std::vector<Shape> cnn_unit_shapes(const CNNConfig& cfg) {
  std::vector<Shape> shapes{{cfg.channels, cfg.height, cfg.width}};
  for (auto& u : build_cnn_units(cfg, 0, *single_rank_cnn_layout())) shapes.push_back(u->out_chw(shapes.back()));
  return shapes;
}

namespace {
std::vector<std::pair<std::string, Shape>> shapes_of(const CNNConfig& cfg, bool buffers) {
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& u : build_cnn_units(cfg, 0, *single_rank_cnn_layout())) {
    std::vector<nn::Param*> ps;
    if (buffers) u->collect_buffers(ps);
    else u->collect_params(ps);
    for (nn::Param* p : ps) out.emplace_back(p->name, p->global_shape);
  }
  return out;
}
}  // namespace

std::vector<std::pair<std::string, Shape>> cnn_param_shapes(const CNNConfig& cfg) { return shapes_of(cfg, false); }
std::vector<std::pair<std::string, Shape>> cnn_buffer_shapes(const CNNConfig& cfg) { return shapes_of(cfg, true); }

std::map<std::string, std::vector<double>> measure_branch_costs(const CNNConfig& cfg, int64_t rows, int threads,
                                                                int reps) {
  std::map<std::string, std::vector<double>> out;
  reps = std::max(reps, 1);
  const std::vector<Shape> shapes = cnn_unit_shapes(cfg);
  auto units = build_cnn_units(cfg, 0, *single_rank_cnn_layout());
  for (size_t u = 0; u < units.size(); ++u) {
    const std::vector<nn::Layer*> branches = units[u]->branch_layers();
    if (branches.empty()) continue;
    Shape in{rows};
    for (int64_t d : shapes[u]) in.push_back(d);
    Tensor x = Tensor::empty(in);
    for (int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>((i * 7919) % 255) / 255.0f - 0.5f;
    std::vector<double>& costs = out[units[u]->block_name()];
    for (nn::Layer* b : branches) {
      std::vector<double> times;
      for (int r = 0; r <= reps; ++r) {
        nn::Context ctx(threads);
        const auto t0 = std::chrono::steady_clock::now();
        Tensor y = b->forward(ctx, x);
        Tensor dy = Tensor::empty(y.shape());
        dy.fill(1e-3f);
        b->backward(ctx, dy);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) times.push_back(s);  // the first run builds the primitives
      }
      std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
      costs.push_back(times[times.size() / 2]);
    }
  }
  return out;
}

std::map<std::string, size_t> cnn_branch_blocks(const CNNConfig& cfg) {
  std::map<std::string, size_t> out;
  for (auto& u : build_cnn_units(cfg, 0, *single_rank_cnn_layout()))
    if (const size_t n = u->branch_layers().size()) out[u->block_name()] = n;
  return out;
}

std::vector<double> cnn_unit_flops(const CNNConfig& cfg) {
  // Multiply-adds of the convolutions and linears at their output sizes: a convolution's
  // weight (OC, IC, K, K) is applied at every output position; the output sizes follow the
  // unit shapes. Forward + backward = 3 x forward, 2 FLOPs per multiply-add.
  std::vector<double> flops;
  const auto shapes = cnn_unit_shapes(cfg);
  auto units = build_cnn_units(cfg, 0, *single_rank_cnn_layout());
  for (size_t i = 0; i < units.size(); ++i) {
    std::vector<nn::Param*> ps;
    units[i]->collect_params(ps);
    const Shape& out = shapes[i + 1];
    const double positions = out.size() == 3 ? static_cast<double>(out[1] * out[2]) : 1.0;
    double macs = 0;
    for (nn::Param* p : ps)
      if (p->global_shape.size() >= 2) macs += static_cast<double>(p->value.numel()) * positions;
    flops.push_back(6.0 * macs);
  }
  return flops;
}

// ---- the stage ----

CNNStage::CNNStage(const CNNConfig& cfg, uint64_t seed, int64_t first_unit, int64_t end_unit, bool first, bool last,
                   std::shared_ptr<const CNNLayout> layout)
    : cfg_(cfg), layout_(layout ? std::move(layout) : single_rank_cnn_layout()), first_unit_(first_unit),
      end_unit_(end_unit), first_(first), last_(last) {
  auto all = build_cnn_units(cfg, seed, *layout_);
  shapes_.push_back({cfg.channels, cfg.height, cfg.width});
  for (auto& u : all) shapes_.push_back(u->out_chw(shapes_.back()));
  const int64_t n = static_cast<int64_t>(all.size());
  if (end_unit_ < 0) end_unit_ = n;
  if (first_unit_ < 0 || first_unit_ >= end_unit_ || end_unit_ > n)
    throw std::invalid_argument("CNNStage: units " + std::to_string(first_unit_) + ".." + std::to_string(end_unit_) +
                                " outside the model's " + std::to_string(n) + " units");
  for (int64_t i = first_unit_; i < end_unit_; ++i) units_.push_back(std::move(all[i]));
  set_batch_stats_reduce(nullptr);
}

Shape CNNStage::input_shape(int64_t rows, int64_t) const {
  Shape s{rows};
  for (int64_t d : layout_->local_chw(shapes_[first_unit_])) s.push_back(d);
  return s;
}

Shape CNNStage::output_shape(int64_t rows, int64_t) const {
  Shape s{rows};
  const Shape& out = shapes_[end_unit_];
  for (int64_t d : out.size() == 3 ? layout_->local_chw(out) : out) s.push_back(d);
  return s;
}

Tensor CNNStage::forward(nn::Context& ctx, const Tensor& x_in, const MicroBatch& mb, StageResult* result,
                         nn::Portal*) {
  Tensor x = x_in;
  if (first_) {
    if (!mb.images) throw std::invalid_argument("CNNStage: the first stage was given no images");
    Shape whole{mb.rows};
    for (int64_t d : shapes_[0]) whole.push_back(d);
    Tensor images = Tensor::empty(whole);
    std::copy(mb.images, mb.images + images.numel(), images.data());
    x = layout_->input(images);
  }
  for (auto& u : units_) {
    ctx.pre_forward(u.get());
    x = u->forward(ctx, x);
    ctx.post_forward(u.get());
  }
  if (!last_) return x;
  // The head: cross-entropy over the classes (a target of -1 is not counted: padding rows).
  const int64_t N = x.dim(0), V = x.numel() / N;
  Tensor losses = Tensor::empty({N}), lse = Tensor::empty({N});
  kernels::crossentropy_forward(losses.data(), lse.data(), x.data(), mb.targets, N, V, ctx.threads);
  double sum = 0;
  int64_t valid = 0, correct = 0;
  predicted_.assign(N, 0);
  for (int64_t i = 0; i < N; ++i) {
    const float* row = x.data() + i * V;
    int64_t best = 0;
    for (int64_t c = 1; c < V; ++c)
      if (row[c] > row[best]) best = c;
    predicted_[i] = static_cast<int32_t>(best);
    if (mb.targets[i] < 0) continue;
    sum += losses[i], ++valid;
    correct += best == mb.targets[i];
  }
  if (result) *result = StageResult{valid ? static_cast<float>(sum / static_cast<double>(valid)) : 0.f, correct, valid};
  if (ctx.training) {
    ctx.save(&head_, {x, lse});
    auto& t = ctx.ints(&head_);
    t.assign(mb.targets, mb.targets + N);
    t.push_back(static_cast<int32_t>(valid));
  }
  return Tensor();
}

Tensor CNNStage::backward(nn::Context& ctx, const Tensor& dy_in, float grad_scale, nn::Portal*) {
  Tensor dy = dy_in;
  if (last_) {
    auto& s = ctx.saved(&head_);
    Tensor logits = s[0], lse = s[1];
    std::vector<int32_t> targets = std::move(ctx.ints(&head_));
    const int64_t valid = targets.back();
    targets.pop_back();
    ctx.release(&head_);
    const int64_t N = logits.dim(0), V = logits.numel() / N;
    Tensor dloss = Tensor::empty({N});
    dloss.fill(valid ? grad_scale / static_cast<float>(valid) : 0.f);
    kernels::crossentropy_backward_inplace(logits.data(), lse.data(), targets.data(), dloss.data(), N, V,
                                           ctx.threads);
    dy = logits;  // now the gradient of the logits
  }
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
    ctx.pre_backward(it->get());
    layout_->unit_backward(ctx, (*it)->params(), [&] { dy = (*it)->backward(ctx, dy); });
    ctx.post_backward(it->get());
  }
  return first_ ? Tensor() : dy;
}

std::vector<StageUnit> CNNStage::units() {
  std::vector<StageUnit> out;
  for (auto& u : units_) out.push_back({u.get(), u->params()});
  return out;
}

void CNNStage::collect_params(std::vector<nn::Param*>& out) {
  for (auto& u : units_) u->collect_params(out);
}

void CNNStage::collect_buffers(std::vector<nn::Param*>& out) {
  for (auto& u : units_) u->collect_buffers(out);
}

void CNNStage::set_batch_stats_reduce(const std::function<void(std::span<double>)>& reduce) {
  for (auto& u : units_) {
    std::vector<nn::BatchNorm2d*> bns;
    u->collect_batch_norms(bns);
    for (nn::BatchNorm2d* bn : bns) bn->reduce_stats = layout_->stats_reduce(reduce);
  }
}

}  // namespace meshtrain::model
