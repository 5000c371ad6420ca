#include "meshtrain/parallel/branch/cnn_branch.h"

#include <map>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "meshtrain/nn/conv.h"
#include "meshtrain/parallel/tensor/tp_regions.h"

namespace meshtrain::parallel {

namespace {

using model::Channels;
using model::ConvDef;

std::string ranks_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// ---- the join ----

// Forward: this rank's branch outputs, each (N, c_b, H, W) in branch order, packed one after the
// other into this rank's block of the gathered buffer (rank-major: rank q's block holds its
// branches' outputs in branch order), all-gathered with counts N L_q H W, then copied into the
// concatenation (N, C, H, W) at each branch's channel offset. Backward: branch b's channels of
// dy. Input gradient: the sum over the group (each rank's dx is its branches' share).
class GroupJoin : public model::BranchJoin {
 public:
  GroupJoin(std::shared_ptr<comm::Communicator> group, std::vector<int64_t> channels, std::vector<int> rank_of)
      : group_(std::move(group)), channels_(std::move(channels)), rank_of_(std::move(rank_of)) {
    offset_.assign(channels_.size(), 0);
    for (size_t b = 1; b < channels_.size(); ++b) offset_[b] = offset_[b - 1] + channels_[b - 1];
    local_.assign(group_->size(), 0);
    for (size_t b = 0; b < channels_.size(); ++b) local_[rank_of_[b]] += channels_[b];
  }

  Tensor forward(nn::Context&, std::span<const Tensor> outs) override {
    if (outs.empty()) throw std::logic_error("branch join: a rank without a branch (the assignment gives each one)");
    const int p = group_->size(), me = group_->rank();
    const int64_t N = outs[0].dim(0), H = outs[0].dim(2), W = outs[0].dim(3), HW = H * W;
    const int64_t C = std::accumulate(channels_.begin(), channels_.end(), int64_t{0});
    std::vector<std::size_t> counts(p);
    std::vector<int64_t> at(p + 1, 0);  // where rank q's block starts in the gathered buffer
    for (int q = 0; q < p; ++q) {
      counts[q] = static_cast<std::size_t>(N * local_[q] * HW);
      at[q + 1] = at[q] + static_cast<int64_t>(counts[q]);
    }
    Tensor gathered = Tensor::empty({at[p]});
    int64_t pos = at[me];
    for (const Tensor& o : outs) {
      std::memcpy(gathered.data() + pos, o.data(), static_cast<size_t>(o.numel()) * sizeof(float));
      pos += o.numel();
    }
    group_->all_gather(std::span<const float>(gathered.data() + at[me], counts[me]),
                       std::span<float>(gathered.data(), static_cast<size_t>(at[p])), counts,
                       {.algorithm = kTPAlgorithm});
    Tensor full = Tensor::empty({N, C, H, W});
    for (int q = 0; q < p; ++q) {
      pos = at[q];
      for (size_t b = 0; b < channels_.size(); ++b) {
        if (rank_of_[b] != q) continue;
        const int64_t cb = channels_[b] * HW;
        for (int64_t n = 0; n < N; ++n)
          std::memcpy(full.data() + (n * C + offset_[b]) * HW, gathered.data() + pos + n * cb,
                      static_cast<size_t>(cb) * sizeof(float));
        pos += N * cb;
      }
    }
    return full;
  }

  std::vector<Tensor> backward(nn::Context&, const Tensor& dy) override {
    const int64_t N = dy.dim(0), C = dy.dim(1), HW = dy.dim(2) * dy.dim(3);
    std::vector<Tensor> out;
    for (size_t b = 0; b < channels_.size(); ++b) {
      if (rank_of_[b] != group_->rank()) continue;
      Tensor d = Tensor::empty({N, channels_[b], dy.dim(2), dy.dim(3)});
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(d.data() + n * channels_[b] * HW, dy.data() + (n * C + offset_[b]) * HW,
                    static_cast<size_t>(channels_[b] * HW) * sizeof(float));
      out.push_back(std::move(d));
    }
    return out;
  }

  Tensor input_grad(nn::Context&, Tensor dx) override { return CopyToTP::backward(*group_, std::move(dx)); }
  Tensor input_grad_exact(nn::Context& ctx, std::vector<double> sum, const Shape& shape) override {
    group_->all_reduce(std::span<double>(sum));  // float64 on the wire: the sum rounded once
    return model::BranchJoin::input_grad_exact(ctx, std::move(sum), shape);
  }

