#include "meshtrain/parallel/spatial/cnn_spatial.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/kernels/layout.h"
#include "meshtrain/nn/conv.h"
#include "meshtrain/nn/saved_shape.h"
#include "meshtrain/parallel/tensor/tensor_parallel.h"
#include "meshtrain/parallel/tensor/tp_regions.h"

namespace meshtrain::parallel {

namespace {

using model::ConvDef;

constexpr int kHaloTag = 7;  // the exchanges' point-to-point tag on the group's communicator

// ---- bands ----

struct Rows {
  int64_t begin = 0, end = 0;  // [begin, end)
  int64_t size() const { return std::max<int64_t>(0, end - begin); }
  bool operator==(const Rows&) const = default;
};

Rows intersect(Rows a, Rows b) { return {std::max(a.begin, b.begin), std::min(a.end, b.end)}; }

// Rank r's rows of a map H rows high.
Rows band(int64_t H, int p, int r) { return {r * H / p, (r + 1) * H / p}; }

// A window over a map H rows high: its output height, and the input rows rank r's output band reads.
struct Window {
  int64_t H = 0, k = 1, s = 1, pad = 0;
  int64_t OH() const { return (H + 2 * pad - k) / s + 1; }
  Rows needs(int p, int r) const {
    const Rows o = band(OH(), p, r);
    return {o.begin * s - pad, (o.end - 1) * s - pad + k};
  }
};

// Copies `nrows` rows of `ncols` floats of each of `planes` planes from src (planes src_h x
// src_w, from row sr, column sc) to dst (planes dst_h x dst_w, at row dr, column dc); add: +=.
void copy_rows(float* dst, int64_t dst_h, int64_t dst_w, int64_t dr, int64_t dc, const float* src, int64_t src_h,
               int64_t src_w, int64_t sr, int64_t sc, int64_t planes, int64_t nrows, int64_t ncols, bool add) {
  if (!add && ncols == dst_w && ncols == src_w) {  // whole rows: each plane's rows are one block
    for (int64_t i = 0; i < planes; ++i)
      std::memcpy(dst + (i * dst_h + dr) * dst_w, src + (i * src_h + sr) * src_w,
                  static_cast<size_t>(nrows * ncols) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < planes; ++i)
    for (int64_t row = 0; row < nrows; ++row) {
      float* d = dst + (i * dst_h + dr + row) * dst_w + dc;
      const float* s = src + (i * src_h + sr + row) * src_w + sc;
      if (add)
        for (int64_t j = 0; j < ncols; ++j) d[j] += s[j];
      else
        std::memcpy(d, s, static_cast<size_t>(ncols) * sizeof(float));
    }
}

// ---- the halo exchange ----

// Before a window: this rank's band (N, C, h, W) -> the rows its output band reads (N, C, E, W'),
// rows outside the image set to `fill`. With `pad_columns` the padding columns are added too
// (W' = W + 2 pad, set to `fill`) and the layer runs unpadded; without, W' = W and the layer pads
// the columns itself (a convolution's column padding: Conv2dOptions::row_padding 0). After: the
// transpose.
//
// `block` is the activations' memory layout (kernels/layout.h). In nChw{B}c a map is N C/B planes
// of rows W B floats wide (a row holds the B channels of each column), so the exchange moves
// rows of the blocked planes exactly as it moves NCHW rows, and a padding column is B floats.
//
// The band's own rows are copied into the extended tensor, whole planes at a time when no padding
// columns interleave them; only the rows outside the image are filled.
class HaloExchange {
 public:
  HaloExchange(std::shared_ptr<comm::Communicator> g, Window w, float fill, std::string name, int block, bool pad_columns)
      : g_(std::move(g)), w_(w), fill_(fill), name_(std::move(name)), bk_(block > 0 ? block : 1),
        pad_columns_(pad_columns) {}

  // (N, C, h, W) -> (N, C, E, W')
  Tensor extend(const Tensor& x) const {
    const int p = g_->size(), r = g_->rank();
    const Rows own = band(w_.H, p, r), need = w_.needs(p, r);
    if (x.ndim() != 4 || x.dim(2) != own.size())
      throw std::invalid_argument(name_ + ": input " + shape_str(x.shape()) + " is not rank " + std::to_string(r) +
                                  "'s band of " + std::to_string(own.size()) + " rows");
    // Below, W, pad and Wp count floats of a plane's row (columns times the block).
    const int64_t N = x.dim(0), C = x.dim(1), h = x.dim(2), W = x.dim(3) * bk_, planes = N * C / bk_;
    const int64_t cols = pad_columns_ ? w_.pad : 0, pad = cols * bk_, Wp = W + 2 * pad;
    std::vector<std::vector<float>> out(p), in(p);
    std::vector<comm::Work> works;
    const auto t0 = comm::Clock::now();
    for (int q = 0; q < p; ++q) {  // post every receive and send at once
      if (q == r) continue;
      const Rows recv = intersect(band(w_.H, p, q), need), send = intersect(own, w_.needs(p, q));
      if (recv.size() > 0) {
        in[q].resize(static_cast<size_t>(planes * recv.size() * W));
        works.push_back(g_->irecv(in[q], q, {.tag = kHaloTag}));
      }
      if (send.size() > 0) {
        out[q].resize(static_cast<size_t>(planes * send.size() * W));
        copy_rows(out[q].data(), send.size(), W, 0, 0, x.data(), h, W, send.begin - own.begin, 0, planes, send.size(), W,
                  false);
        works.push_back(g_->isend(out[q], q, {.tag = kHaloTag}));
      }
    }
    Tensor ext = x;
    if (!(need == own && pad == 0)) {
      ext = Tensor::empty({N, C, need.size(), x.dim(3) + 2 * cols});
      if (pad > 0) {
        ext.fill(fill_);
      } else {  // only the rows outside the image: the rest is this band's or received
        const int64_t above = std::min(need.size(), std::max<int64_t>(0, -need.begin));
        const int64_t below = std::min(need.size(), std::max<int64_t>(0, need.end - w_.H));
        const int64_t E = need.size();
        for (int64_t i = 0; i < planes; ++i) {
          float* plane = ext.data() + i * E * W;
          std::fill(plane, plane + above * W, fill_);
          std::fill(plane + (E - below) * W, plane + E * W, fill_);
        }
      }
      const Rows mine = intersect(own, need);
      copy_rows(ext.data(), need.size(), Wp, mine.begin - need.begin, pad, x.data(), h, W, mine.begin - own.begin, 0,
                planes, mine.size(), W, false);
    }
    for (comm::Work& wk : works) wk.wait();
    if (!works.empty()) g_->observe("halo", t0, comm::Clock::now());
    for (int q = 0; q < p; ++q) {
      if (in[q].empty()) continue;
      const Rows recv = intersect(band(w_.H, p, q), need);
      copy_rows(ext.data(), need.size(), Wp, recv.begin - need.begin, pad, in[q].data(), recv.size(), W, 0, 0, planes,
                recv.size(), W, false);
    }
    return ext;
  }

  // (N, C, E, W') -> (N, C, h, W): the extended rows' gradients go back to their owners, each
  // rank adds what it receives for its band (in rank order).
  Tensor fold(const Tensor& dext) const {
    const int p = g_->size(), r = g_->rank();
    const Rows own = band(w_.H, p, r), need = w_.needs(p, r);
    const int64_t cols = pad_columns_ ? w_.pad : 0, pad = cols * bk_;
    const int64_t N = dext.dim(0), C = dext.dim(1), planes = N * C / bk_;
    const int64_t Wp = dext.dim(3) * bk_, W = Wp - 2 * pad;
    const int64_t E = need.size(), h = own.size();
    std::vector<std::vector<float>> out(p), in(p);
    std::vector<comm::Work> works;
    const auto t0 = comm::Clock::now();
    for (int q = 0; q < p; ++q) {
      if (q == r) continue;
      const Rows send = intersect(band(w_.H, p, q), need), recv = intersect(own, w_.needs(p, q));
      if (recv.size() > 0) {
        in[q].resize(static_cast<size_t>(planes * recv.size() * W));
        works.push_back(g_->irecv(in[q], q, {.tag = kHaloTag}));
      }
      if (send.size() > 0) {
        out[q].resize(static_cast<size_t>(planes * send.size() * W));
        copy_rows(out[q].data(), send.size(), W, 0, 0, dext.data(), E, Wp, send.begin - need.begin, pad, planes,
                  send.size(), W, false);
        works.push_back(g_->isend(out[q], q, {.tag = kHaloTag}));
      }
    }
    Tensor dx = dext;
    if (!(need == own && pad == 0)) {
      dx = Tensor::empty({N, C, h, dext.dim(3) - 2 * cols});
      const Rows mine = intersect(own, need);
      // The band's rows this rank's window does not read (a stride-2 window's last row) get no
      // gradient from here: zeros, before what their readers send is added.
      for (int64_t i = 0; i < planes; ++i) {
        float* plane = dx.data() + i * h * W;
        std::fill(plane, plane + std::max<int64_t>(0, mine.begin - own.begin) * W, 0.0f);
        std::fill(plane + std::max<int64_t>(0, mine.end - own.begin) * W, plane + h * W, 0.0f);
      }
      copy_rows(dx.data(), h, W, mine.begin - own.begin, 0, dext.data(), E, Wp, mine.begin - need.begin, pad, planes,
                mine.size(), W, false);
    }
    for (comm::Work& wk : works) wk.wait();
    if (!works.empty()) g_->observe("halo gradient", t0, comm::Clock::now());
    for (int q = 0; q < p; ++q) {
      if (in[q].empty()) continue;
      const Rows recv = intersect(own, w_.needs(p, q));
      copy_rows(dx.data(), h, W, recv.begin - own.begin, 0, in[q].data(), recv.size(), W, 0, 0, planes, recv.size(), W,
                true);
    }
    return dx;
  }

 private:
  std::shared_ptr<comm::Communicator> g_;
  Window w_;
  float fill_;
  std::string name_;
  int64_t bk_;        // floats per column of a plane's row: the block, 1 for NCHW
  bool pad_columns_;  // the padding columns are added here (the layer runs unpadded)
};

// ---- layers ----

// A convolution on the band extended by its halo, unpadded (the exchange pads with zeros).
class BandConv : public nn::Conv2d {
 public:
  BandConv(const ConvDef& d, std::shared_ptr<comm::Communicator> g)
      : nn::Conv2d(d.name, d.in, d.out, d.kernel,
                   nn::Conv2dOptions{.stride = d.stride, .padding = d.padding, .row_padding = 0, .bias = d.bias,
                                     .seed = d.seed, .input_grad = d.input_grad, .in_block = d.in_block,
                                     .out_block = d.out_block}),
        halo_(std::move(g), Window{d.height, d.kernel, d.stride, d.padding}, 0.0f, d.name, d.in_block,
              /*pad_columns=*/false),
        input_grad_(d.input_grad) {}

  Tensor forward(nn::Context& ctx, const Tensor& x) override { return nn::Conv2d::forward(ctx, halo_.extend(x)); }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    Tensor dext = nn::Conv2d::backward(ctx, dy);
    // The model's first layer: nobody reads its input gradient, so it is not sent back.
    return input_grad_ ? halo_.fold(dext) : dext;
  }

 private:
  HaloExchange halo_;
  bool input_grad_;
};

// A pool on the band extended by its halo. Max pooling pads with -inf (padding never wins, as
// unsplit); average pooling with 0 and divides by the whole window (the padding counted, as
// PyTorch's count_include_pad: every window of the padded map is whole, so the divisor is K x K
// unsplit too).
template <class Pool>
class BandPool : public nn::Layer {
 public:
  BandPool(std::shared_ptr<comm::Communicator> g, int64_t H, int64_t k, const nn::Pool2dOptions& opt, float fill,
           const char* what)
      : pool_(k, nn::Pool2dOptions{.stride = opt.stride == 0 ? k : opt.stride, .padding = 0}),
        halo_(std::move(g), Window{H, k, opt.stride == 0 ? k : opt.stride, opt.padding}, fill,
              std::string(what) + " " + std::to_string(k) + "x" + std::to_string(k), /*block=*/0,
              /*pad_columns=*/true) {}
  Tensor forward(nn::Context& ctx, const Tensor& x) override { return pool_.forward(ctx, halo_.extend(x)); }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override { return halo_.fold(pool_.backward(ctx, dy)); }
  void collect_params(std::vector<nn::Param*>&) override {}

