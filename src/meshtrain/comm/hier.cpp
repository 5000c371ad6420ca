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
// Sliced and over shared memory (hier_sliced below). Where the K ranks of a host share memory
// (threads; mpi processes on one host: the segments of mpi_backend.cpp) and the message spans
// more than one slice (MESHTRAIN_COMM_HIER_SLICE_BYTES, default 2 MiB, so the data-parallel
// buckets of 4 MiB are sliced too; 0 turns slicing off), block k is cut into pieces of
// slice / K bytes (whole 64-byte units, H of them) and the phases run as a pipeline: step t is
// one shared-memory exchange among the host's ranks that reduce-scatters piece t of every
// block (rank k sums piece t of block k from the K buffers) and all-gathers piece t-2 (rank k
// copies piece t-2 of block j from rank j), while a worker thread of this rank runs the ring
// across hosts on piece t-1 of block k. So the link between hosts carries piece after piece
// while the in-host work of the neighbouring pieces runs beside it, and nothing of the in-host
// phases goes through messages. Each step is one publish and one finish (two synchronisations
// of the host's ranks). Memory: the worker, its hand-over and the shared segments are made on
// the first hier call; a call allocates what the unsliced one does (its layout; the ring's
// requests, one a message as before, since the ring cuts messages at chunk_bytes either way),
// plus a ring call's two request lists and layout per piece on the worker. Bits: piece t of block k is summed in the in-host
// ring's order (x_{k+1}, then + x_{k+2}, ..., + x_k, as ring_reduce_scatter accumulates block
// k), and each piece goes through the same ring across hosts; so at H = 2 the result is bit for
// bit the unsliced hier's. At H > 2 the ring across hosts assigns each element to a sub-block
// of its piece instead of the shard, which changes the order in which the H host sums are
// added: deterministic (the same for the same slice), equal to the unsliced result within
// round-off. Bytes across hosts: each piece's ring sends 2 (H-1)/H of the piece, so the total
// is the unsliced formula (per rank exactly where n divides by H K, as unsliced).
//
// Limits: every host holds as many ranks of the group (hier refuses otherwise); all_reduce only.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

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

std::size_t slice_bytes_setting() {
  const char* s = std::getenv("MESHTRAIN_COMM_HIER_SLICE_BYTES");
  return s && *s ? static_cast<std::size_t>(std::strtoull(s, nullptr, 10)) : std::size_t{2} << 20;
}
bool times_setting() {
  const char* s = std::getenv("MESHTRAIN_COMM_HIER_TIMES");
  return s && *s && std::strcmp(s, "0") != 0;
}
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

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

// ---- the worker that runs the ring across hosts, piece after piece ----
// One per communicator that slices, made on first use, joined when the communicator goes. The
// caller hands it pieces in order (hand(n): pieces [0, n) are reduced inside the host) and
// waits for them (wait_done(n): pieces [0, n) are reduced across hosts too). An error of the
// worker ends its job and is rethrown by the caller's next wait; a caller that fails cancels
// the job and waits until the worker no longer touches the buffer.
namespace {
struct AcrossJob {
  Transport* across = nullptr;
  const std::vector<int>* hosts = nullptr;
  const char* op = nullptr;
  const std::string* group = nullptr;
  std::uint64_t seq = 0;
  Clock::time_point deadline;
  std::size_t chunk_bytes = 0;
  StatsCounters* stats = nullptr;
  char* block = nullptr;  // block k of the caller's buffer
  std::size_t count = 0, piece = 0;  // elements of the block, of a piece
  DType type = DType::f32;
  ReduceOp op_in = ReduceOp::sum;
  int group_size = 1;
};

class AcrossWorker {
 public:
  AcrossWorker() : thread_([this] { loop(); }) {}
  ~AcrossWorker() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void start(const AcrossJob& j) {
    std::lock_guard lk(m_);
    job_ = j;
    handed_ = done_ = 0;
    err_ = nullptr;
    cancel_ = false;
    busy_ms_ = idle_ms_ = 0;
  }
  void hand(std::size_t n) {
    {
      std::lock_guard lk(m_);
      handed_ = n;
    }
    cv_.notify_all();
  }
  void wait_done(std::size_t n) {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return done_ >= n || err_; });
    if (err_) {
      std::exception_ptr e = err_;
      err_ = nullptr;
      cancel_ = true;
      cv_.wait(lk, [&] { return !running_; });
      std::rethrow_exception(e);
    }
  }
  void cancel() {
    std::unique_lock lk(m_);
    cancel_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return !running_; });
  }
  double busy_ms() const { return busy_ms_; }
  double idle_ms() const { return idle_ms_; }

 private:
  void loop() {
    std::unique_lock lk(m_);
    for (;;) {
      const auto t0 = Clock::now();
      cv_.wait(lk, [&] { return stop_ || (!cancel_ && !err_ && done_ < handed_); });
      if (stop_) return;
      if (done_ > 0) idle_ms_ += ms_since(t0);  // waiting for the next piece of this job
      running_ = true;
      const std::size_t j = done_;
      const AcrossJob job = job_;
      lk.unlock();
      std::exception_ptr e;
      const auto t1 = Clock::now();
      try {
        OpContext c(*job.across, job.op, *job.group, job.seq, job.deadline, job.chunk_bytes, *job.stats, job.hosts);
        const std::size_t es = dtype_size(job.type), first = j * job.piece;
        const std::size_t len = first < job.count ? std::min(job.piece, job.count - first) : 0;
        char* at = job.block + first * es;
        const ReduceOp sum = job.op_in == ReduceOp::avg ? ReduceOp::sum : job.op_in;
        ring_all_reduce(c, at, len, job.type, sum);
        finish_avg(at, len, job.type, job.op_in, job.group_size);
      } catch (...) {
        e = std::current_exception();
      }
      lk.lock();
      busy_ms_ += ms_since(t1);
      running_ = false;
      if (e) err_ = e;
      else ++done_;
      cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  AcrossJob job_;
  std::size_t handed_ = 0, done_ = 0;
  std::exception_ptr err_;
  bool stop_ = false, cancel_ = false, running_ = false;
  double busy_ms_ = 0, idle_ms_ = 0;
  std::thread thread_;  // last: starts after the members it reads
};
}  // namespace

