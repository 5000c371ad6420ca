#include "meshtrain/model/cnn_cost.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>

#include "meshtrain/kernels/layout.h"
#include "meshtrain/model/cnn_layout.h"
#include "meshtrain/model/graph.h"

namespace meshtrain::model {

namespace {

using Split = CostQuery::Split;

double numel(const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= static_cast<double>(d);
  return n;
}

// Rows of the largest band of a map `h` rows high over `p` ranks (cnn_spatial.h: rank r holds
// [r h / p, (r + 1) h / p)).
int64_t largest_band(int64_t h, int p) {
  int64_t most = 0;
  for (int r = 0; r < p; ++r) most = std::max(most, (r + 1) * h / p - r * h / p);
  return most;
}

// The most input rows any rank of `p` receives from the others before a window (kernel k,
// stride s, padding pad) from a map `h` rows high to one `oh` rows high: the rows its output
// band reads, within the image, outside its own band (cnn_spatial.h).
int64_t largest_halo(int64_t h, int64_t oh, int64_t k, int64_t s, int64_t pad, int p) {
  int64_t most = 0;
  for (int r = 0; r < p; ++r) {
    const int64_t oa = r * oh / p, ob = (r + 1) * oh / p;
    if (ob <= oa) continue;
    const int64_t lo = std::max<int64_t>(0, oa * s - pad), hi = std::min<int64_t>(h, (ob - 1) * s - pad + k);
    const int64_t own_lo = r * h / p, own_hi = (r + 1) * h / p;
    const int64_t inside = std::max<int64_t>(0, std::min(hi, own_hi) - std::max(lo, own_lo));
    most = std::max(most, std::max<int64_t>(0, hi - lo) - inside);
  }
  return most;
}

// The branch split's placement of one block (parallel/branch/cnn_branch.h assign_branches: a
// balance that lists ranks, else the longest-processing-time greedy by cost).
std::vector<int> place_branches(const std::vector<double>& costs, int ranks, const std::string& balance) {
  const int n = static_cast<int>(costs.size());
  std::vector<int> listed;
  if (!balance.empty() && balance != "flops") {
    std::stringstream ss(balance);
    std::string item;
    while (std::getline(ss, item, ',')) listed.push_back(std::stoi(item));
    if (static_cast<int>(listed.size()) == n) return listed;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return costs[static_cast<size_t>(a)] > costs[static_cast<size_t>(b)]; });
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  std::vector<int> held(static_cast<size_t>(ranks), 0), rank_of(static_cast<size_t>(n), 0);
  for (int b : order) {
    int best = 0;
    for (int q = 1; q < ranks; ++q) {
      const bool eq = held[static_cast<size_t>(q)] == 0, eb = held[static_cast<size_t>(best)] == 0;
      if (eq != eb ? eq : load[static_cast<size_t>(q)] < load[static_cast<size_t>(best)]) best = q;
    }
    rank_of[static_cast<size_t>(b)] = best, load[static_cast<size_t>(best)] += costs[static_cast<size_t>(b)];
    ++held[static_cast<size_t>(best)];
  }
  return rank_of;
}

struct Walker {
  Walker(const CNNConfig& cfg, const CostQuery& q)
      : g(*cfg.graph), q(q), chw{cfg.channels, cfg.height, cfg.width}, shapes(infer_shapes(g, chw)),
        splits(channel_splits(g)), readers(g.layers.size()), p(std::max(1, q.tp)),
        split(p > 1 ? q.split : Split::tensor), rows(static_cast<double>(q.rows)) {
    for (size_t i = 0; i < g.layers.size(); ++i)
      for (int k : g.layers[i].from)
        if (k >= 0) readers[static_cast<size_t>(k)].push_back(static_cast<int>(i));
    // The layouts' activation_block (model/cnn_layout.h): row bands keep the single rank's
    // blocks, filter and channel splits keep them where each rank's share is whole blocks,
    // branch splits run NCHW.
    const int b = kernels::conv_activation_block();
    block = graph_takes_blocked(g) && (p == 1 || split != Split::branch) ? b : 0;
  }
  const Shape& shape(int k) const { return k < 0 ? chw : shapes[static_cast<size_t>(k)]; }
  bool is_blocked(int k) const {
    const int64_t whole = tensor() ? static_cast<int64_t>(block) * p : block;
    return k >= 0 && block > 0 && shape(k).size() == 3 && shape(k)[0] % whole == 0;
  }
  bool tensor() const { return p > 1 && split == Split::tensor; }
  bool spatial() const { return p > 1 && split == Split::spatial; }
  // This rank's rows of a map `h` rows high.
  int64_t band(int64_t h) const { return spatial() ? largest_band(h, p) : h; }
  // Channels of layer k's output on this rank (a pair's split share under --tp).
  int64_t channels_out(int k, int64_t c) const { return tensor() && k >= 0 && splits.out_split[static_cast<size_t>(k)] ? c / p : c; }
  // Floats of layer k's output (k = -1: the images) on this rank, per sample.
  double local_numel(int k) const {
    const Shape& s = shape(k);
    if (s.size() != 3) return numel(s);
    return static_cast<double>(channels_out(k, s[0]) * band(s[1]) * s[2]);
  }