 private:
  Pool pool_;
  HaloExchange halo_;
};

// (N, C, h, W) band -> (N, C, 1, 1): the band's sums, all-reduced, over the whole H W. `block`:
// the input's memory layout (the output, one value per channel, is the same in every layout).
class BandGlobalPool : public nn::Layer {
 public:
  BandGlobalPool(std::shared_ptr<comm::Communicator> g, int64_t HW, int block)
      : g_(std::move(g)), HW_(HW), block_(block) {}
  Tensor forward(nn::Context& ctx, const Tensor& x) override {
    const int64_t N = x.dim(0), C = x.dim(1), hw = x.dim(2) * x.dim(3);
    Tensor y = Tensor::empty({N, C, 1, 1});
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        float sum = 0.0f;
        for (int64_t j = 0; j < hw; ++j) sum += x.data()[kernels::activation_offset(n, c, j, C, hw, block_)];
        y.data()[n * C + c] = sum;
      }
    g_->all_reduce(std::span<float>(y.data(), static_cast<size_t>(N * C)), {.algorithm = kTPAlgorithm});
    for (int64_t i = 0; i < N * C; ++i) y.data()[i] /= static_cast<float>(HW_);
    if (ctx.training) {
      ctx.ints(this).clear();
      nn::detail::push_shape(ctx.ints(this), x.shape());
    }
    return y;
  }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override {
    std::vector<int32_t> saved = std::move(ctx.ints(this));
    ctx.release(this);
    size_t at = 0;
    Tensor dx = Tensor::empty(nn::detail::read_shape(saved, at));
    const int64_t N = dx.dim(0), C = dx.dim(1), hw = dx.dim(2) * dx.dim(3);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        const float v = dy.data()[n * C + c] / static_cast<float>(HW_);
        for (int64_t j = 0; j < hw; ++j) dx.data()[kernels::activation_offset(n, c, j, C, hw, block_)] = v;
      }
    return dx;
  }
  void collect_params(std::vector<nn::Param*>&) override {}