 private:
  std::shared_ptr<comm::Communicator> group_;
  std::vector<int64_t> channels_;  // of each branch's output
  std::vector<int> rank_of_;       // the rank computing each branch
  std::vector<int64_t> offset_;    // each branch's first channel in the concatenation
  std::vector<int64_t> local_;     // channels each rank's branches produce
};

// ---- the layout ----

// Placement by cost (measured or FLOPs), not by a list of ranks.
bool balance_by_cost(const std::string& balance) { return balance.empty() || balance == "flops"; }

// One block's placement, as branches_here decided it.
struct Placement {
  std::string name;
  std::vector<double> costs;
  std::vector<int> rank_of;
};

// Ownership: the model builds the branches this rank computes right after asking branches_here
// and before asking branch_join (model/cnn.cpp), and only those: a layer built in between is
// one of this rank's branches, whatever its name, and its parameters are owned by this rank.
class BranchLayout : public model::CNNLayout {
 public:
  BranchLayout(std::shared_ptr<comm::Communicator> group, std::string balance,
               std::map<std::string, std::vector<double>> measured)
      : group_(std::move(group)), balance_(std::move(balance)), measured_(std::move(measured)) {
    if (!balance_by_cost(balance_)) parse_branch_balance(balance_, group_->size());
  }

  std::vector<bool> branches_here(const std::string& name, const std::vector<double>& flops) const override {
    // Without a balance: the measured seconds where the trainer measured them, else the FLOPs.
    const auto m = measured_.find(name);
    const bool timed = balance_.empty() && m != measured_.end() && m->second.size() == flops.size();
    const std::vector<double>& costs = timed ? m->second : flops;
    timed_ = timed_ || timed;
    Placement pl{name, costs, assign_branches(costs, group_->size(), balance_)};
    // A block built again (a stage builds every unit and keeps its own) replaces its record.
    std::erase_if(placed_, [&](const Placement& q) { return q.name == name; });
    placed_.push_back(pl);
    std::vector<bool> here(costs.size());
    for (size_t b = 0; b < costs.size(); ++b) here[b] = pl.rank_of[b] == group_->rank();
    in_block_ = true;
    return here;
  }

  std::unique_ptr<model::BranchJoin> branch_join(const std::vector<int64_t>& channels,
                                                 const std::vector<bool>& here) const override {
    if (placed_.empty() || placed_.back().rank_of.size() != channels.size())
      throw std::logic_error("branch_join without the branches_here of its block");
    const std::vector<int>& rank_of = placed_.back().rank_of;
    in_block_ = false;
    for (size_t b = 0; b < here.size(); ++b)
      if (here[b] != (rank_of[b] == group_->rank()))
        throw std::logic_error("branch_join: `here` is not the assignment of the block last placed");
    return std::make_unique<GroupJoin>(group_, channels, rank_of);
  }

  std::unique_ptr<nn::Layer> conv(const ConvDef& d) const override {
    const int owner = owner_of(d.name);
    if (owner < 0) return model::CNNLayout::conv(d);
    const nn::ShardSpec own = nn::ShardSpec::owned(owner, group_->size());
    return std::make_unique<nn::Conv2d>(d.name, d.in, d.out, d.kernel,
                                        nn::Conv2dOptions{.stride = d.stride, .padding = d.padding, .bias = d.bias,
                                                          .seed = d.seed, .weight_shard = own, .bias_shard = own});
  }

  std::unique_ptr<nn::BatchNorm2d> batch_norm(const std::string& name, int64_t channels, Channels) const override {
    nn::BatchNormOptions o;
    const int owner = owner_of(name);
    if (owner >= 0) o.shard = nn::ShardSpec::owned(owner, group_->size());
    return std::make_unique<nn::BatchNorm2d>(name, channels, o);
  }

  // "Inception branches over 2 ranks by cost: inception1 0,1,1,0; inception2 0,1,1,0 | cost
  // share rank 0 48.1%, rank 1 51.9%" (the shares of the blocks' summed cost).
  int activation_block(int64_t) const override { return 0; }  // the join gathers NCHW channels