  OpCost layer_op(const std::string& name, const std::string& kernel, double elements, bool nchw) const {
    OpCost o;
    o.name = name, o.cls = OpClass::layer, o.kernel = kernel, o.nchw = nchw;
    o.elements = static_cast<int64_t>(elements);
    // Without measured layers (an older machine file): bytes at the "add" bandwidth.
    o.fwd_bytes = 8 * elements, o.bwd_bytes = 12 * elements;
    return o;
  }

  void conv(size_t i, std::vector<OpCost>& ops) const {
    const GraphLayer& l = g.layers[i];
    const Shape& in = shape(l.from[0]);
    const Shape& out = shape(static_cast<int>(i));
    OpCost o;
    o.name = l.name, o.cls = OpClass::conv;
    o.ic = in[0], o.oc = l.out_channels, o.kernel_size = l.kernel, o.stride = l.stride, o.w = in[2];
    o.h = in[1];
    o.input_grad = l.from[0] >= 0;
    o.nchw = !(is_blocked(static_cast<int>(i)));
    const double in_bytes = 4 * rows * numel(in), out_bytes = 4 * rows * numel(out);
    if (tensor() && !splits.in_split[i] && !splits.out_split[i] &&
        !filter_split_pays(in[0], l.out_channels, l.kernel, l.stride, o.input_grad, p)) {
      // replicated (model/cnn_layout.h filter_split_pays): the whole convolution, no collective
    } else if (tensor()) {
      const bool in_s = splits.in_split[i], out_s = splits.out_split[i];
      if (in_s) o.ic /= p;
      else o.oc /= p;  // a filter split (its output split, or gathered whole)
      if (in_s && !out_s) o.tp_fwd_bytes = out_bytes;           // partial sums
      if (!in_s && !out_s) o.tp_fwd_gather_bytes = out_bytes;   // the filters' outputs gathered
      if (!in_s && o.input_grad) o.tp_bwd_bytes = in_bytes;     // the input gradient's partial sums
    } else if (spatial()) {
      const int64_t ob = band(out[1]);
      const int64_t halo = largest_halo(in[1], out[1], l.kernel, l.stride, l.padding, p);
      o.h = std::max<int64_t>(1, ob * l.stride);
      const double halo_bytes = 4 * rows * static_cast<double>(halo * in[0] * in[2]);
      o.halo_fwd_bytes = halo_bytes, o.halo_bwd_bytes = o.input_grad ? halo_bytes : 0;
      o.halo_msgs = halo > 0 ? std::min(2, p - 1) : 0;
      // The band's partial weight gradient, all-reduced with the unit's.
      o.tp_bwd_bytes = 4.0 * static_cast<double>(l.out_channels * in[0] * l.kernel * l.kernel + (l.bias ? l.out_channels : 0));
    }
    // The FLOPs this rank computes: its output positions, its channels.
    const int64_t oh = spatial() ? band(out[1]) : out[1];
    o.fwd_flops = 2 * rows * static_cast<double>(oh * out[2]) * static_cast<double>(o.oc) *
                  static_cast<double>(o.ic * l.kernel * l.kernel);
    o.bwd_flops = (o.input_grad ? 2 : 1) * o.fwd_flops;
    // Without measured convolutions (an older machine file): the product it is, at the GEMM rates.
    o.m = static_cast<int64_t>(rows) * oh * out[2], o.n = o.oc, o.k = o.ic * l.kernel * l.kernel;
    ops.push_back(o);
  }

  void linear(size_t i, std::vector<OpCost>& ops) const {
    const GraphLayer& l = g.layers[i];
    const Shape& in = shape(l.from[0]);
    OpCost o;
    o.name = l.name, o.cls = OpClass::gemm;
    int64_t k = in[0], n = l.out_channels;
    if (tensor()) {
      const bool in_s = splits.in_split[i], out_s = splits.out_split[i];
      if (in_s) k /= p, o.tp_fwd_bytes = 4 * rows * static_cast<double>(l.out_channels);
      if (out_s) n /= p, o.tp_bwd_bytes = 4 * rows * static_cast<double>(in[0]);
    }
    o.m = static_cast<int64_t>(rows), o.n = n, o.k = k;
    o.fwd_flops = 2 * rows * static_cast<double>(n * k), o.bwd_flops = 2 * o.fwd_flops;
    ops.push_back(o);
  }