 private:
  std::shared_ptr<comm::Communicator> g_;
  int64_t HW_;
  int block_;
};

// (N, C, h, W) band -> (N, C, H, W): every band gathered (rank-major), rows put back in order.
class WholeMap : public nn::Layer {
 public:
  WholeMap(std::shared_ptr<comm::Communicator> g, int64_t H) : g_(std::move(g)), H_(H) {}
  Tensor forward(nn::Context&, const Tensor& x) override {
    const int p = g_->size();
    const int64_t N = x.dim(0), C = x.dim(1), W = x.dim(3);
    std::vector<size_t> counts(p);
    for (int q = 0; q < p; ++q) counts[q] = static_cast<size_t>(N * C * band(H_, p, q).size() * W);
    Tensor gathered = Tensor::empty({N * C * H_ * W});
    g_->all_gather(std::span<const float>(x.data(), static_cast<size_t>(x.numel())),
                   std::span<float>(gathered.data(), static_cast<size_t>(gathered.numel())), counts,
                   {.algorithm = kTPAlgorithm});
    Tensor full = Tensor::empty({N, C, H_, W});
    int64_t off = 0;
    for (int q = 0; q < p; ++q) {
      const Rows b = band(H_, p, q);
      copy_rows(full.data(), H_, W, b.begin, 0, gathered.data() + off, b.size(), W, 0, 0, N * C, b.size(), W, false);
      off += static_cast<int64_t>(counts[q]);
    }
    return full;
  }
  Tensor backward(nn::Context&, const Tensor& dy) override {
    const Rows b = band(H_, g_->size(), g_->rank());
    const int64_t N = dy.dim(0), C = dy.dim(1), W = dy.dim(3);
    Tensor dx = Tensor::empty({N, C, b.size(), W});
    copy_rows(dx.data(), b.size(), W, 0, 0, dy.data(), H_, W, b.begin, 0, N * C, b.size(), W, false);
    return dx;
  }
  void collect_params(std::vector<nn::Param*>&) override {}