  std::string describe() const override {
    const int p = group_->size();
    std::string s = "Inception branches over " + std::to_string(p) + " ranks " +
                    (!balance_by_cost(balance_) ? "by --branch-balance " + balance_
                     : timed_                   ? std::string("by measured cost")
                                                : std::string("by FLOPs")) +
                    " (the rank of each branch):";
    std::vector<double> load(p, 0.0);
    double total = 0;
    for (size_t i = 0; i < placed_.size(); ++i) {
      s += i ? "; " : " ";
      s += placed_[i].name + " " + ranks_list(placed_[i].rank_of);
      if (timed_) {  // the measured milliseconds of each branch
        s += " (";
        for (size_t b = 0; b < placed_[i].costs.size(); ++b) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%s%.2f", b ? ", " : "", 1e3 * placed_[i].costs[b]);
          s += buf;
        }
        s += " ms)";
      }
      for (size_t b = 0; b < placed_[i].costs.size(); ++b) {
        load[placed_[i].rank_of[b]] += placed_[i].costs[b];
        total += placed_[i].costs[b];
      }
    }
    s += " | cost share";
    for (int q = 0; q < p; ++q) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%s rank %d %.1f%%", q ? "," : "", q, total > 0 ? 100.0 * load[q] / total : 0.0);
      s += buf;
    }
    return s;
  }

 private:
  // The rank owning a layer's parameters: this rank's inside a block's branches, none (-1:
  // replicated) elsewhere.
  int owner_of(const std::string&) const { return in_block_ ? group_->rank() : -1; }

  std::shared_ptr<comm::Communicator> group_;
  std::string balance_;
  std::map<std::string, std::vector<double>> measured_;  // seconds per branch, by block
  mutable bool timed_ = false;                            // some block was placed by measured cost
  mutable std::vector<Placement> placed_;  // every block placed so far, in build order
  mutable bool in_block_ = false;          // between a block's branches_here and its branch_join
};

// ---- the model's blocks, as its builders define them ----

struct BlockShape {
  std::string name;
  std::vector<double> costs;
  std::vector<int64_t> channels;  // of each branch's output
  int64_t in = 0, height = 0, width = 0;  // the block's input (C_in, H, W)
};

// Every block, through the single-rank layout: branches_here gives the name and costs, and
// branch_join the channels (the input: model::cnn_branch_inputs).
class BlockRecorder : public model::CNNLayout {
 public:
  std::vector<bool> branches_here(const std::string& name, const std::vector<double>& costs) const override {
    blocks.push_back({name, costs, {}, 0, 0, 0});
    return model::CNNLayout::branches_here(name, costs);
  }
  std::unique_ptr<model::BranchJoin> branch_join(const std::vector<int64_t>& channels,
                                                 const std::vector<bool>& here) const override {
    blocks.back().channels = channels;
    return model::CNNLayout::branch_join(channels, here);
  }
  mutable std::vector<BlockShape> blocks;
};

std::vector<BlockShape> blocks_of(const model::CNNConfig& cfg) {
  BlockRecorder rec;
  model::build_cnn_units(cfg, 0, rec);
  const std::map<std::string, Shape> inputs = model::cnn_branch_inputs(cfg);
  for (BlockShape& b : rec.blocks) {
    const Shape& in = inputs.at(b.name);
    b.in = in[0], b.height = in[1], b.width = in[2];
  }
  return rec.blocks;
}

}  // namespace

std::vector<int> parse_branch_balance(const std::string& balance, int ranks, int branches) {
  const std::string flag = "--branch-balance " + balance;
  const std::string example = [&] {
    std::vector<int> e(branches);
    for (int b = 0; b < branches; ++b) e[b] = b % ranks;
    return ranks_list(e);
  }();
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    const size_t comma = balance.find(',', start);
    const std::string tok = balance.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (tok.empty() || tok.size() > 6 || !std::all_of(tok.begin(), tok.end(), [](char c) { return c >= '0' && c <= '9'; }))
      throw std::invalid_argument(flag + ": '" + tok + "' is not a rank; give the rank of each of the " +
                                  std::to_string(branches) + " branches, e.g. " + example);
    out.push_back(std::stoi(tok));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(out.size()) != branches)
    throw std::invalid_argument(flag + " names " + std::to_string(out.size()) + " rank(s); an Inception block has " +
                                std::to_string(branches) + " branches, so give " + std::to_string(branches) +
                                " (e.g. " + example + ")");
  for (int b = 0; b < branches; ++b)
    if (out[b] >= ranks)
      throw std::invalid_argument(flag + " places branch " + std::to_string(b + 1) + " on rank " +
                                  std::to_string(out[b]) + ", but --branch-parallel " + std::to_string(ranks) +
                                  " has ranks 0 to " + std::to_string(ranks - 1));
  for (int q = 0; q < ranks; ++q)
    if (std::find(out.begin(), out.end(), q) == out.end())
      throw std::invalid_argument(flag + " leaves rank " + std::to_string(q) + " of --branch-parallel " +
                                  std::to_string(ranks) + " without a branch; every rank must compute at least one (e.g. " +
                                  example + ")");
  return out;
}

