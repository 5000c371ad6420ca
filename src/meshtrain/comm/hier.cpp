// Hierarchical all-reduce (BlueConnect's decomposition) and the hosts of a group.
//
// A group of H hosts with K ranks each (rank of index k on host h):
//   1. reduce-scatter inside the host: block k of the vector (even_layout(n, K)) ends on index k;
//   2. all-reduce of block k across hosts, among the H ranks of index k (one per host);
//   3. all-gather inside the host.
// Each phase is the ring algorithm (ring.cpp) run over a sub-group of the caller's group: a
// MemberTransport, which renames the members of the parent's transport and sends through it, so
// no communicator is split (nothing collective to set up, on threads and mpi alike) and errors
// name the ranks of the caller's group.
//
// Bytes per rank (n bytes, p = H K): phases 1 and 3 move 2 (K-1)/K n inside the host; only phase
// 2 crosses hosts, 2 (H-1)/H n/K per rank (a flat ring over H K ranks sends 2 (p-1)/p n per
// rank, all of it across hosts on the H ranks whose next rank is on another host). Summation
// order: each host sums its K ranks, then the H host sums are added, so float results differ
// from the flat ring's by round-off (exact for integers and when K = 1 or H = 1).
//
// Limits: every host holds as many ranks of the group (hier refuses otherwise); all_reduce only.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "meshtrain/comm/algorithms.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/reduce.h"

namespace meshtrain::comm {

// ---- the algorithm ----
void hier_all_reduce(OpContext& in_host, OpContext& across, void* buf, std::size_t count, DType t, ReduceOp op,
                     int group_size) {
  if (count == 0) return;
  const ReduceOp sum = op == ReduceOp::avg ? ReduceOp::sum : op;  // avg: divide once, at the end
  const std::size_t es = dtype_size(t);
  const Layout l = even_layout(count, in_host.size());
  const int k = in_host.rank();
  char* shard = static_cast<char*>(buf) + l.offset[k] * es;
  ring_reduce_scatter(in_host, buf, l, t, sum);
  ring_all_reduce(across, shard, l.count(k), t, sum);
  finish_avg(shard, l.count(k), t, op, group_size);
  ring_all_gather(in_host, buf, l, es);
}

// ---- sub-groups over the parent's transport ----
namespace {

// The members (ranks of the parent) as a group of their own: member i is rank i here. Messages
// go through the parent's transport with the parent's ranks; requests keep the parent's ranks, so
// waits and their errors name ranks of the caller's group.
class MemberTransport final : public Transport {
 public:
  MemberTransport(Transport& parent, std::vector<int> members)
      : p_(parent), members_(std::move(members)),
        rank_(static_cast<int>(std::find(members_.begin(), members_.end(), parent.rank()) - members_.begin())) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const char* backend() const override { return p_.backend(); }
  RequestPtr isend(int peer, int tag, const void* buf, std::size_t bytes) override {
    return p_.isend(members_[peer], tag, buf, bytes);
  }
  RequestPtr irecv(int peer, int tag, void* buf, std::size_t bytes, bool collective_mode) override {
    return p_.irecv(members_[peer], tag, buf, bytes, collective_mode);
  }
  RequestPtr irecv_reduce(int peer, int tag, void* inout, std::size_t count, DType t, ReduceOp op) override {
    return p_.irecv_reduce(members_[peer], tag, inout, count, t, op);
  }
  std::unique_ptr<Transport> split(const std::vector<int>&, int, std::uint64_t) override {
    throw std::logic_error("a hierarchical all-reduce's sub-group cannot be split");
  }
  // Diagnostics speak of the parent's ranks (the requests carry them).
  std::vector<int> not_arrived(std::uint64_t seq) const override { return p_.not_arrived(seq); }
  std::vector<int> late_ranks(int peer) const override { return p_.late_ranks(peer); }
  void waiting(const char* op, const std::string& group, std::uint64_t seq, int peer) override {
    p_.waiting(op, group, seq, peer);
  }
  void abort(const std::string& reason) override { p_.abort(reason); }
  void note_silent(const std::vector<int>& ranks) override { p_.note_silent(ranks); }