 private:
  std::shared_ptr<comm::Communicator> g_;
  int64_t H_;
};

// ---- the layout ----

class SpatialLayout : public model::CNNLayout {
 public:
  explicit SpatialLayout(std::shared_ptr<comm::Communicator> g) : g_(std::move(g)) {}

  std::unique_ptr<nn::Layer> conv(const ConvDef& d) const override {
    partial_.insert(d.name + ".weight");
    partial_.insert(d.name + ".bias");
    return std::make_unique<BandConv>(d, g_);
  }
  std::unique_ptr<nn::BatchNorm2d> batch_norm(const std::string& name, int64_t channels,
                                              model::Channels c) const override {
    partial_.insert(name + ".weight");
    partial_.insert(name + ".bias");
    return model::CNNLayout::batch_norm(name, channels, c);
  }
  std::unique_ptr<nn::Layer> max_pool(int64_t kernel, const Shape& in_chw, const nn::Pool2dOptions& opt) const override {
    return std::make_unique<BandPool<nn::MaxPool2d>>(g_, in_chw[1], kernel, opt,
                                                     -std::numeric_limits<float>::infinity(), "max pool");
  }
  std::unique_ptr<nn::Layer> avg_pool(int64_t kernel, const Shape& in_chw, const nn::Pool2dOptions& opt) const override {
    return std::make_unique<BandPool<nn::AvgPool2d>>(g_, in_chw[1], kernel, opt, 0.0f, "average pool");
  }
  std::unique_ptr<nn::Layer> global_pool(const Shape& in_chw, int block) const override {
    return std::make_unique<BandGlobalPool>(g_, in_chw[1] * in_chw[2], block);
  }
  // The single rank's layouts: the halos move rows of blocked planes as they move NCHW rows.
  std::unique_ptr<nn::Layer> whole_map(const Shape& in_chw) const override {
    return std::make_unique<WholeMap>(g_, in_chw[1]);
  }