std::vector<int> assign_branches(const std::vector<double>& costs, int ranks, const std::string& balance) {
  const int n = static_cast<int>(costs.size());
  if (!balance_by_cost(balance)) return parse_branch_balance(balance, ranks, n);
  if (ranks > n)
    throw std::invalid_argument("--branch-parallel " + std::to_string(ranks) + " is more ranks than a block's " +
                                std::to_string(n) + " branches");
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return costs[a] > costs[b]; });
  std::vector<double> load(ranks, 0.0);
  std::vector<int> held(ranks, 0), rank_of(n, 0);
  for (int b : order) {
    // The least-loaded rank; an empty rank before any other, so each gets a branch.
    int best = 0;
    for (int q = 1; q < ranks; ++q) {
      const bool empty_q = held[q] == 0, empty_best = held[best] == 0;
      if (empty_q != empty_best ? empty_q : load[q] < load[best]) best = q;
    }
    rank_of[b] = best, load[best] += costs[b], ++held[best];
  }
  return rank_of;
}

void validate_cnn_branch(const model::CNNConfig& cfg, int ranks, const std::string& balance) {
  if (ranks < 2) return;
  const std::vector<BlockShape> blocks = blocks_of(cfg);
  if (blocks.empty())
    throw std::invalid_argument("--branch-parallel " + std::to_string(ranks) +
                                " places Inception branches on ranks: a split asked of a model with no Inception "
                                "blocks (" + cfg.name + "); use inception-small, or split " + cfg.name +
                                " with --tp, --dp or --pp");
  const int branches = static_cast<int>(blocks.front().costs.size());
  if (ranks > branches)
    throw std::invalid_argument("--branch-parallel " + std::to_string(ranks) + " asks for more ranks than an Inception "
                                "block's " + std::to_string(branches) + " branches; use --branch-parallel 2 to " +
                                std::to_string(branches) + " (and --dp for more ranks)");
  if (!balance_by_cost(balance)) parse_branch_balance(balance, ranks, branches);
}

std::shared_ptr<const model::CNNLayout> cnn_branch_layout(std::shared_ptr<comm::Communicator> group,
                                                          const std::string& balance,
                                                          std::map<std::string, std::vector<double>> measured) {
  return std::make_shared<BranchLayout>(std::move(group), balance, std::move(measured));
}

uint64_t cnn_branch_bytes_per_microbatch(const model::CNNConfig& cfg, int ranks, const std::string& balance,
                                         int64_t rows, int rank) {
  if (ranks < 2) return 0;
  const int p = ranks, next = (rank + 1) % p;
  uint64_t floats = 0;
  for (const BlockShape& b : blocks_of(cfg)) {
    const std::vector<int> rank_of = assign_branches(b.costs, p, balance);
    const uint64_t hw = static_cast<uint64_t>(rows * b.height * b.width);
    std::vector<uint64_t> count(p, 0);  // the all-gather's count of each rank
    for (size_t k = 0; k < rank_of.size(); ++k) count[rank_of[k]] += static_cast<uint64_t>(b.channels[k]) * hw;
    const uint64_t total = std::accumulate(count.begin(), count.end(), uint64_t{0});
    floats += total - count[next];  // forward: the ring all-gather forwards every block but rank+1's
    // backward: the ring all-reduce of dx, a reduce-scatter then an all-gather of near-equal parts
    const uint64_t m = static_cast<uint64_t>(b.in) * hw, up = static_cast<uint64_t>(p);
    auto part = [&](int q) { return m / up + (static_cast<uint64_t>(q) < m % up ? 1 : 0); };
    floats += (m - part(rank)) + (m - part(next));
  }
  return floats * sizeof(float);
}

}  // namespace meshtrain::parallel