  // Pooling windows: the measured pool is 2 x 2 with stride 2 (an output element per four
  // inputs); another window is priced by its reads, in + out k^2 / 4, as that one's 1.25 in.
  void pool(size_t i, const char* kernel, std::vector<OpCost>& ops) const {
    const GraphLayer& l = g.layers[i];
    const Shape& in = shape(l.from[0]);
    const double n_in = rows * local_numel(l.from[0]), n_out = rows * local_numel(static_cast<int>(i));
    const double k2 = static_cast<double>(l.kernel * l.kernel);
    OpCost o = layer_op(l.name, kernel, (n_in + n_out * k2 / 4) / 1.25, true);
    if (spatial()) {
      const int64_t stride = l.stride > 0 ? l.stride : l.kernel;
      const int64_t halo = largest_halo(in[1], shape(static_cast<int>(i))[1], l.kernel, stride, l.padding, p);
      const double bytes = 4 * rows * static_cast<double>(halo * in[0] * in[2]);
      o.halo_fwd_bytes = o.halo_bwd_bytes = bytes;
      o.halo_msgs = halo > 0 ? std::min(2, p - 1) : 0;
    }
    ops.push_back(o);
  }

  void batch_norm(size_t i, bool relu, std::vector<OpCost>& ops) const {
    const GraphLayer& l = g.layers[i];
    OpCost o = layer_op(l.name, relu ? "batchnorm_relu" : "batchnorm", rows * local_numel(l.from[0]),
                        !is_blocked(static_cast<int>(i)));
    if (spatial()) {  // statistics over the group (float64), and the partial parameter gradients
      const double c = static_cast<double>(shape(l.from[0])[0]);
      o.tp_fwd_bytes = 8 * (1 + 2 * c), o.tp_bwd_bytes = 8 * 2 * c + 4 * 2 * c;
      o.tp_bwd_calls = 2;
    }
    ops.push_back(o);
  }

  // The layers of a block of parallel branches (a concat of chains from one source) under the
  // branch split: this rank's chains only, the join an all-gather, the input gradient all-reduced.
  struct Block {
    int source = -1;
    std::vector<std::vector<int>> chains;
  };
  std::optional<Block> find_block(int c, int first) const {
    Block out;
    bool first_chain = true;
    for (int k : g.layers[static_cast<size_t>(c)].from) {
      std::vector<int> chain;
      int at = k;
      while (at >= first && readers[static_cast<size_t>(at)].size() == 1 && g.layers[static_cast<size_t>(at)].from.size() == 1) {
        chain.push_back(at);
        at = g.layers[static_cast<size_t>(at)].from[0];
      }
      if (!first_chain && at != out.source) return std::nullopt;
      out.source = at, first_chain = false;
      std::reverse(chain.begin(), chain.end());
      out.chains.push_back(std::move(chain));
    }
    return out;
  }

  const Graph& g;
  CostQuery q;
  Shape chw;
  std::vector<Shape> shapes;
  ChannelSplits splits;
  std::vector<std::vector<int>> readers;
  int p;
  Split split;
  double rows;
  int block = 0;
};

}  // namespace