  Shape local_chw(const Shape& chw) const override {
    return {chw[0], band(chw[1], g_->size(), g_->rank()).size(), chw[2]};
  }
  Tensor input(const Tensor& images) const override {
    const int64_t N = images.dim(0), C = images.dim(1), H = images.dim(2), W = images.dim(3);
    const Rows b = band(H, g_->size(), g_->rank());
    Tensor x = Tensor::empty({N, C, b.size(), W});
    copy_rows(x.data(), b.size(), W, 0, 0, images.data(), H, W, b.begin, 0, N * C, b.size(), W, false);
    return x;
  }

  std::function<void(std::span<double>)> stats_reduce(std::function<void(std::span<double>)> dp) const override {
    return [g = g_, dp = std::move(dp)](std::span<double> v) {
      g->all_reduce(v, {.algorithm = kTPAlgorithm});
      if (dp) dp(v);
    };
  }
  void unit_backward(nn::Context& ctx, const std::vector<nn::Param*>& params,
                     const std::function<void()>& body) const override {
    std::vector<nn::Param*> partial;
    for (nn::Param* p : params)
      if (partial_.count(p->name)) partial.push_back(p);
    if (partial.empty()) return body();
    reduce_partial_grads(ctx, *g_, partial, body);
  }

  std::string describe() const override {
    return "feature maps split into row bands over spatial " + std::to_string(g_->size());
  }

