#include "meshtrain/model/cnn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/nn/activation.h"
#include "meshtrain/nn/conv.h"
#include "meshtrain/nn/dropout.h"
#include "meshtrain/nn/gelu.h"
#include "meshtrain/nn/layernorm.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/nn/pool.h"
#include "meshtrain/nn/shape.h"

namespace meshtrain::model {

// ---- configs ----

nlohmann::json CNNConfig::to_json() const {
  nlohmann::json j = {{"family", "cnn"}, {"name", name},       {"channels", channels}, {"height", height},
                      {"width", width},  {"classes", classes}, {"batch", batch}};
  if (scale != 1) j["scale"] = scale;  // absent at 1, as checkpoints before it wrote
  // A user's graph travels with the checkpoint; a named model is found by its name.
  if (graph && graph != named_graph(name)) j["graph"] = graph->source;
  return j;
}

std::vector<std::string> cnn_config_names() {
  std::vector<std::string> v;
  for (const std::string& n : named_graph_names())
    if (!named_graph(n)->tokens()) v.push_back(n);
  return v;
}

CNNConfig cnn_config(const std::string& name) {
  if (auto g = named_graph(name); g && !g->tokens()) return cnn_config(g);
  std::string names;
  for (const std::string& n : cnn_config_names()) names += (names.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown CNN '" + name + "'; the named CNNs are " + names);
}

CNNConfig cnn_config(std::shared_ptr<const Graph> graph) {
  if (graph->tokens())
    throw std::invalid_argument(graph->name + " is a token model (a transformer), not an image model");
  CNNConfig c;
  c.name = graph->name;
  c.channels = graph->image[0], c.height = graph->image[1], c.width = graph->image[2];
  c.classes = graph->classes;
  c.batch = graph->batch;
  c.graph = std::move(graph);
  return c;
}

namespace {

Tensor sum_of(const Tensor& a, const Tensor& b, int threads) {
  Tensor s = Tensor::empty(a.shape());
  kernels::add(s.data(), a.data(), b.data(), a.numel(), threads);
  return s;
}

// Forward + backward FLOPs per sample of a convolution (6 per multiply-add): what a block of
// parallel branches is balanced by.
double conv_flops(const GraphLayer& L, const Shape& in, const Shape& out) {
  return 6.0 * static_cast<double>(out[1] * out[2]) * static_cast<double>(in[0]) *
         static_cast<double>(L.out_channels * L.kernel * L.kernel);
}

// What the compiler knows of the whole graph: shapes, readers, splits and memory layouts.
struct GraphFacts {
  GraphFacts(const Graph& g, const Shape& chw, const CNNLayout& L)
      : g(g), chw(chw), shapes(infer_shapes(g, chw)), splits(channel_splits(g)), blocked(graph_takes_blocked(g)),
        readers(g.layers.size()) {
    for (size_t i = 0; i < g.layers.size(); ++i)
      for (int k : g.layers[i].from)
        if (k >= 0) readers[static_cast<size_t>(k)].push_back(static_cast<int>(i));
    layout = &L;
  }
  const Shape& shape(int k) const { return k < 0 ? chw : shapes[static_cast<size_t>(k)]; }
  // The memory layout (kernels/layout.h) of layer k's output (k = -1: the images, NCHW).
  int block(int k) const { return k < 0 || !blocked || shape(k).size() != 3 ? 0 : layout->activation_block(shape(k)[0]); }
  Channels in_c(size_t i) const { return splits.in_split[i] ? Channels::split : Channels::full; }
  Channels out_c(size_t i) const { return splits.out_split[i] ? Channels::split : Channels::full; }
  const Graph& g;
  Shape chw;
  std::vector<Shape> shapes;
  ChannelSplits splits;
  bool blocked;
  std::vector<std::vector<int>> readers;
  const CNNLayout* layout = nullptr;
};

// A single-input layer of the graph built by the layout's factory, with the ReLU that follows
// a batch norm folded into it (the same numbers in fewer passes). `seed`: the initialisation's
// (layout-invariant, by name).
std::unique_ptr<nn::Layer> build_layer(const GraphFacts& f, size_t i, bool fold_relu, uint64_t seed,
                                       std::vector<nn::BatchNorm2d*>& bns) {
  const GraphLayer& l = f.g.layers[i];
  const CNNLayout& L = *f.layout;
  const Shape& in = f.shape(l.from[0]);
  switch (l.op) {
    case Op::conv2d:
      return L.conv(ConvDef{.name = l.name, .in = in[0], .out = l.out_channels, .kernel = l.kernel, .stride = l.stride,
                            .padding = l.padding, .height = in[1], .width = in[2], .bias = l.bias, .seed = seed,
                            .input = f.in_c(i), .output = f.out_c(i), .input_grad = l.from[0] >= 0,
                            .in_block = f.block(l.from[0]), .out_block = f.block(static_cast<int>(i))});
    case Op::batchnorm2d: {
      std::unique_ptr<nn::BatchNorm2d> bn = L.batch_norm(l.name, in[0], f.in_c(i));
      bn->opt.eps = static_cast<float>(l.eps), bn->opt.momentum = static_cast<float>(l.momentum);
      bn->relu_after = fold_relu;
      bn->block = f.block(static_cast<int>(i));
      bns.push_back(bn.get());
      return bn;
    }
    case Op::relu: return std::make_unique<nn::ReLU>();
    case Op::dropout: return std::make_unique<nn::Dropout>(l.name, l.p, seed);
    case Op::maxpool2d:
      return L.max_pool(l.kernel, in, nn::Pool2dOptions{.stride = l.stride, .padding = l.padding});
    case Op::avgpool2d:
      return L.avg_pool(l.kernel, in, nn::Pool2dOptions{.stride = l.stride, .padding = l.padding});
    case Op::gelu: return std::make_unique<nn::Gelu>(/*exact=*/!l.tanh);
    case Op::layernorm: return std::make_unique<nn::LayerNorm>(l.name, in[0], static_cast<float>(l.eps));
    case Op::global_avgpool2d: return L.global_pool(in, f.block(l.from[0]));
    case Op::flatten: {
      auto seq = std::make_unique<LayerSequence>();
      // A feature map cut over ranks (row bands) is gathered first; a global pool's is whole.
      const bool pooled = l.from[0] >= 0 && f.g.layers[static_cast<size_t>(l.from[0])].op == Op::global_avgpool2d;
      if (!pooled)
        if (auto whole = L.whole_map(in)) seq->add(std::move(whole));
      seq->add(std::make_unique<nn::Flatten>());
      return seq;
    }
    case Op::linear: {
      // PyTorch's default bound for a linear layer, as a normal of the same variance.
      const float std = 1.0f / std::sqrt(3.0f * static_cast<float>(in[0]));
      return L.linear(LinearDef{.name = l.name, .in = in[0], .out = l.out_channels, .bias = l.bias, .init_std = std,
                                .seed = seed, .input = f.in_c(i), .output = f.out_c(i)});
    }
    default: throw std::logic_error("build_layer: " + l.name + " takes several inputs");
  }
}

// A node of a unit: one layer (with a ReLU folded in), a sum (with its ReLU), a concat, or a
// block of parallel branches. It reads the outputs of graph layers `in` (-1: the unit's
// input... as a graph index) and writes that of graph layer `out`.
struct Node {
  enum Kind { layer, sum, concat, branches } kind = layer;
  std::vector<int> in;
  int out = 0;
  std::unique_ptr<nn::Layer> op;          // layer
  std::unique_ptr<nn::ReLU> relu;         // sum: its ReLU, if one follows
  std::unique_ptr<nn::ConcatChannels> cat;  // concat
  // branches: those built here (in branch order), their join, and the source's shape.
  std::string name;
  std::vector<std::unique_ptr<LayerSequence>> branch;
  std::unique_ptr<BranchJoin> join;
  Shape source_chw;
  bool same_size = true;  // the join's maps are the source's size
};

// A unit compiled from graph layers [first, end): its nodes in the graph's order, run forward
// in that order and backward in reverse, each tensor's gradient summed over its readers.
// `skip_before`, `skip_after`: the skips crossing its first and its end boundary (graph.h
// unit_skips): it reads the one before if a layer of it does, and makes the one after if a layer
// of it (not its last) does; the stage holds them in between.
class GraphUnit : public CNNUnit {
 public:
  GraphUnit(const GraphFacts& f, int first, int end, uint64_t seed, int skip_before = kNoSkip,
            int skip_after = kNoSkip)
      : first_(first), end_(end) {
    const Graph& g = f.g;
    for (int i = first; i < end && skip_before != kNoSkip; ++i)
      for (int k : g.layers[static_cast<size_t>(i)].from)
        if (k == skip_before) side_in_ = skip_before;
    if (skip_after >= first && skip_after < end - 1) side_out_ = skip_after;
    // Blocks of parallel branches first: their layers are built inside the block.
    std::vector<bool> done(g.layers.size(), false);
    std::map<int, Branches> blocks;
    for (int i = first; i < end; ++i)
      if (g.layers[static_cast<size_t>(i)].op == Op::concat)
        if (auto b = find_branches(f, i)) {
          for (const auto& chain : b->chains)
            for (int p : chain) done[static_cast<size_t>(p)] = true;
          blocks[i] = std::move(*b);
        }
    for (int i = first; i < end; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      const GraphLayer& l = g.layers[static_cast<size_t>(i)];
      Node n;
      n.in = l.from;
      n.out = i;
      // A ReLU that is the layer's only reader is folded into a batch norm or a sum.
      const auto& rd = f.readers[static_cast<size_t>(i)];
      const bool relu_next = rd.size() == 1 && rd[0] < end && g.layers[static_cast<size_t>(rd[0])].op == Op::relu;
      if (l.op == Op::add) {
        n.kind = Node::sum;
        if (relu_next && l.from.size() == 2) {
          n.relu = std::make_unique<nn::ReLU>();
          n.out = rd[0], done[static_cast<size_t>(rd[0])] = true;
        }
      } else if (auto b = blocks.find(i); b != blocks.end()) {
        build_branches(f, i, b->second, seed, n);
      } else if (l.op == Op::concat) {
        n.kind = Node::concat;
        n.cat = std::make_unique<nn::ConcatChannels>();
      } else {
        const bool fold = l.op == Op::batchnorm2d && relu_next;
        n.op = build_layer(f, static_cast<size_t>(i), fold, seed, bns_);
        if (fold) n.out = rd[0], done[static_cast<size_t>(rd[0])] = true;
      }
      nodes_.push_back(std::move(n));
    }
    // How many nodes of this unit read each tensor: a tensor is dropped after its last reader.
    for (const Node& n : nodes_)
      for (int k : n.in) ++reads_[slot(k)];
    if (side_out_ != kNoSkip) ++reads_[side_out_];  // read after the unit: kept to the end
    out_shape_ = f.shape(end - 1);
  }

  bool reads_side() const override { return side_in_ != kNoSkip; }
  bool makes_side() const override { return side_out_ != kNoSkip; }
  Tensor forward_side(nn::Context& ctx, const Tensor& x, const Tensor& side_in, Tensor* side_out) override {
    return run_forward(ctx, x, side_in, side_out);
  }
  Tensor backward_side(nn::Context& ctx, const Tensor& dy, const Tensor& dside_out, Tensor* dside_in) override {
    return run_backward(ctx, dy, dside_out, dside_in);
  }

  Tensor forward(nn::Context& ctx, const Tensor& x) override { return run_forward(ctx, x, Tensor(), nullptr); }
  Tensor backward(nn::Context& ctx, const Tensor& dy) override { return run_backward(ctx, dy, Tensor(), nullptr); }

  Tensor run_forward(nn::Context& ctx, const Tensor& x, const Tensor& side_in, Tensor* side_out) {
    std::map<int, Tensor> v{{first_ - 1, x}};
    if (side_in_ != kNoSkip) {
      if (side_in.numel() == 0) throw std::logic_error("GraphUnit: the skip from layer " + std::to_string(side_in_) + " is missing");
      v[side_in_] = side_in;
    }
    std::map<int, int> left = reads_;
    auto take = [&](int k) {
      const int s = slot(k);
      Tensor t = v.at(s);
      if (--left[s] == 0) v.erase(s);
      return t;
    };
    for (Node& n : nodes_) {
      Tensor y;
      if (n.kind == Node::layer) {
        y = n.op->forward(ctx, take(n.in[0]));
      } else if (n.kind == Node::sum) {
        std::vector<Tensor> xs;
        for (int k : n.in) xs.push_back(take(k));
        if (n.relu) {
          y = n.relu->forward_sum(ctx, xs[0], xs[1]);
        } else {
          y = sum_of(xs[0], xs[1], ctx.threads);
          for (size_t j = 2; j < xs.size(); ++j) y = sum_of(y, xs[j], ctx.threads);
        }
      } else if (n.kind == Node::concat) {
        std::vector<Tensor> xs;
        for (int k : n.in) xs.push_back(take(k));
        y = n.cat->forward(ctx, xs);
      } else {
        const Tensor src = take(n.in[0]);
        std::vector<Tensor> outs;
        for (auto& b : n.branch) outs.push_back(b->forward(ctx, src));
        y = n.join->forward(ctx, outs);
      }
      v[slot(n.out)] = std::move(y);
    }
    if (side_out_ != kNoSkip && side_out) *side_out = v.at(side_out_);
    return v.at(slot(end_ - 1));
  }

  Tensor run_backward(nn::Context& ctx, const Tensor& dy, const Tensor& dside_out, Tensor* dside_in) {
    std::map<int, Tensor> grad{{slot(end_ - 1), dy}};
    auto add = [&](int k, Tensor d) {
      auto [it, fresh] = grad.try_emplace(slot(k), d);
      if (!fresh) it->second = sum_of(it->second, d, ctx.threads);
    };
    // The skip made here: its gradient from the units after (added first, as its later readers').
    if (side_out_ != kNoSkip && dside_out.numel() > 0) add(side_out_, dside_out);
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
      Node& n = *it;
      auto g = grad.find(slot(n.out));
      Tensor d = std::move(g->second);
      grad.erase(g);
      if (n.kind == Node::layer) {
        add(n.in[0], n.op->backward(ctx, d));
      } else if (n.kind == Node::sum) {
        if (n.relu) d = n.relu->backward(ctx, d);
        for (int k : n.in) add(k, d);
      } else if (n.kind == Node::concat) {
        std::vector<Tensor> ds = n.cat->backward(ctx, d);
        for (size_t j = 0; j < n.in.size(); ++j) add(n.in[j], ds[j]);
      } else {
        add(n.in[0], branches_backward(ctx, n, d));
      }
    }
    if (side_in_ != kNoSkip && dside_in)
      if (auto s = grad.find(side_in_); s != grad.end()) *dside_in = s->second;
    auto in = grad.find(slot(first_ - 1));
    return in == grad.end() ? Tensor() : in->second;
  }

  void collect_params(std::vector<nn::Param*>& out) override {
    for (Node& n : nodes_) {
      if (n.op) n.op->collect_params(out);
      for (auto& b : n.branch) b->collect_params(out);
    }
  }
  void collect_buffers(std::vector<nn::Param*>& out) override {
    for (Node& n : nodes_) {
      if (n.op) n.op->collect_buffers(out);
      for (auto& b : n.branch) b->collect_buffers(out);
    }
  }
  void collect_batch_norms(std::vector<nn::BatchNorm2d*>& out) override { out.insert(out.end(), bns_.begin(), bns_.end()); }
  Shape out_chw(const Shape&) const override { return out_shape_; }
  std::string block_name() const override {
    for (const Node& n : nodes_)
      if (n.kind == Node::branches) return n.name;
    return "";
  }
  Shape branch_input() const override {
    for (const Node& n : nodes_)
      if (n.kind == Node::branches) return n.source_chw;
    return {};
  }
  std::vector<nn::Layer*> branch_layers() override {
    std::vector<nn::Layer*> out;
    for (Node& n : nodes_)
      if (n.kind == Node::branches) {
        for (auto& b : n.branch) out.push_back(b.get());
        break;
      }
    return out;
  }

 private:
  // The unit's input is the output of layer first_ - 1 (-1: the images): both read as slot
  // first_ - 1; the skip it reads keeps its own.
  int slot(int k) const { return k == side_in_ ? k : k < first_ ? first_ - 1 : k; }

  // A concat whose inputs are chains of single-input layers, each read only by the next, from
  // one source (a chain may be empty: the source itself): a block of parallel branches (an
  // Inception block), which the layout may place on different ranks. None for another concat.
  struct Branches {
    int source = -1;
    std::vector<std::vector<int>> chains;  // graph layers of each branch, in order
  };
  std::optional<Branches> find_branches(const GraphFacts& f, int c) const {
    const Graph& g = f.g;
    Branches out;
    bool first = true;
    for (int k : g.layers[static_cast<size_t>(c)].from) {
      std::vector<int> chain;
      int p = k;
      while (p >= first_ && f.readers[static_cast<size_t>(p)].size() == 1 &&
             g.layers[static_cast<size_t>(p)].from.size() == 1) {
        chain.push_back(p);
        p = g.layers[static_cast<size_t>(p)].from[0];
      }
      if (!first && p != out.source) return std::nullopt;
      out.source = p, first = false;
      std::reverse(chain.begin(), chain.end());
      out.chains.push_back(std::move(chain));
    }
    return out;
  }

  void build_branches(const GraphFacts& f, int c, const Branches& b, uint64_t seed, Node& n) {
    const Graph& g = f.g;
    n.kind = Node::branches;
    n.name = g.layers[static_cast<size_t>(c)].name;
    n.in = {b.source};
    n.source_chw = f.shape(b.source);
    n.same_size = f.shape(c)[1] == n.source_chw[1] && f.shape(c)[2] == n.source_chw[2];
    std::vector<double> costs;
    std::vector<int64_t> channels;
    for (const auto& chain : b.chains) {
      double cost = 0;
      for (int p : chain) {
        const GraphLayer& l = g.layers[static_cast<size_t>(p)];
        if (l.op == Op::conv2d) cost += conv_flops(l, f.shape(l.from[0]), f.shape(p));
      }
      costs.push_back(cost);
      channels.push_back(f.shape(chain.empty() ? b.source : chain.back())[0]);
    }
    const std::vector<bool> here = f.layout->branches_here(n.name, costs);
    for (size_t k = 0; k < b.chains.size(); ++k) {
      if (!here[k]) continue;
      auto seq = std::make_unique<LayerSequence>();
      const std::vector<int>& chain = b.chains[k];
      for (size_t j = 0; j < chain.size(); ++j) {
        const size_t p = static_cast<size_t>(chain[j]);
        if (g.layers[p].op == Op::relu && j > 0 && g.layers[static_cast<size_t>(chain[j - 1])].op == Op::batchnorm2d)
          continue;  // folded into the batch norm before it
        const bool fold = g.layers[p].op == Op::batchnorm2d && j + 1 < chain.size() &&
                          g.layers[static_cast<size_t>(chain[j + 1])].op == Op::relu;
        seq->add(build_layer(f, p, fold, seed, bns_));
      }
      n.branch.push_back(std::move(seq));
    }
    n.join = f.layout->branch_join(channels, here);
  }

  // The branches' backward: each branch's input gradient, summed in branch order (in float64
  // and rounded once under exact sums), made whole by the join.
  Tensor branches_backward(nn::Context& ctx, Node& n, const Tensor& dy) {
    std::vector<Tensor> d = n.join->backward(ctx, dy);
    // The source's shape here: a layout that cuts rows gives the branches (and dy) its band.
    const Shape in = n.same_size ? Shape{dy.dim(0), n.source_chw[0], dy.dim(2), dy.dim(3)}
                                 : Shape{dy.dim(0), n.source_chw[0], n.source_chw[1], n.source_chw[2]};
    if (ctx.grad_slices > 0) {
      std::vector<double> sum(static_cast<size_t>(shape_numel(in)), 0.0);
      for (size_t b = 0; b < n.branch.size(); ++b) {
        const Tensor db = n.branch[b]->backward(ctx, d[b]);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<double>(db.data()[i]);
      }
      return n.join->input_grad_exact(ctx, std::move(sum), in);
    }
    Tensor dx;
    for (size_t b = 0; b < n.branch.size(); ++b) {
      Tensor db = n.branch[b]->backward(ctx, d[b]);
      dx = b == 0 ? db : sum_of(dx, db, ctx.threads);
    }
    if (n.branch.empty()) {  // no branch here: the input gradient is the others' alone
      dx = Tensor::empty(in);
      dx.zero();
    }
    return n.join->input_grad(ctx, dx);
  }

  int first_, end_;
  int side_in_ = kNoSkip, side_out_ = kNoSkip;  // the skips it reads and makes (graph layers)
  std::vector<Node> nodes_;
  std::map<int, int> reads_;
  std::vector<nn::BatchNorm2d*> bns_;
  Shape out_shape_;
};

}  // namespace

// ---- a graph's units ----

std::vector<std::unique_ptr<CNNUnit>> build_cnn_units(const CNNConfig& cfg, uint64_t seed, const CNNLayout& L) {
  if (!cfg.graph) throw std::logic_error("build_cnn_units: " + cfg.name + " has no layer graph");
  const GraphFacts facts(*cfg.graph, {cfg.channels, cfg.height, cfg.width}, L);
  const std::vector<int> starts = unit_starts(*cfg.graph), skips = unit_skips(*cfg.graph);
  std::vector<std::unique_ptr<CNNUnit>> units;
  for (size_t u = 0; u + 1 < starts.size(); ++u)
    units.push_back(std::make_unique<GraphUnit>(facts, starts[u], starts[u + 1], seed, skips[u], skips[u + 1]));
  return units;
}

Tensor CNNUnit::forward_side(nn::Context& ctx, const Tensor& x, const Tensor&, Tensor*) { return forward(ctx, x); }
Tensor CNNUnit::backward_side(nn::Context& ctx, const Tensor& dy, const Tensor&, Tensor*) { return backward(ctx, dy); }

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

std::map<std::string, Shape> cnn_branch_inputs(const CNNConfig& cfg) {
  std::map<std::string, Shape> out;
  for (auto& u : build_cnn_units(cfg, 0, *single_rank_cnn_layout()))
    if (!u->block_name().empty()) out[u->block_name()] = u->branch_input();
  return out;
}

std::vector<double> cnn_unit_flops(const CNNConfig& cfg) {
  // Per unit, its graph layers' forward FLOPs (graph.h forward_flops: 2 per multiply-add of a
  // convolution or a linear layer, at its own output size) times 3 for forward and backward
  // (the input and the weight gradient, each a product of the forward's size), except the
  // model's first layer, whose input (the images) takes no gradient: times 2. The cost model's
  // op list (model/cnn_cost.h) counts the same.
  const Graph& g = *cfg.graph;
  const Shape chw{cfg.channels, cfg.height, cfg.width};
  const std::vector<Shape> shapes = infer_shapes(g, chw);
  const std::vector<int> starts = unit_starts(g);
  std::vector<double> flops;
  for (size_t u = 0; u + 1 < starts.size(); ++u) {
    double f = 0;
    for (int i = starts[u]; i < starts[u + 1]; ++i) {
      const size_t k = static_cast<size_t>(i);
      const bool on_images = g.layers[k].from.size() == 1 && g.layers[k].from[0] < 0;
      f += (on_images ? 2.0 : 3.0) * forward_flops(g, shapes, chw, k);
    }
    flops.push_back(f);
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
  // Which unit boundaries carry a tensor whose channels a pair leaves split (a pipeline cut
  // between the two layers of a pair: each tp rank sends its share to its peer).
  const std::vector<int> starts = unit_starts(*cfg.graph);
  const ChannelSplits splits = channel_splits(*cfg.graph);
  split_at_.assign(starts.size(), false);
  for (size_t u = 1; u + 1 < starts.size(); ++u) split_at_[u] = splits.out_split[static_cast<size_t>(starts[u] - 1)];
  // Skips across unit boundaries: this stage takes the one crossing its first boundary from a
  // portal if a layer of it reads it (else it passes this stage by), and sends the one crossing
  // its end boundary if it has it (it makes it, or it is the stage's input); one crossing both
  // comes from further back, past this stage (graph.h skip_portals refuses one read here too).
  starts_ = starts;
  skips_ = unit_skips(*cfg.graph);
  layer_chw_ = infer_shapes(*cfg.graph, shapes_[0]);
  layer_split_ = splits.out_split;
  const int before = skips_[static_cast<size_t>(first_unit_)], after = skips_[static_cast<size_t>(end_unit_)];
  const int lo = starts_[static_cast<size_t>(first_unit_)], hi = starts_[static_cast<size_t>(end_unit_)];
  for (int i = lo; i < hi && before != kNoSkip; ++i)
    for (int k : cfg.graph->layers[static_cast<size_t>(i)].from)
      if (k == before) takes_ = before;
  if (after != kNoSkip && after != before) sends_ = after;
  set_batch_stats_reduce(nullptr);
}

Shape CNNStage::layer_shape(int k, int64_t rows) const {
  const Shape& whole = k < 0 ? shapes_[0] : layer_chw_[static_cast<size_t>(k)];
  Shape here = whole.size() == 3 ? layout_->local_chw(whole) : whole;
  if (k >= 0 && layer_split_[static_cast<size_t>(k)]) here = layout_->split_share(here);
  here.insert(here.begin(), rows);
  return here;
}

Shape CNNStage::portal_shape(int64_t rows, int64_t T) const {
  if (takes_ != kNoSkip) return layer_shape(takes_, rows);
  if (sends_ != kNoSkip) return layer_shape(sends_, rows);
  return output_shape(rows, T);
}

Shape CNNStage::boundary_shape(int64_t unit, int64_t rows) const {
  const Shape& whole = shapes_[static_cast<size_t>(unit)];
  Shape here = whole.size() == 3 ? layout_->local_chw(whole) : whole;
  if (split_at_[static_cast<size_t>(unit)]) here = layout_->split_share(here);
  here.insert(here.begin(), rows);
  return here;
}

Shape CNNStage::input_shape(int64_t rows, int64_t) const { return boundary_shape(first_unit_, rows); }

Shape CNNStage::output_shape(int64_t rows, int64_t) const { return boundary_shape(end_unit_, rows); }

Tensor CNNStage::forward(nn::Context& ctx, const Tensor& x_in, const MicroBatch& mb, StageResult* result,
                         nn::Portal* portal) {
  Tensor x = x_in;
  if (first_) {
    if (!mb.images) throw std::invalid_argument("CNNStage: the first stage was given no images");
    Shape whole{mb.rows};
    for (int64_t d : shapes_[0]) whole.push_back(d);
    Tensor images = Tensor::empty(whole);
    std::copy(mb.images, mb.images + images.numel(), images.data());
    x = layout_->input(images);
  }
  // The skip the stage holds between its units (graph.h unit_skips): taken from the portal, made
  // by a unit, or a unit's input that a later unit reads.
  // Without a portal (the planner's probes of a stage alone) the skip it takes is zeros.
  Tensor side;
  if (takes_ != kNoSkip) {
    if (portal && portal->in.numel() == 0)
      throw std::logic_error("CNNStage: the skip from layer " + std::to_string(takes_) + " did not arrive");
    side = portal ? portal->in : Tensor::zeros(layer_shape(takes_, mb.rows));
  }
  for (int64_t u = first_unit_; u < end_unit_; ++u) {
    CNNUnit& unit = *units_[static_cast<size_t>(u - first_unit_)];
    const int after = skips_[static_cast<size_t>(u + 1)];
    const bool input_after = after != kNoSkip && after == starts_[static_cast<size_t>(u)] - 1;
    const Tensor input = x;
    ctx.pre_forward(&unit);
    if (unit.reads_side() || unit.makes_side()) {
      Tensor made;
      x = unit.forward_side(ctx, x, side, &made);
      if (unit.makes_side()) side = made;
    } else {
      x = unit.forward(ctx, x);
    }
    ctx.post_forward(&unit);
    if (input_after) side = input;
    if (after == kNoSkip) side = Tensor();
  }
  if (sends_ != kNoSkip && portal) portal->out = side;
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

Tensor CNNStage::backward(nn::Context& ctx, const Tensor& dy_in, float grad_scale, nn::Portal* portal) {
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
  // The gradient of the skip the stage holds: from the portal (a later stage read it), then summed
  // over the units that read it, handed to the unit that made it or added to its unit's input's.
  Tensor dside;
  if (sends_ != kNoSkip) {
    if (portal && portal->in.numel() == 0)
      throw std::logic_error("CNNStage: the gradient of the skip from layer " + std::to_string(sends_) +
                             " did not arrive");
    dside = portal ? portal->in : Tensor::zeros(layer_shape(sends_, dy.dim(0)));  // zeros: a probe
  }
  for (int64_t u = end_unit_ - 1; u >= first_unit_; --u) {
    CNNUnit& unit = *units_[static_cast<size_t>(u - first_unit_)];
    const int after = skips_[static_cast<size_t>(u + 1)];
    const bool input_after = after != kNoSkip && after == starts_[static_cast<size_t>(u)] - 1;
    Tensor dmade, dinput, dread;
    if (unit.makes_side()) dmade = std::move(dside), dside = Tensor();
    if (input_after) dinput = std::move(dside), dside = Tensor();
    ctx.pre_backward(&unit);
    layout_->unit_backward(ctx, unit.params(), [&] {
      dy = unit.reads_side() || unit.makes_side() ? unit.backward_side(ctx, dy, dmade, &dread) : unit.backward(ctx, dy);
    });
    ctx.post_backward(&unit);
    if (dinput.numel() > 0) dy = dy.numel() == 0 ? dinput : sum_of(dy, dinput, ctx.threads);
    if (dread.numel() > 0) dside = dside.numel() == 0 ? dread : sum_of(dside, dread, ctx.threads);
  }
  if (takes_ != kNoSkip && portal) portal->out = dside;
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