std::vector<OpCost> cnn_layer_costs(const CNNConfig& cfg, int64_t first_unit, int64_t end_unit, bool head,
                                    const CostQuery& q) {
  const Walker w(cfg, q);
  const Graph& g = w.g;
  const std::vector<int> starts = unit_starts(g);
  std::vector<OpCost> ops;
  std::vector<bool> skip(g.layers.size(), false);
  for (int64_t u = first_unit; u < end_unit; ++u) {
    const int first = starts[static_cast<size_t>(u)], end = starts[static_cast<size_t>(u + 1)];
    const size_t before = ops.size();
    // Blocks of parallel branches under the branch split: the chains of other ranks are skipped.
    std::map<int, bool> joins;  // concat layer -> gathered
    if (w.p > 1 && w.split == Split::branch)
      for (int i = first; i < end; ++i) {
        if (g.layers[static_cast<size_t>(i)].op != Op::concat) continue;
        const auto b = w.find_block(i, first);
        if (!b) continue;
        std::vector<double> costs;
        for (const auto& chain : b->chains) {
          double c = 0;
          for (int k : chain)
            if (g.layers[static_cast<size_t>(k)].op == Op::conv2d) {
              const Shape& in = w.shape(g.layers[static_cast<size_t>(k)].from[0]);
              const Shape& out = w.shape(k);
              c += 6.0 * static_cast<double>(out[1] * out[2] * in[0] * g.layers[static_cast<size_t>(k)].out_channels *
                                             g.layers[static_cast<size_t>(k)].kernel * g.layers[static_cast<size_t>(k)].kernel);
            }
          costs.push_back(c);
        }
        const auto measured = q.branch_costs.find(g.layers[static_cast<size_t>(i)].name);
        if (q.branch_balance.empty() && measured != q.branch_costs.end() && measured->second.size() == costs.size())
          costs = measured->second;
        const std::vector<int> rank = place_branches(costs, w.p, q.branch_balance);
        for (size_t c = 0; c < b->chains.size(); ++c)
          if (rank[c] != q.tp_rank)
            for (int k : b->chains[c]) skip[static_cast<size_t>(k)] = true;
        joins[i] = true;
      }
    for (int i = first; i < end; ++i) {
      const size_t s = static_cast<size_t>(i);
      if (skip[s]) continue;
      const GraphLayer& l = g.layers[s];
      const auto& rd = w.readers[s];
      const bool relu_next = rd.size() == 1 && rd[0] < end && g.layers[static_cast<size_t>(rd[0])].op == Op::relu;
      const double n_in = w.rows * (l.from.empty() ? 0.0 : w.local_numel(l.from[0]));
      const double n_out = w.rows * w.local_numel(i);
      switch (l.op) {
        case Op::conv2d: w.conv(s, ops); break;
        case Op::linear: w.linear(s, ops); break;
        case Op::batchnorm2d:
          w.batch_norm(s, relu_next, ops);
          if (relu_next) skip[static_cast<size_t>(rd[0])] = true;
          break;
        case Op::add:
          ops.push_back(w.layer_op(l.name, relu_next && l.from.size() == 2 ? "add_relu" : "add", n_out, !w.is_blocked(i)));
          if (relu_next && l.from.size() == 2) skip[static_cast<size_t>(rd[0])] = true;
          break;
        case Op::relu:
        case Op::dropout: ops.push_back(w.layer_op(l.name, "relu", n_in, !w.is_blocked(l.from[0]))); break;
        case Op::maxpool2d: w.pool(s, "maxpool", ops); break;
        case Op::avgpool2d: w.pool(s, "avgpool", ops); break;
        case Op::global_avgpool2d: {
          OpCost o = w.layer_op(l.name, "global_pool", n_in, !w.is_blocked(l.from[0]));
          if (w.spatial()) o.tp_fwd_bytes = 4 * w.rows * static_cast<double>(w.shape(l.from[0])[0]);
          ops.push_back(o);
          break;
        }
        case Op::flatten: {
          OpCost o = w.layer_op(l.name, "flatten", n_in, true);
          const bool pooled = l.from[0] >= 0 && g.layers[static_cast<size_t>(l.from[0])].op == Op::global_avgpool2d;
          if (w.spatial() && !pooled) o.tp_fwd_gather_bytes = 4 * w.rows * numel(w.shape(l.from[0]));
          ops.push_back(o);
          break;
        }
        case Op::concat: {
          OpCost o = w.layer_op(l.name, "concat", n_out, true);
          if (joins.count(i)) {
            o.tp_fwd_gather_bytes = 4 * w.rows * numel(w.shape(i));
            const auto b = w.find_block(i, first);
            o.tp_bwd_bytes = 4 * w.rows * numel(w.shape(b->source));
          }
          ops.push_back(o);
          break;
        }
        case Op::gelu: {
          OpCost o;
          o.name = l.name, o.cls = OpClass::memory, o.kernel = "gelu";
          o.fwd_bytes = 8 * n_in, o.bwd_bytes = 12 * n_in;
          ops.push_back(o);
          break;
        }
        case Op::layernorm: {
          OpCost o;
          o.name = l.name, o.cls = OpClass::memory, o.kernel = "layernorm";
          o.fwd_bytes = 8 * n_in, o.bwd_bytes = 16 * n_in;
          ops.push_back(o);
          break;
        }
        default: break;  // token models' ops never reach a CNN
      }
    }
    if (ops.size() == before) {
      OpCost o;
      o.name = "unit." + std::to_string(u);
      ops.push_back(o);
    }
    ops.back().unit_end = true;
  }
  if (head) {
    OpCost ce;
    ce.name = "cross_entropy", ce.cls = OpClass::memory, ce.kernel = "add";
    ce.fwd_bytes = ce.bwd_bytes = 8 * w.rows * static_cast<double>(cfg.classes);
    ops.push_back(ce);
  }
  return ops;
}

}  // namespace meshtrain::model