 private:
  std::shared_ptr<comm::Communicator> g_;
  // Names of the parameters whose gradients are band-partial sums (convolutions, batch norms).
  mutable std::set<std::string> partial_;
};

// ---- the model's plan: what validation and the byte count read ----

struct PlanWindow {
  std::string name;
  int64_t C = 0, W = 0;
  Window w;
  bool input_grad = true;
};

class PlanLayout : public model::CNNLayout {
 public:
  std::unique_ptr<nn::Layer> conv(const ConvDef& d) const override {
    windows.push_back({d.name, d.in, d.width, Window{d.height, d.kernel, d.stride, d.padding}, d.input_grad});
    partial.insert(d.name + ".weight");
    partial.insert(d.name + ".bias");
    return model::CNNLayout::conv(d);
  }
  std::unique_ptr<nn::BatchNorm2d> batch_norm(const std::string& name, int64_t channels,
                                              model::Channels c) const override {
    bn_channels.push_back(channels);
    partial.insert(name + ".weight");
    partial.insert(name + ".bias");
    return model::CNNLayout::batch_norm(name, channels, c);
  }
  std::unique_ptr<nn::Layer> max_pool(int64_t kernel, const Shape& chw, const nn::Pool2dOptions& opt) const override {
    const int64_t s = opt.stride == 0 ? kernel : opt.stride;
    windows.push_back({"a " + std::to_string(kernel) + "x" + std::to_string(kernel) + " max pool", chw[0], chw[2],
                       Window{chw[1], kernel, s, opt.padding}, true});
    return model::CNNLayout::max_pool(kernel, chw, opt);
  }
  std::unique_ptr<nn::Layer> avg_pool(int64_t kernel, const Shape& chw, const nn::Pool2dOptions& opt) const override {
    const int64_t s = opt.stride == 0 ? kernel : opt.stride;
    windows.push_back({"a " + std::to_string(kernel) + "x" + std::to_string(kernel) + " average pool", chw[0], chw[2],
                       Window{chw[1], kernel, s, opt.padding}, true});
    return model::CNNLayout::avg_pool(kernel, chw, opt);
  }
  std::unique_ptr<nn::Layer> global_pool(const Shape& chw, int block) const override {
    pool_chw = chw;
    return model::CNNLayout::global_pool(chw, block);
  }
  std::unique_ptr<nn::Layer> whole_map(const Shape& chw) const override {
    whole_chw = chw;
    return nullptr;
  }
  mutable std::vector<PlanWindow> windows;
  mutable std::vector<int64_t> bn_channels;
  mutable std::set<std::string> partial;
  mutable Shape pool_chw, whole_chw;
  std::vector<int64_t> unit_partial_floats;  // per unit, the floats of its band-partial gradients
};

PlanLayout plan_of(const model::CNNConfig& cfg) {
  PlanLayout plan;
  for (auto& u : model::build_cnn_units(cfg, 0, plan)) {
    int64_t n = 0;
    for (nn::Param* p : u->params())
      if (plan.partial.count(p->name)) n += p->value.numel();
    plan.unit_partial_floats.push_back(n);
  }
  return plan;
}

// Elements rank r sends in a ring all-reduce of n elements (even blocks, comm/ring.cpp): every
// block but its own in the reduce-scatter, every block but its successor's in the all-gather.
int64_t ring_all_reduce_sent(int64_t n, int p, int r) {
  if (n == 0 || p == 1) return 0;
  auto block = [&](int b) { return n / p + (b < n % p ? 1 : 0); };
  return 2 * n - block(r) - block((r + 1) % p);
}

}  // namespace