 private:
  Transport& p_;
  std::vector<int> members_;
  int rank_;
};

}  // namespace

struct Communicator::HostGroups {
  MemberTransport in_host, across;
  std::vector<int> in_host_hosts, across_hosts;  // host of each member (for the cross-host count)
};

// ---- hosts of a group ----
void Communicator::set_hosts(std::vector<int> host_of_rank, std::optional<CostParams> across) {
  if (!host_of_rank.empty() && static_cast<int>(host_of_rank.size()) != size_)
    throw std::invalid_argument("set_hosts: " + std::to_string(host_of_rank.size()) + " hosts given for a group of " +
                                std::to_string(size_) + " ranks");
  hosts_ = std::move(host_of_rank);
  across_ = across;
  host_groups_.reset();
}

int Communicator::num_hosts() const {
  std::vector<int> h = hosts_;
  std::sort(h.begin(), h.end());
  return std::max<int>(1, static_cast<int>(std::unique(h.begin(), h.end()) - h.begin()));
}

int Communicator::ranks_per_host() const {
  if (hosts_.empty()) return size_;
  std::map<int, int> count;
  for (int h : hosts_) ++count[h];
  const int k = count.begin()->second;
  for (auto& [h, n] : count)
    if (n != k) return 0;
  return k;
}

HostLayout Communicator::host_layout() const {
  const CostParams own = cost_params(t_->backend(), size_);
  const int k = ranks_per_host();
  return {k > 0 ? size_ / k : 1, k > 0 ? k : size_, own, across_.value_or(own)};
}

// ---- running it ----
// The sub-groups are made on first use from hosts_ alone: the same on every rank, so nothing is
// exchanged. Host index h is the order of the host's first rank; index k a rank's place on it.
void Communicator::run_hier(const Call& c, OpContext& ctx) {
  const int K = ranks_per_host(), H = K > 0 ? size_ / K : 0;
  if (H < 2) {
    ctx.fail(ErrorKind::usage, {},
             "algorithm 'hier' needs the group's ranks on two or more hosts with as many ranks on each (this group: " +
                 std::to_string(num_hosts()) + " host(s), " + (K > 0 ? "even" : "uneven") +
                 "); set its hosts (--ranks-per-host) or use ring, rhd or tree");
  }
  if (!host_groups_) {
    std::vector<int> order;  // host ids in the order of their first rank
    for (int h : hosts_)
      if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
    std::vector<std::vector<int>> on_host(order.size());
    for (int r = 0; r < size_; ++r)
      on_host[std::find(order.begin(), order.end(), hosts_[r]) - order.begin()].push_back(r);
    const int mine = static_cast<int>(std::find(order.begin(), order.end(), hosts_[rank_]) - order.begin());
    const int k = static_cast<int>(std::find(on_host[mine].begin(), on_host[mine].end(), rank_) - on_host[mine].begin());
    std::vector<int> peers, peer_hosts;
    for (int h = 0; h < H; ++h) peers.push_back(on_host[h][k]), peer_hosts.push_back(h);
    host_groups_ = std::make_shared<HostGroups>(HostGroups{MemberTransport(*t_, on_host[mine]),
                                                           MemberTransport(*t_, peers),
                                                           std::vector<int>(K, mine), peer_hosts});
  }
  HostGroups& g = *host_groups_;
  OpContext in_host(g.in_host, to_string(c.kind), name_, ctx.seq(), ctx.deadline(), ctx.chunk_bytes(), *stats_,
                    &g.in_host_hosts);
  OpContext across(g.across, to_string(c.kind), name_, ctx.seq(), ctx.deadline(), ctx.chunk_bytes(), *stats_,
                   &g.across_hosts);
  hier_all_reduce(in_host, across, c.out, c.count, c.type, c.op, size_);
}

}  // namespace meshtrain::comm