struct Communicator::HostGroups {
  MemberTransport in_host, across;
  std::vector<int> in_host_hosts, across_hosts;  // host of each member (for the cross-host count)
  // The host's ranks as a group of their own with shared memory (nullptr where they share none),
  // the number of its shared-memory exchanges so far, and the worker; for hier_sliced.
  std::unique_ptr<Transport> shared;
  std::uint64_t exchanges = 0;
  std::unique_ptr<AcrossWorker> worker;
};

namespace {
// The sliced, shared-memory hier (the header comment). `names` gives the operation's names,
// sequence number and deadline; `in_host` runs over the host's shared group.
void hier_sliced(OpContext& names, OpContext& in_host, SharedMemory& m, std::uint64_t& exchanges, AcrossWorker& w,
                 AcrossJob job, void* buf, std::size_t count, DType t, ReduceOp op, std::size_t piece) {
  const int K = in_host.size(), k = in_host.rank();
  const std::size_t es = dtype_size(t);
  const ReduceOp sum = op == ReduceOp::avg ? ReduceOp::sum : op;
  const Layout l = even_layout(count, K);
  char* const base = static_cast<char*>(buf);
  const std::size_t steps = (l.count(0) + piece - 1) / piece;  // pieces of the largest block
  auto len = [&](int b, std::size_t j) {
    const std::size_t first = j * piece;
    return first < l.count(b) ? std::min(piece, l.count(b) - first) : std::size_t{0};
  };
  auto at = [&](int b, std::size_t j) { return base + (l.offset[b] + j * piece) * es; };
  char* const stage = static_cast<char*>(m.stage());  // mpi: [piece t of blocks 0..K-1 | my piece t-2]
  job.block = at(k, 0);
  job.count = l.count(k);
  job.piece = piece;
  w.start(job);
  const bool timed = times_setting();
  double wait_ms = 0, sync_ms = 0, work_ms = 0;
  const auto t_start = Clock::now();
  try {
    for (std::size_t s = 0; s < steps + 2; ++s) {
      const bool rs = s < steps, ag = s >= 2;
      auto t0 = Clock::now();
      if (ag) w.wait_done(s - 1);  // piece s-2 reduced across hosts
      wait_ms += ms_since(t0);
      t0 = Clock::now();
      if (stage) {
        if (rs)
          for (int b = 0; b < K; ++b) std::memcpy(stage + b * piece * es, at(b, s), len(b, s) * es);
        if (ag) std::memcpy(stage + K * piece * es, at(k, s - 2), len(k, s - 2) * es);
      }
      work_ms += ms_since(t0);
      const std::uint64_t x = exchanges++;
      t0 = Clock::now();
      in_host.shm_publish(m, stage ? stage : buf, x);
      sync_ms += ms_since(t0);
      t0 = Clock::now();
      // Rank j's piece s of block b (raw), and its piece s-2 of its own block (reduced).
      auto raw = [&](int j, int b) {
        return stage ? static_cast<const char*>(m.buffer(j)) + b * piece * es
                     : static_cast<const char*>(m.buffer(j)) + (at(b, s) - base);
      };
      auto reduced = [&](int j) {
        return stage ? static_cast<const char*>(m.buffer(j)) + K * piece * es
                     : static_cast<const char*>(m.buffer(j)) + (at(j, s - 2) - base);
      };
      std::size_t sent = 0, received = 0;
      if (rs) {
        // Block k's piece in ring_reduce_scatter's order: x_{k+1}, + x_{k+2}, ..., + x_k.
        alignas(64) char acc[2048];
        const std::size_t n = len(k, s), per = sizeof acc / es;
        char* dst = at(k, s);
        for (std::size_t i = 0; i < n; i += per) {
          const std::size_t c = std::min(per, n - i);
          std::memcpy(acc, raw((k + 1) % K, k) + i * es, c * es);
          for (int j = 2; j <= K; ++j) reduce_into(acc, raw((k + j) % K, k) + i * es, c, t, sum);
          std::memcpy(dst + i * es, acc, c * es);
        }
        received += (K - 1) * n * es;
        for (int b = 0; b < K; ++b)
          if (b != k) sent += len(b, s) * es;
      }
      if (ag) {
        for (int j = 0; j < K; ++j)
          if (j != k) std::memcpy(at(j, s - 2), reduced(j), len(j, s - 2) * es), received += len(j, s - 2) * es;
        sent += (K - 1) * len(k, s - 2) * es;
      }
      in_host.count_bytes(sent, received);
      work_ms += ms_since(t0);
      t0 = Clock::now();
      in_host.shm_finish(m, x);
      sync_ms += ms_since(t0);
      if (rs) w.hand(s + 1);
    }
  } catch (...) {
    w.cancel();
    throw;
  }
  if (timed)
    std::fprintf(stderr,
                 "hier %s #%llu rank %d/%d: %.1f ms, %zu pieces of %zu B a block; in host: work %.1f ms, "
                 "sync %.1f ms, waiting for the ring across hosts %.1f ms; across hosts: busy %.1f ms, idle %.1f ms\n",
                 names.transport().backend(), static_cast<unsigned long long>(names.seq()), k, K, ms_since(t_start),
                 steps, piece * es, work_ms, sync_ms, wait_ms, w.busy_ms(), w.idle_ms());
}
}  // namespace

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
                                                           std::vector<int>(K, mine), peer_hosts, nullptr, 0, nullptr});
    // The host's ranks with shared memory, for slicing: every rank of the group calls split
    // (MPI_Comm_split and the shared window are collective), all on their first hier call.
    // The segment of each (mpi) holds a step's pieces: K of the slice's and one reduced.
    if (K > 1) {
      const std::size_t slice = std::max<std::size_t>(slice_bytes_setting(), 64 * K);
      host_groups_->shared = t_->split_shared(on_host[mine], mine, ctx.seq(), (K + 1) * (slice / K + 64));
      if (host_groups_->shared && !host_groups_->shared->shared_memory()) host_groups_->shared.reset();
    }
  }
  HostGroups& g = *host_groups_;
  OpContext across(g.across, to_string(c.kind), name_, ctx.seq(), ctx.deadline(), ctx.chunk_bytes(), *stats_,
                   &g.across_hosts);
  // Sliced where the host's ranks share memory and the message spans two slices or more (and,
  // under mpi, a step's K + 1 pieces fit the stage).
  const std::size_t es = dtype_size(c.type), slice = slice_bytes_setting();
  SharedMemory* shared = g.shared ? g.shared->shared_memory() : nullptr;
  // Pieces of whole 64-byte units, H of them: the ring across hosts splits a piece evenly.
  const std::size_t unit = std::max<std::size_t>(1, 64 / es) * static_cast<std::size_t>(H);
  std::size_t piece = std::max<std::size_t>(1, slice / K / es / unit) * unit;
  if (shared && shared->limit() != SIZE_MAX)
    piece = std::min(piece, std::max<std::size_t>(1, shared->limit() / (K + 1) / es / unit) * unit);
  if (shared && slice > 0 && c.count * es > slice && (K + 1) * piece * es <= shared->limit()) {
    SharedMemory& m = *shared;
    OpContext in_host(*g.shared, to_string(c.kind), name_, ctx.seq(), ctx.deadline(), ctx.chunk_bytes(), *stats_,
                      &g.in_host_hosts);
    if (!g.worker) g.worker = std::make_unique<AcrossWorker>();
    AcrossJob job;
    job.across = &g.across;
    job.hosts = &g.across_hosts;
    job.op = to_string(c.kind);
    job.group = &name_;
    job.seq = ctx.seq();
    job.deadline = ctx.deadline();
    job.chunk_bytes = ctx.chunk_bytes();
    job.stats = stats_.get();
    job.type = c.type;
    job.op_in = c.op;
    job.group_size = size_;
    hier_sliced(ctx, in_host, m, g.exchanges, *g.worker, job, c.out, c.count, c.type, c.op, piece);
    return;
  }
  OpContext in_host(g.in_host, to_string(c.kind), name_, ctx.seq(), ctx.deadline(), ctx.chunk_bytes(), *stats_,
                    &g.in_host_hosts);
  hier_all_reduce(in_host, across, c.out, c.count, c.type, c.op, size_);
}

}  // namespace meshtrain::comm