void validate_cnn_spatial(const model::CNNConfig& cfg, int n) {
  if (n < 1) throw std::invalid_argument("--spatial must be at least 1");
  if (n == 1) return;
  if (cfg.graph) {  // dropout draws by an element's place in the whole map (nn/dropout.h)
    const model::Graph& g = *cfg.graph;
    const std::vector<Shape> shapes = model::infer_shapes(g, {cfg.channels, cfg.height, cfg.width});
    for (size_t i = 0; i < g.layers.size(); ++i)
      if (g.layers[i].op == model::Op::dropout && shapes[i].size() == 3)
        throw std::invalid_argument("--spatial " + std::to_string(n) + " cannot split " + cfg.name + "'s layer " +
                                    std::to_string(i) + " '" + g.layers[i].name + "' (dropout) over bands of rows: "
                                    "its mask is drawn by an element's place in the whole map; move the dropout "
                                    "after the flatten, or use --tp or --dp");
  }
  const PlanLayout plan = plan_of(cfg);
  // Every map's height: each window's input and output, and the classifier's input.
  std::string smallest;
  int64_t rows = std::numeric_limits<int64_t>::max();
  auto see = [&](int64_t h, const std::string& what) {
    if (h < rows) rows = h, smallest = what;
  };
  for (const PlanWindow& pw : plan.windows) {
    see(pw.w.H, pw.name + "'s input");
    see(pw.w.OH(), pw.name + "'s output");
  }
  if (!plan.pool_chw.empty()) see(plan.pool_chw[1], "the global pool's input");
  if (!plan.whole_chw.empty()) see(plan.whole_chw[1], "the classifier's input");
  if (rows >= n) return;
  throw std::invalid_argument("--spatial " + std::to_string(n) + " cannot cut " + cfg.name + "'s feature maps into " +
                              std::to_string(n) + " bands of rows: " + smallest + " is " + std::to_string(rows) +
                              " rows high, and every band needs at least one row of every map; " +
                              (rows >= 2 ? "--spatial 2 to " + std::to_string(rows) + " work"
                                         : std::string("no --spatial works for it")));
}

std::shared_ptr<const model::CNNLayout> cnn_spatial_layout(std::shared_ptr<comm::Communicator> group,
                                                           const model::CNNConfig& cfg) {
  validate_cnn_spatial(cfg, group->size());
  return std::make_shared<SpatialLayout>(std::move(group));
}

uint64_t cnn_spatial_bytes_per_microbatch(const model::CNNConfig& cfg, int p, int rank, int64_t rows) {
  if (p < 2) return 0;
  const PlanLayout plan = plan_of(cfg);
  const int r = rank;
  int64_t floats = 0, doubles = 0;
  for (const PlanWindow& pw : plan.windows) {
    const Rows own = band(pw.w.H, p, r);
    for (int q = 0; q < p; ++q) {
      if (q == r) continue;
      floats += intersect(own, pw.w.needs(p, q)).size() * pw.C * pw.W * rows;  // forward: my rows q reads
      if (pw.input_grad)  // backward: the gradients of the rows I read from q
        floats += intersect(band(pw.w.H, p, q), pw.w.needs(p, r)).size() * pw.C * pw.W * rows;
    }
  }
  for (int64_t C : plan.bn_channels)
    doubles += ring_all_reduce_sent(1 + 2 * C, p, r) + ring_all_reduce_sent(2 * C, p, r);
  for (int64_t n : plan.unit_partial_floats) floats += ring_all_reduce_sent(n, p, r);
  if (!plan.pool_chw.empty()) floats += ring_all_reduce_sent(rows * plan.pool_chw[0], p, r);
  if (!plan.whole_chw.empty()) {  // ring all-gather: every block but the successor's
    const int64_t C = plan.whole_chw[0], H = plan.whole_chw[1], W = plan.whole_chw[2];
    floats += rows * C * W * (H - band(H, p, (r + 1) % p).size());
  }
  return static_cast<uint64_t>(floats) * sizeof(float) + static_cast<uint64_t>(doubles) * sizeof(double);
}

}  // namespace meshtrain::parallel
