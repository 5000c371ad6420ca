// Communicator: argument checks, the executor (inline for synchronous calls when idle, a
// progress thread for async ones), dispatch to algorithms, split, statistics.
#include "meshtrain/comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "meshtrain/comm/algorithms.h"
#include "meshtrain/comm/reduce.h"
#include "meshtrain/comm/select.h"

namespace meshtrain::comm {

// ---- settings ----
namespace {
std::int64_t initial_timeout_ms() {
  // A value that is not a positive number of seconds up to a week is ignored (the CLI's
  // --comm-timeout checks and overrides it).
  if (const char* s = std::getenv("MESHTRAIN_COMM_TIMEOUT_S")) {
    const double v = std::atof(s);
    if (v > 0 && v <= 604'800) return std::max<std::int64_t>(1, static_cast<std::int64_t>(v * 1000));
  }
  return 300'000;
}
std::atomic<std::int64_t> g_default_timeout_ms{initial_timeout_ms()};

bool env_debug() {
  const char* s = std::getenv("MESHTRAIN_COMM_DEBUG");
  return s && *s && std::strcmp(s, "0") != 0;
}
}  // namespace

void Communicator::set_default_timeout(Timeout t) { g_default_timeout_ms = t.count() > 0 ? t.count() : 300'000; }
Timeout Communicator::default_timeout() { return Timeout{g_default_timeout_ms.load()}; }

Communicator::Communicator(std::shared_ptr<Transport> t, std::string name, Config cfg)
    : t_(std::move(t)), name_(std::move(name)), rank_(t_->rank()), size_(t_->size()),
      timeout_(cfg.timeout.count() > 0 ? cfg.timeout : default_timeout()),
      debug_(cfg.debug < 0 ? env_debug() : cfg.debug != 0), stats_(std::make_shared<StatsCounters>()) {}

Communicator::~Communicator() {
  {
    std::lock_guard lk(qm_);
    stop_ = true;
  }
  qcv_.notify_all();
  if (progress_.joinable()) progress_.join();
}

Clock::time_point Communicator::deadline_for(Timeout t) const {
  return Clock::now() + (t.count() > 0 ? t : timeout_);
}

void Communicator::usage(const char* op, const std::string& detail) {
  throw CommError(ErrorKind::usage, op, name_, coll_seq_, {}, detail);
}

std::byte* Communicator::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

std::size_t Communicator::shared_memory_limit() const {
  const SharedMemory* m = t_->shared_memory();
  return m ? m->limit() : 0;
}

// ---- statistics ----
CommStats Communicator::stats() const {
  CommStats s;
  s.bytes_sent = stats_->bytes_sent.load();
  s.bytes_received = stats_->bytes_received.load();
  s.bytes_sent_cross_host = stats_->bytes_sent_cross_host.load();
  s.ops = stats_->ops.load();
  s.wait_seconds = static_cast<double>(stats_->wait_ns.load()) * 1e-9;
  return s;
}
void Communicator::reset_stats() {
  stats_->bytes_sent = 0;
  stats_->bytes_received = 0;
  stats_->bytes_sent_cross_host = 0;
  stats_->ops = 0;
  stats_->wait_ns = 0;
}

// ---- collective Work ----
namespace {
void add_wait(StatsCounters& s, Clock::time_point t0) {
  s.wait_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                      std::memory_order_relaxed);
}

class QueuedWork final : public WorkImpl {
 public:
  QueuedWork(std::string op, std::string group, std::uint64_t seq, std::shared_ptr<StatsCounters> s)
      : op_(std::move(op)), group_(std::move(group)), seq_(seq), stats_(std::move(s)) {}
  void finish(std::exception_ptr e) {
    {
      std::lock_guard lk(m_);
      err_ = e;
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  bool test() override { return done_.load(std::memory_order_acquire); }
  std::exception_ptr error() override {
    std::lock_guard lk(m_);
    return err_;
  }
  void wait(Timeout t) override {
    const auto t0 = Clock::now();
    std::unique_lock lk(m_);
    if (t.count() > 0) {
      if (!cv_.wait_until(lk, t0 + t, [&] { return done_.load(); })) {
        add_wait(*stats_, t0);
        throw CommError(ErrorKind::timeout, op_, group_, seq_, {},
                        "Work::wait gave up after " + std::to_string(t.count()) + " ms; the operation is still running");
      }
    } else {
      cv_.wait(lk, [&] { return done_.load(); });
    }
    add_wait(*stats_, t0);
    if (err_) std::rethrow_exception(err_);
  }

 private:
  std::string op_, group_;
  std::uint64_t seq_;
  std::shared_ptr<StatsCounters> stats_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr err_;
};
}  // namespace

struct Communicator::Job {
  Body body;
  const char* op;
  std::uint64_t seq;
  std::shared_ptr<QueuedWork> work;
};

// ---- executor ----
// A synchronous call on an idle communicator runs on the caller's thread (no hand-off latency)
// and, for an operation described by a Call, without wrapping it in a std::function: nothing
// is allocated on that path.
Work Communicator::issue_call(const char* op, const Call& c, bool async) {
  if (!async) {
    std::unique_lock lk(qm_);
    if (!busy_ && queue_.empty()) {
      stats_->ops.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t seq = coll_seq_++;
      run_inline(op, seq, lk, [&](std::uint64_t s) { run_call(c, s); });
      return Work{};
    }
  }
  return issue(op, c.timeout, [this, c](std::uint64_t s) { run_call(c, s); }, async);
}

template <class F>
void Communicator::run_inline(const char* op, std::uint64_t seq, std::unique_lock<std::mutex>& lk, F&& body) {
  // The whole call counts as blocked.
  busy_ = true;
  lk.unlock();
  const auto t0 = Clock::now();
  std::exception_ptr err;
  try {
    body(seq);
  } catch (...) {
    err = std::current_exception();
  }
  add_wait(*stats_, t0);
  if (observer_) observer_(op, seq, t0, Clock::now());
  lk.lock();
  busy_ = false;
  if (!queue_.empty()) qcv_.notify_all();
  lk.unlock();
  if (err) std::rethrow_exception(err);
}

Work Communicator::issue(const char* op, Timeout timeout, Body body, bool async) {
  (void)timeout;
  stats_->ops.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lk(qm_);
  const std::uint64_t seq = coll_seq_++;
  if (!async && !busy_ && queue_.empty()) {
    run_inline(op, seq, lk, body);
    return Work{};
  }
  auto w = std::make_shared<QueuedWork>(op, name_, seq, stats_);
  queue_.push_back(std::make_shared<Job>(Job{std::move(body), op, seq, w}));
  if (!progress_.joinable()) {
    try {
      progress_ = std::thread([this] { progress_loop(); });
    } catch (const std::system_error& e) {
      queue_.pop_back();
      --coll_seq_;
      throw std::runtime_error("could not start the progress thread of communicator '" + name_ + "' (rank " +
                               std::to_string(rank_) + "): " + e.code().message());
    }
  }
  lk.unlock();
  qcv_.notify_all();
  Work work(w);
  if (!async) work.wait();
  return work;
}

void Communicator::progress_loop() {
  std::unique_lock lk(qm_);
  for (;;) {
    qcv_.wait(lk, [&] { return stop_ || (!busy_ && !queue_.empty()); });
    if (queue_.empty() && stop_) return;
    if (busy_ || queue_.empty()) continue;
    auto job = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    std::exception_ptr err;
    const auto t0 = Clock::now();
    try {
      job->body(job->seq);
    } catch (...) {
      err = std::current_exception();
    }
    if (observer_) observer_(job->op, job->seq, t0, Clock::now());
    job->work->finish(err);
    lk.lock();
    busy_ = false;
    qcv_.notify_all();
  }
}

// ---- dispatch ----
void Communicator::run_call(const Call& c, std::uint64_t seq) {
  const std::size_t es = dtype_size(c.type);
  std::size_t bytes = c.count * es;
  if (c.kind == OpKind::reduce_scatter || c.kind == OpKind::all_gather) {
    bytes = 0;
    for (auto n : c.counts) bytes += n * es;
  } else if (c.kind == OpKind::all_to_all) {
    bytes *= size_;
  }
  Algorithm a = c.algorithm;
  if (a == Algorithm::automatic) {
    a = c.kind == OpKind::all_reduce && num_hosts() > 1 ? choose_all_reduce(bytes, host_layout(), t_->backend())
                                                          : choose_algorithm(c.kind, bytes, size_, t_->backend());
    if (SharedMemory* m = t_->shared_memory()) a = prefer_shared_memory(c.kind, a, size_, bytes, m->limit());
  }
  std::size_t chunk = c.chunk_bytes ? c.chunk_bytes : default_chunk_bytes(t_->backend());
  const auto deadline = deadline_for(c.timeout);
  OpContext ctx(*t_, to_string(c.kind), name_, seq, deadline, chunk, *stats_, hosts_.empty() ? nullptr : &hosts_);
  t_->note_entered(seq);
  if (debug_) check_same_collective(ctx, c, seq);
  if (a == Algorithm::native) {
    NativeCall nc{c.kind, c.type, c.op, c.root, c.in, c.out, c.count, &c.counts};
    if (c.kind == OpKind::all_reduce && c.op == ReduceOp::avg) nc.op = ReduceOp::sum;
    if (c.kind == OpKind::reduce_scatter && c.op == ReduceOp::avg) nc.op = ReduceOp::sum;
    if (c.kind == OpKind::reduce && c.op == ReduceOp::avg) nc.op = ReduceOp::sum;
    Transport::NativeResult res;
    try {
      res = t_->native(nc, deadline);
    } catch (const PeerFailure& e) {
      ctx.fail(ErrorKind::peer_failed, e.ranks, e.what());
    }
    switch (res) {
      case Transport::NativeResult::done: break;
      case Transport::NativeResult::timeout:
        t_->abort("native collective timed out");
        ctx.fail(ErrorKind::timeout, t_->not_arrived(seq), "deadline passed inside the MPI library's collective");
      case Transport::NativeResult::unsupported:
        ctx.fail(ErrorKind::usage, {}, std::string("algorithm 'native' is not available on the ") + t_->backend() + " backend");
    }
    if (c.kind == OpKind::all_reduce) finish_avg(c.out, c.count, c.type, c.op, size_);
    if (c.kind == OpKind::reduce_scatter) finish_avg(c.out, c.counts[rank_], c.type, c.op, size_);
    if (c.kind == OpKind::reduce && rank_ == c.root) finish_avg(c.out, c.count, c.type, c.op, size_);
    return;
  }
  execute(c, a, ctx);
}

void Communicator::execute(const Call& c, Algorithm a, OpContext& ctx) {
  const std::size_t es = dtype_size(c.type);
  switch (c.kind) {
    case OpKind::all_reduce:
      if (c.in != c.out && c.count) std::memcpy(c.out, c.in, c.count * es);
      if (a == Algorithm::ring) ring_all_reduce(ctx, c.out, c.count, c.type, c.op);
      else if (a == Algorithm::rhd) rhd_all_reduce(ctx, c.out, c.count, c.type, c.op);
      else if (a == Algorithm::hier) run_hier(c, ctx);
      else if (a == Algorithm::shm) {
        SharedMemory* m = t_->shared_memory();
        if (!m)
          ctx.fail(ErrorKind::usage, {}, std::string("algorithm 'shm' needs the ranks on one machine (threads, or mpi "
                                                     "processes on one host); this ") + t_->backend() + " group has no shared memory");
        shm_all_reduce(ctx, *m, c.out, c.count, c.type, c.op);
      }
      else tree_all_reduce(ctx, c.out, c.count, c.type, c.op);
      if (size_ == 1) finish_avg(c.out, c.count, c.type, c.op, 1);
      break;
    case OpKind::reduce_scatter: {
      const Layout l = counts_layout(c.counts);
      std::byte* work = scratch(l.total() * es);
      if (l.total()) std::memcpy(work, c.in, l.total() * es);
      ring_reduce_scatter(ctx, work, l, c.type, c.op);
      if (l.count(rank_)) std::memcpy(c.out, work + l.offset[rank_] * es, l.count(rank_) * es);
      finish_avg(c.out, l.count(rank_), c.type, c.op, size_);
      break;
    }
    case OpKind::all_gather: {
      const Layout l = counts_layout(c.counts);
      char* out = static_cast<char*>(c.out);
      if (l.count(rank_) && out + l.offset[rank_] * es != c.in)
        std::memmove(out + l.offset[rank_] * es, c.in, l.count(rank_) * es);
      ring_all_gather(ctx, c.out, l, es);
      break;
    }
    case OpKind::broadcast:
      tree_broadcast(ctx, c.out, c.count * es, c.root);
      break;
    case OpKind::reduce: {
      void* acc = rank_ == c.root ? c.out : static_cast<void*>(scratch(c.count * es));
      if (c.count && acc != c.in) std::memcpy(acc, c.in, c.count * es);
      tree_reduce(ctx, acc, c.count, c.type, c.op, c.root);
      if (rank_ == c.root) finish_avg(acc, c.count, c.type, c.op, size_);
      break;
    }
    case OpKind::all_to_all:
      direct_all_to_all(ctx, c.in, c.out, c.count * es);
      break;
    case OpKind::barrier:
      dissemination_barrier(ctx);
      break;
  }
}

// ---- argument checks and issue ----
namespace {
std::string size_msg(const char* what, std::size_t got, std::size_t want) {
  std::ostringstream s;
  s << what << " has " << got << " elements, expected " << want;
  return s.str();
}
}  // namespace

Work Communicator::all_reduce_v(ConstView in, MutView out, const AllReduceOptions& o, bool async) {
  if (in.count != out.count) usage("all_reduce", size_msg("output", out.count, in.count));
  if (in.type != out.type) usage("all_reduce", "input and output element types differ");
  if (!supports(OpKind::all_reduce, o.algorithm))
    usage("all_reduce", std::string("algorithm '") + to_string(o.algorithm) + "' does not implement all_reduce (use ring, rhd, tree, hier, native)");
  Call c{OpKind::all_reduce, in.type, o.op, 0, in.data, out.data, in.count, {}, o.algorithm, o.chunk_bytes, o.timeout};
  return issue_call("all_reduce", c, async);
}

Work Communicator::reduce_scatter_v(ConstView in, MutView out, const std::vector<std::size_t>* counts,
                                    const ReduceScatterOptions& o, bool async) {
  std::vector<std::size_t> cs = counts ? *counts : std::vector<std::size_t>(size_, out.count);
  if (static_cast<int>(cs.size()) != size_) usage("reduce_scatter", size_msg("counts", cs.size(), size_));
  std::size_t total = 0;
  for (auto n : cs) total += n;
  if (in.count != total) usage("reduce_scatter", size_msg("input", in.count, total));
  if (out.count != cs[rank_]) usage("reduce_scatter", size_msg("output", out.count, cs[rank_]));
  if (in.type != out.type) usage("reduce_scatter", "input and output element types differ");
  if (!supports(OpKind::reduce_scatter, o.algorithm))
    usage("reduce_scatter", std::string("algorithm '") + to_string(o.algorithm) + "' does not implement reduce_scatter (use ring, native)");
  Call c{OpKind::reduce_scatter, in.type, o.op, 0, in.data, out.data, out.count, std::move(cs), o.algorithm, o.chunk_bytes, o.timeout};
  return issue("reduce_scatter", o.timeout, [this, c](std::uint64_t s) { run_call(c, s); }, async);
}

Work Communicator::all_gather_v(ConstView in, MutView out, const std::vector<std::size_t>* counts,
                                const AllGatherOptions& o, bool async) {
  std::vector<std::size_t> cs = counts ? *counts : std::vector<std::size_t>(size_, in.count);
  if (static_cast<int>(cs.size()) != size_) usage("all_gather", size_msg("counts", cs.size(), size_));
  std::size_t total = 0;
  for (auto n : cs) total += n;
  if (out.count != total) usage("all_gather", size_msg("output", out.count, total));
  if (in.count != cs[rank_]) usage("all_gather", size_msg("input", in.count, cs[rank_]));
  if (in.type != out.type) usage("all_gather", "input and output element types differ");
  if (!supports(OpKind::all_gather, o.algorithm))
    usage("all_gather", std::string("algorithm '") + to_string(o.algorithm) + "' does not implement all_gather (use ring, native)");
  Call c{OpKind::all_gather, in.type, ReduceOp::sum, 0, in.data, out.data, in.count, std::move(cs), o.algorithm, o.chunk_bytes, o.timeout};
  return issue("all_gather", o.timeout, [this, c](std::uint64_t s) { run_call(c, s); }, async);
}

Work Communicator::broadcast_v(MutView buf, const BroadcastOptions& o, bool async) {
  if (o.root < 0 || o.root >= size_) usage("broadcast", "root " + std::to_string(o.root) + " is not a rank of the group");
  if (!supports(OpKind::broadcast, o.algorithm))
    usage("broadcast", std::string("algorithm '") + to_string(o.algorithm) + "' does not implement broadcast (use tree, native)");
  Call c{OpKind::broadcast, buf.type, ReduceOp::sum, o.root, buf.data, buf.data, buf.count, {}, o.algorithm, o.chunk_bytes, o.timeout};
  return issue("broadcast", o.timeout, [this, c](std::uint64_t s) { run_call(c, s); }, async);
}

Work Communicator::reduce_v(ConstView in, MutView out, const ReduceOptions& o, bool async) {
  if (o.root < 0 || o.root >= size_) usage("reduce", "root " + std::to_string(o.root) + " is not a rank of the group");
  if (rank_ == o.root && out.count != in.count) usage("reduce", size_msg("output on the root", out.count, in.count));
  if (in.type != out.type) usage("reduce", "input and output element types differ");
  if (!supports(OpKind::reduce, o.algorithm))
    usage("reduce", std::string("algorithm '") + to_string(o.algorithm) + "' does not implement reduce (use tree, native)");
  Call c{OpKind::reduce, in.type, o.op, o.root, in.data, out.data, in.count, {}, o.algorithm, o.chunk_bytes, o.timeout};
  return issue("reduce", o.timeout, [this, c](std::uint64_t s) { run_call(c, s); }, async);
}

Work Communicator::all_to_all_v(ConstView in, MutView out, const AllToAllOptions& o, bool async) {
  if (in.count != out.count) usage("all_to_all", size_msg("output", out.count, in.count));
  if (in.count % size_ != 0) usage("all_to_all", "input of " + std::to_string(in.count) + " elements does not split into " + std::to_string(size_) + " equal blocks");
  if (in.count && in.data == out.data) usage("all_to_all", "input and output must be distinct buffers");
  if (in.type != out.type) usage("all_to_all", "input and output element types differ");
  if (!supports(OpKind::all_to_all, o.algorithm))
    usage("all_to_all", std::string("algorithm '") + to_string(o.algorithm) + "' does not implement all_to_all (use direct, native)");
  Call c{OpKind::all_to_all, in.type, ReduceOp::sum, 0, in.data, out.data, in.count / size_, {}, o.algorithm, 0, o.timeout};
  return issue("all_to_all", o.timeout, [this, c](std::uint64_t s) { run_call(c, s); }, async);
}

Work Communicator::barrier_v(const BarrierOptions& o, bool async) {
  Call c{OpKind::barrier, DType::f32, ReduceOp::sum, 0, nullptr, nullptr, 0, {}, Algorithm::automatic, 0, o.timeout};
  return issue("barrier", o.timeout, [this, c](std::uint64_t s) { run_call(c, s); }, async);
}

// ---- split ----
std::shared_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  std::shared_ptr<Communicator> child;
  issue("split", Timeout{0}, [&](std::uint64_t seq) {
    OpContext ctx(*t_, "split", name_, seq, deadline_for(Timeout{0}), default_chunk_bytes(t_->backend()), *stats_);
    t_->note_entered(seq);
    std::vector<std::int64_t> all(2 * size_);
    all[2 * rank_] = color;
    all[2 * rank_ + 1] = key;
    ring_all_gather(ctx, all.data(), even_layout(all.size(), size_), sizeof(std::int64_t));
    std::vector<int> members;
    for (int r = 0; color >= 0 && r < size_; ++r)
      if (all[2 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
    // Every rank calls the transport (MPI_Comm_split is collective), kNoColor included.
    std::shared_ptr<Transport> t = t_->split(members, color, seq);
    if (color < 0) return;
    Config cfg{timeout_, debug_ ? 1 : 0};
    child = std::make_shared<Communicator>(std::move(t), name.empty() ? name_ + "/" + std::to_string(color) : name, cfg);
    if (!hosts_.empty()) {
      std::vector<int> hosts;
      for (int m : members) hosts.push_back(hosts_[m]);
      child->set_hosts(std::move(hosts), across_);
    }
  }, false);
  return child;
}

}  // namespace meshtrain::comm
