// Communicator: the group of ranks a rank talks to. Point-to-point messages with tags,
// collectives (all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, barrier),
// each with an async form returning a Work, sub-groups by split(color, key), statistics.
// One class for every backend: the backend only supplies point-to-point (transport.h); the
// collective algorithms are shared (algorithms.h) and chosen by `auto` or forced per call.
//
// Buffers are contiguous ranges (std::vector, std::span, std::array) of float, double or int64.
// Sizes (in elements, p = size()):
//   all_reduce      inout n, or in n -> out n
//   reduce_scatter  in p*n -> out n;            uneven: in sum(counts) -> out counts[rank]
//   all_gather      in n -> out p*n (rank-major); uneven: in counts[rank] -> out sum(counts)
//   broadcast       buf n (root's is sent)
//   reduce          in n -> out n on root (out may be empty elsewhere)
//   all_to_all      in p*n -> out p*n; block j of in goes to rank j, block i of out came from i
//
// Concurrency contract:
// - Every rank of a group issues the same collectives in the same order (debug mode checks it).
// - Collectives of one communicator run one at a time in issue order, synchronous and async
//   alike; async ones run on the communicator's progress thread, so they advance while the
//   caller computes. Point-to-point operations are not ordered with collectives (they are
//   posted at once and match by (source, tag) in posting order).
// - Buffers of an async operation must stay alive and untouched until its Work completes.
// - A communicator may be called from several threads; its operations are still serialised.
// - Deadlines: every operation fails with a CommError (operation, group, sequence number, ranks
//   not heard from) when it cannot finish within its timeout, which counts from the moment the
//   operation starts running. On the threads backend a failed operation aborts the whole job's
//   fabric so every rank fails promptly; on mpi the process should exit (mpi_world's exit hook
//   then calls MPI_Abort so the job ends).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "meshtrain/comm/error.h"
#include "meshtrain/comm/op_context.h"
#include "meshtrain/comm/select.h"
#include "meshtrain/comm/transport.h"
#include "meshtrain/comm/types.h"
#include "meshtrain/comm/work.h"

namespace meshtrain::comm {

// ---- buffer concepts ----
template <class R>
concept InBuf = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                Element<std::remove_cv_t<std::ranges::range_value_t<R>>>;
template <class R>
concept OutBuf = InBuf<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

struct ConstView {
  const void* data;
  std::size_t count;
  DType type;
};
struct MutView {
  void* data;
  std::size_t count;
  DType type;
};
template <InBuf R>
ConstView cview(const R& r) {
  using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
  return {std::ranges::data(r), std::ranges::size(r), dtype_of<T>()};
}
template <OutBuf R>
MutView mview(R&& r) {
  using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
  return {std::ranges::data(r), std::ranges::size(r), dtype_of<T>()};
}

inline constexpr int kNoColor = -1;  // split(kNoColor, ...) takes part but joins no group

// ---- Communicator ----
struct CommConfig {
  Timeout timeout{0};  // 0: the global default (set_default_timeout / MESHTRAIN_COMM_TIMEOUT_S)
  int debug = -1;      // 1: check every collective's signature; -1: MESHTRAIN_COMM_DEBUG
};

class Communicator {
 public:
  using Config = CommConfig;
  Communicator(std::shared_ptr<Transport> t, std::string name, Config cfg = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const char* backend() const { return t_->backend(); }

  // ---- settings ----
  static void set_default_timeout(Timeout t);  // for communicators created afterwards
  static Timeout default_timeout();
  void set_timeout(Timeout t) { timeout_ = t; }
  Timeout timeout() const { return timeout_; }
  void set_debug(bool on) { debug_ = on; }
  bool debug() const { return debug_; }

  // ---- point-to-point ----
  template <InBuf R> void send(const R& data, int dst, P2POptions o = {}) { isend_v(cview(data), dst, o, true).wait(); }
  template <OutBuf R> void recv(R&& data, int src, P2POptions o = {}) { irecv_v(mview(data), src, o, true).wait(); }
  template <InBuf R> Work isend(const R& data, int dst, P2POptions o = {}) { return isend_v(cview(data), dst, o, false); }
  template <OutBuf R> Work irecv(R&& data, int src, P2POptions o = {}) { return irecv_v(mview(data), src, o, false); }

  // ---- all_reduce ----
  template <OutBuf R> void all_reduce(R&& inout, AllReduceOptions o = {}) {
    auto v = mview(inout);
    all_reduce_v({v.data, v.count, v.type}, v, o, false).wait();
  }
  template <InBuf I, OutBuf O> void all_reduce(const I& in, O&& out, AllReduceOptions o = {}) {
    all_reduce_v(cview(in), mview(out), o, false).wait();
  }
  template <OutBuf R> Work all_reduce_async(R&& inout, AllReduceOptions o = {}) {
    auto v = mview(inout);
    return all_reduce_v({v.data, v.count, v.type}, v, o, true);
  }
  template <InBuf I, OutBuf O> Work all_reduce_async(const I& in, O&& out, AllReduceOptions o = {}) {
    return all_reduce_v(cview(in), mview(out), o, true);
  }

  // ---- reduce_scatter ----
  template <InBuf I, OutBuf O> void reduce_scatter(const I& in, O&& out, ReduceScatterOptions o = {}) {
    reduce_scatter_v(cview(in), mview(out), nullptr, o, false).wait();
  }
  template <InBuf I, OutBuf O>
  void reduce_scatter(const I& in, O&& out, const std::vector<std::size_t>& counts, ReduceScatterOptions o = {}) {
    reduce_scatter_v(cview(in), mview(out), &counts, o, false).wait();
  }
  template <InBuf I, OutBuf O> Work reduce_scatter_async(const I& in, O&& out, ReduceScatterOptions o = {}) {
    return reduce_scatter_v(cview(in), mview(out), nullptr, o, true);
  }
  template <InBuf I, OutBuf O>
  Work reduce_scatter_async(const I& in, O&& out, const std::vector<std::size_t>& counts, ReduceScatterOptions o = {}) {
    return reduce_scatter_v(cview(in), mview(out), &counts, o, true);
  }

  // ---- all_gather ----
  template <InBuf I, OutBuf O> void all_gather(const I& in, O&& out, AllGatherOptions o = {}) {
    all_gather_v(cview(in), mview(out), nullptr, o, false).wait();
  }
  template <InBuf I, OutBuf O>
  void all_gather(const I& in, O&& out, const std::vector<std::size_t>& counts, AllGatherOptions o = {}) {
    all_gather_v(cview(in), mview(out), &counts, o, false).wait();
  }
  template <InBuf I, OutBuf O> Work all_gather_async(const I& in, O&& out, AllGatherOptions o = {}) {
    return all_gather_v(cview(in), mview(out), nullptr, o, true);
  }
  template <InBuf I, OutBuf O>
  Work all_gather_async(const I& in, O&& out, const std::vector<std::size_t>& counts, AllGatherOptions o = {}) {
    return all_gather_v(cview(in), mview(out), &counts, o, true);
  }

  // ---- broadcast, reduce, all_to_all, barrier ----
  template <OutBuf R> void broadcast(R&& buf, BroadcastOptions o = {}) { broadcast_v(mview(buf), o, false).wait(); }
  template <OutBuf R> Work broadcast_async(R&& buf, BroadcastOptions o = {}) { return broadcast_v(mview(buf), o, true); }
  template <InBuf I, OutBuf O> void reduce(const I& in, O&& out, ReduceOptions o = {}) {
    reduce_v(cview(in), mview(out), o, false).wait();
  }
  template <InBuf I, OutBuf O> Work reduce_async(const I& in, O&& out, ReduceOptions o = {}) {
    return reduce_v(cview(in), mview(out), o, true);
  }
  template <InBuf I, OutBuf O> void all_to_all(const I& in, O&& out, AllToAllOptions o = {}) {
    all_to_all_v(cview(in), mview(out), o, false).wait();
  }
  template <InBuf I, OutBuf O> Work all_to_all_async(const I& in, O&& out, AllToAllOptions o = {}) {
    return all_to_all_v(cview(in), mview(out), o, true);
  }
  void barrier(BarrierOptions o = {}) { barrier_v(o, false).wait(); }
  Work barrier_async(BarrierOptions o = {}) { return barrier_v(o, true); }

  // ---- sub-groups ----
  // Collective over this communicator. Ranks with equal color form a group, ordered by (key,
  // rank); kNoColor returns nullptr. `name` defaults to "<parent>/<color>".
  std::shared_ptr<Communicator> split(int color, int key, std::string name = "");

  // ---- hosts ----
  // Which host each rank of this group is on: host_of_rank[r] for rank r (any ids; the same
  // vector on every rank; collective-free). Empty: one host (the default). `across` is the cost
  // of a message between two hosts, which `auto` weighs against the backend's own link to choose
  // Algorithm::hier; by default it is the backend's, so auto keeps the flat algorithms unless
  // told the links between hosts are slower. split() passes both to the sub-groups. Set it
  // before issuing operations. Throws std::invalid_argument for a vector of the wrong size.
  void set_hosts(std::vector<int> host_of_rank, std::optional<CostParams> across = std::nullopt);
  const std::vector<int>& hosts() const { return hosts_; }
  int num_hosts() const;       // distinct hosts (1 when none were set)
  int ranks_per_host() const;  // ranks on each host when every host holds as many; 0 otherwise
  // The most bytes Algorithm::shm can all-reduce in this group: unbounded (SIZE_MAX) on threads,
  // the shared segment under mpi on one host, 0 where the group shares no memory.
  std::size_t shared_memory_limit() const;
  std::optional<CostParams> host_link() const { return across_; }
  // The group as hier sees it: hosts, ranks per host, and the links (in_host: the backend's).
  HostLayout host_layout() const;

  // ---- observation ----
  // Called after every collective this communicator runs (on the thread that ran it: the
  // caller's or the progress thread), with its start and end. For timelines (trace/); set it
  // before issuing operations, it must be cheap and thread-safe.
  using OpObserver = std::function<void(const char* op, std::uint64_t seq, Clock::time_point start,
                                        Clock::time_point end)>;
  void set_op_observer(OpObserver f) { observer_ = std::move(f); }
  // Reports to the observer a span of communication over this group that the caller composed of
  // point-to-point operations (e.g. a halo exchange: "halo", from its first post to its last
  // wait), so timelines show it beside the collectives.
  void observe(const char* op, Clock::time_point start, Clock::time_point end) {
    if (observer_) observer_(op, observed_++, start, end);
  }

  // ---- statistics ----
  CommStats stats() const;
  void reset_stats();

  // ---- untyped entry points (the templates above forward here) ----
  Work isend_v(ConstView in, int dst, const P2POptions& o, bool blocking);
  Work irecv_v(MutView out, int src, const P2POptions& o, bool blocking);
  Work all_reduce_v(ConstView in, MutView out, const AllReduceOptions& o, bool async);
  Work reduce_scatter_v(ConstView in, MutView out, const std::vector<std::size_t>* counts,
                        const ReduceScatterOptions& o, bool async);
  Work all_gather_v(ConstView in, MutView out, const std::vector<std::size_t>* counts,
                    const AllGatherOptions& o, bool async);
  Work broadcast_v(MutView buf, const BroadcastOptions& o, bool async);
  Work reduce_v(ConstView in, MutView out, const ReduceOptions& o, bool async);
  Work all_to_all_v(ConstView in, MutView out, const AllToAllOptions& o, bool async);
  Work barrier_v(const BarrierOptions& o, bool async);

  // One collective call as the executor sees it (public for debug.cpp and tests).
  struct Call {
    OpKind kind;
    DType type = DType::f32;
    ReduceOp op = ReduceOp::sum;
    int root = 0;
    const void* in = nullptr;
    void* out = nullptr;
    std::size_t count = 0;            // elements: see the table above (all_to_all: per block)
    std::vector<std::size_t> counts;  // per rank (reduce_scatter, all_gather)
    Algorithm algorithm = Algorithm::automatic;
    std::size_t chunk_bytes = 0;
    Timeout timeout{0};
  };

 private:
  using Body = std::function<void(std::uint64_t seq)>;
  Work issue(const char* op, Timeout timeout, Body body, bool async);
  Work issue_call(const char* op, const Call& c, bool async);  // issue(run_call(c)), allocation-free when inline
  template <class F>
  void run_inline(const char* op, std::uint64_t seq, std::unique_lock<std::mutex>& lk, F&& body);
  void run_call(const Call& c, std::uint64_t seq);
  void execute(const Call& c, Algorithm a, OpContext& ctx);
  void progress_loop();
  Clock::time_point deadline_for(Timeout t) const;
  [[noreturn]] void usage(const char* op, const std::string& detail);
  std::byte* scratch(std::size_t bytes);

  std::shared_ptr<Transport> t_;
  std::string name_;
  int rank_, size_;
  Timeout timeout_;
  bool debug_;
  OpObserver observer_;
  std::uint64_t observed_ = 0;  // spans reported through observe()
  std::shared_ptr<StatsCounters> stats_;

  // ---- hosts (hier.cpp) ----
  std::vector<int> hosts_;           // host of each rank (empty: one host)
  std::optional<CostParams> across_;  // link between hosts (empty: the backend's)
  struct HostGroups;                  // this rank's host and its shard peers, made on first use
  std::shared_ptr<HostGroups> host_groups_;
  void run_hier(const Call& c, OpContext& ctx);

  // ---- executor: one operation at a time, in issue order ----
  struct Job;
  std::mutex qm_;
  std::condition_variable qcv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool busy_ = false, stop_ = false;
  std::uint64_t coll_seq_ = 0, p2p_seq_ = 0;
  std::thread progress_;
  std::vector<std::byte> scratch_;
};

// Debug mode (debug.cpp): every rank sends the signature of the collective it is about to run
// to rank 0, which reports the first rank that differs. Throws CommError(mismatch).
void check_same_collective(OpContext& ctx, const Communicator::Call& c, std::uint64_t seq);

}  // namespace meshtrain::comm
