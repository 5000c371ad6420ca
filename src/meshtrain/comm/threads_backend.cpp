// The threads backend (see threads_backend.h): a Fabric shared by all rank threads holds one
// mailbox per rank (queues of posted sends and receives), one doorbell per rank (where its
// threads sleep), the status of every rank, and the arrival board of every group.
//
// Matching: a send is queued in the destination's mailbox unless a matching receive (same
// group context, source, tag) is already there, and vice versa, in posting order. The data
// moves once, from the sender's buffer into (or reduced into) the receiver's buffer:
// - a collective receive (collective_mode) is always completed by its owner in test()/wait(),
//   so in a ring every rank does its own share of copying and reducing;
// - a user receive is completed by whichever side arrives second, so it progresses while the
//   other side computes.
// Waits spin for a few microseconds (MESHTRAIN_COMM_SPIN_US: 20, or 2 when ranks outnumber
// cores), then yield the core for up to MESHTRAIN_COMM_YIELD_US (100), then sleep on the rank's
// doorbell, waking at least every 20 ms to check deadlines.
//
// Blame: after a missed deadline on a message, the fabric follows who waits for whom (posted
// receives wait for their source; a blocked sender for its destination) from the silent peer
// to the ranks that wait for nobody: those are busy outside communication and did not post
// their side, so the error names them rather than a peer that was itself waiting.
#include "meshtrain/comm/threads_backend.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <system_error>
#include <tuple>

#include "meshtrain/comm/reduce.h"

namespace meshtrain::comm {

namespace {

// ---- entries: one posted send or receive ----
enum State : int { kPosted = 0, kMatched = 1, kClaimed = 2, kDone = 3, kCancelled = 4 };

struct Entry {
  bool is_send;
  int ctx, src, dst, tag;  // src/dst are world ranks
  const void* sbuf = nullptr;
  void* rbuf = nullptr;
  std::size_t bytes = 0;
  bool reduce = false, receiver_copies = false;
  std::size_t count = 0;
  DType type = DType::f32;
  ReduceOp op = ReduceOp::sum;
  std::atomic<int> state{kPosted};
  Entry* partner = nullptr;  // a matched send, for a receive its owner completes
  std::string error;
};

void move_data(Entry* r, Entry* s) {
  if (r->bytes != s->bytes) {
    r->error = s->error = "message size mismatch: " + std::to_string(s->bytes) + " bytes sent, receive posted for " +
                          std::to_string(r->bytes);
    return;
  }
  if (r->reduce) reduce_into(r->rbuf, s->sbuf, r->count, r->type, r->op);
  else if (r->bytes) std::memcpy(r->rbuf, s->sbuf, r->bytes);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

struct Mailbox {
  std::mutex m;
  std::deque<Entry*> sends, recvs;
};
struct Bell {
  std::mutex m;
  std::condition_variable cv;
  std::atomic<int> sleepers{0};
};
// One member's announcements for SharedMemory (a cache line each: only its owner writes it).
struct alignas(64) ShmSlot {
  std::atomic<std::uint64_t> published{0};  // seq + 1 of the last collective it published
  std::atomic<void*> buf{nullptr};          // its buffer in that collective
  std::atomic<std::uint64_t> started{0};    // seq + 1: it saw every buffer and may touch them
  std::atomic<std::uint64_t> finished{0};   // seq + 1 of the last collective it finished
  std::atomic<std::uint64_t> withdrawn{0};  // seq + 1: it left that collective on an error
};
struct Board {
  explicit Board(std::vector<int> m)
      : members(std::move(m)), entered(new std::atomic<std::uint64_t>[members.size()]),
        shm(new ShmSlot[members.size()]) {
    for (std::size_t i = 0; i < members.size(); ++i) entered[i] = 0;
  }
  std::vector<int> members;  // world ranks
  std::unique_ptr<std::atomic<std::uint64_t>[]> entered;
  std::unique_ptr<ShmSlot[]> shm;  // per member
};

// ---- Fabric ----
class Fabric {
 public:
  explicit Fabric(int world)
      : world(world), boxes(world), bells(world), status(new std::atomic<int>[world]),
        blocked(new std::atomic<int>[world]) {
    for (int i = 0; i < world; ++i) status[i] = 0, blocked[i] = 0;
    std::vector<int> all(world);
    for (int i = 0; i < world; ++i) all[i] = i;
    boards[0] = std::make_shared<Board>(all);
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    spin = std::chrono::microseconds(static_cast<unsigned>(world) > cores ? 2 : 20);
    yield = std::chrono::microseconds(100);
    if (const char* s = std::getenv("MESHTRAIN_COMM_SPIN_US")) spin = std::chrono::microseconds(std::atoi(s));
    if (const char* s = std::getenv("MESHTRAIN_COMM_YIELD_US")) yield = std::chrono::microseconds(std::atoi(s));
  }

  void ring(int r) {
    Bell& b = bells[r];
    if (b.sleepers.load() > 0) {
      { std::lock_guard g(b.m); }
      b.cv.notify_all();
    }
  }
  void ring_all() {
    for (auto& b : bells) {
      { std::lock_guard g(b.m); }
      b.cv.notify_all();
    }
  }
  void abort(const std::string& why, std::vector<int> ranks) {
    {
      std::lock_guard g(am);
      if (aborted.load()) return;
      abort_reason = why;
      abort_ranks = std::move(ranks);
      aborted.store(true);
    }
    ring_all();
  }
  void finish(int r, int how) {
    status[r].store(how);
    ring_all();
  }
  [[noreturn]] void throw_aborted() {
    std::lock_guard g(am);
    throw PeerFailure(abort_ranks, "the job was aborted: " + abort_reason);
  }

  void post_send(Entry* s) {
    Mailbox& box = boxes[s->dst];
    std::unique_lock lk(box.m);
    auto it = box.recvs.begin();
    for (; it != box.recvs.end(); ++it)
      if ((*it)->ctx == s->ctx && (*it)->src == s->src && (*it)->tag == s->tag) break;
    if (it == box.recvs.end()) {
      box.sends.push_back(s);
      return;
    }
    Entry* r = *it;
    box.recvs.erase(it);
    const int receiver = r->dst;  // read before the owner may free r
    s->state.store(kClaimed);
    if (r->receiver_copies) {
      r->partner = s;
      r->state.store(kMatched);
      lk.unlock();
      ring(receiver);
      return;
    }
    r->state.store(kClaimed);
    lk.unlock();
    move_data(r, s);
    s->state.store(kDone);
    r->state.store(kDone);
    ring(receiver);
  }

  void post_recv(Entry* r) {
    Mailbox& box = boxes[r->dst];
    std::unique_lock lk(box.m);
    auto it = box.sends.begin();
    for (; it != box.sends.end(); ++it)
      if ((*it)->ctx == r->ctx && (*it)->src == r->src && (*it)->tag == r->tag) break;
    if (it == box.sends.end()) {
      box.recvs.push_back(r);
      return;
    }
    Entry* s = *it;
    box.sends.erase(it);
    const int sender = s->src;  // read before the owner may free s
    s->state.store(kClaimed);
    r->state.store(kClaimed);
    lk.unlock();
    move_data(r, s);
    r->state.store(kDone);
    s->state.store(kDone);
    ring(sender);
  }

  // Removes a still-posted entry from its mailbox; false if a peer already took it.
  bool cancel(Entry* e) {
    Mailbox& box = boxes[e->dst];
    std::lock_guard lk(box.m);
    if (e->state.load() != kPosted) return false;
    auto& q = e->is_send ? box.sends : box.recvs;
    for (auto it = q.begin(); it != q.end(); ++it)
      if (*it == e) {
        q.erase(it);
        break;
      }
    e->state.store(kCancelled);
    return true;
  }

  // Diagnostics after world rank `me` missed a deadline waiting on world rank `peer`: the
  // running ranks reached from `peer` along wait-for edges that wait for nobody themselves
  // (sorted). Empty when every rank reached waits for another (a deadlock or mismatched
  // messages). Locks the mailboxes one at a time; only for error paths.
  std::vector<int> late(int me, int peer) {
    std::vector<std::vector<int>> waits_for(world);
    std::vector<char> waiting(world, 0);
    for (int r = 0; r < world; ++r) waiting[r] = blocked[r].load() > 0;
    for (int d = 0; d < world; ++d) {
      std::lock_guard lk(boxes[d].m);
      for (const Entry* e : boxes[d].recvs) waits_for[d].push_back(e->src), waiting[d] = 1;
      for (const Entry* e : boxes[d].sends)
        if (blocked[e->src].load() > 0) waits_for[e->src].push_back(d);
    }
    std::vector<char> seen(world, 0);
    std::vector<int> queue{peer}, out;
    seen[peer] = seen[me] = 1;
    for (std::size_t i = 0; i < queue.size(); ++i) {
      const int v = queue[i];
      if (!waiting[v]) {
        if (status[v].load() == 0) out.push_back(v);
        continue;
      }
      for (int u : waits_for[v])
        if (!seen[u]) seen[u] = 1, queue.push_back(u);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::pair<int, std::shared_ptr<Board>> context_for(int parent, std::uint64_t split_id, int color,
                                                     const std::vector<int>& world_members) {
    std::lock_guard g(cm);
    auto key = std::make_tuple(parent, split_id, color);
    auto it = ctx_ids.find(key);
    if (it == ctx_ids.end()) {
      const int id = next_ctx++;
      it = ctx_ids.emplace(key, id).first;
      boards[id] = std::make_shared<Board>(world_members);
    }
    return {it->second, boards[it->second]};
  }

  const int world;
  std::vector<Mailbox> boxes;
  std::vector<Bell> bells;
  std::unique_ptr<std::atomic<int>[]> status;   // 0 running, 1 returned, 2 threw (or never started)
  std::unique_ptr<std::atomic<int>[]> blocked;  // threads of the rank inside wait_until
  std::atomic<bool> aborted{false};
  std::mutex am;
  std::string abort_reason;
  std::vector<int> abort_ranks;
  std::mutex cm;
  std::map<std::tuple<int, std::uint64_t, int>, int> ctx_ids;
  std::map<int, std::shared_ptr<Board>> boards;
  int next_ctx = 1;
  std::chrono::microseconds spin{20}, yield{100};  // pause-spin, then yield, then sleep
};

// ---- ThreadsRequest ----
class ThreadsRequest final : public Request {
 public:
  ThreadsRequest(std::shared_ptr<Fabric> f, std::unique_ptr<Entry> e, int owner, int peer_group, int peer_world)
      : f_(std::move(f)), e_(std::move(e)), owner_(owner), peer_(peer_group), peer_world_(peer_world) {}
  ~ThreadsRequest() override {
    Entry* e = e_.get();
    if (e->state.load() == kPosted && f_->cancel(e)) return;
    if (e->state.load() == kMatched) complete_matched();
    while (e->state.load() == kClaimed) std::this_thread::yield();
  }
  int peer() const override { return peer_; }

  bool test() override {
    const int st = e_->state.load();
    if (st == kDone) return check_error();
    if (st == kMatched) {
      complete_matched();
      return check_error();
    }
    if (f_->aborted.load()) f_->throw_aborted();
    if (st == kPosted) {
      const int ps = f_->status[peer_world_].load();
      if (ps != 0 && e_->state.load() == kPosted)
        throw PeerFailure({peer_}, "rank " + std::to_string(peer_) + (ps == 1 ? " returned from its function" : " threw") +
                                       " without " + (e_->is_send ? "receiving" : "sending") + " this message");
    }
    return false;
  }

  bool wait_until(Clock::time_point deadline) override {
    // Spin briefly (the peer usually answers within microseconds), then yield for a while (on a
    // crowded machine the peer may be waiting for this very core), then sleep on the doorbell.
    struct Blocked {
      std::atomic<int>& n;
      explicit Blocked(std::atomic<int>& c) : n(c) { n.fetch_add(1); }
      ~Blocked() { n.fetch_sub(1); }
    } blocked(f_->blocked[owner_]);
    const auto t0 = Clock::now();
    const auto spin_end = t0 + f_->spin, yield_end = t0 + f_->yield;
    for (unsigned i = 1;; ++i) {
      if (test()) return true;
      if ((i & 63) == 0 && Clock::now() >= spin_end) break;
      cpu_relax();
    }
    while (Clock::now() < yield_end) {
      if (test()) return true;
      std::this_thread::yield();
    }
    Bell& b = f_->bells[owner_];
    for (;;) {
      if (test()) return true;
      const auto now = Clock::now();
      if (now >= deadline) return false;
      std::unique_lock lk(b.m);
      b.sleepers.fetch_add(1);
      const int st = e_->state.load();
      const bool pending = st == kClaimed || (st == kPosted && f_->status[peer_world_].load() == 0);
      if (pending && !f_->aborted.load()) b.cv.wait_until(lk, std::min(deadline, now + std::chrono::milliseconds(20)));
      b.sleepers.fetch_sub(1);
    }
  }

 private:
  void complete_matched() {
    Entry* s = e_->partner;
    move_data(e_.get(), s);
    const int sender = s->src;
    s->state.store(kDone);
    e_->state.store(kDone);
    f_->ring(sender);
  }
  bool check_error() {
    if (!e_->error.empty()) throw PeerFailure({peer_}, e_->error);
    return true;
  }

  std::shared_ptr<Fabric> f_;
  std::unique_ptr<Entry> e_;
  int owner_, peer_, peer_world_;
};

// ---- ThreadsShared: SharedMemory over a group's board ----
// Announcements are sequence numbers in the members' slots (seq_cst stores, acquire loads).
// A wait spins with pause for the fabric's spin time, then yields, then sleeps on this rank's
// doorbell (20 ms at most, for deadlines); an announcing rank rings the doorbells of the members
// that sleep (an atomic load each when none does). A member that returned or threw, or an
// aborted fabric, ends the wait with PeerFailure.
//
// Leaving on an error. The others write into this rank's buffer between their publish and
// finish, so a rank that leaves the collective early (its wait failed) must not return while
// one of them may still do so: it marks itself withdrawn, then waits until every member that
// started (saw all buffers) has finished; that takes no longer than their summing, which never
// waits. A member that sees all buffers marks itself started and then checks that nobody
// withdrew (either the leaver sees its start or it sees the withdrawal: both are seq_cst), so
// none starts after a withdrawal. A finish that sees a withdrawal fails too: the leaver may
// not have written its block.
class ThreadsShared final : public SharedMemory {
 public:
  ThreadsShared(Fabric& f, Board& b, int rank) : f_(f), b_(b), rank_(rank), p_(static_cast<int>(b.members.size())) {}

  bool publish(std::uint64_t seq, void* buf, Clock::time_point deadline) override {
    ShmSlot& me = b_.shm[rank_];
    me.buf.store(buf, std::memory_order_relaxed);
    me.published.store(seq + 1);  // seq_cst: ordered before wake()'s loads of the sleepers
    wake();
    guarded(seq, [&] { return wait(seq, 0, deadline); });
    if (!ok_) return false;
    me.started.store(seq + 1);
    guarded(seq, [&] { return check_withdrawn(seq); });
    return ok_;
  }
  void* buffer(int member) const override { return b_.shm[member].buf.load(std::memory_order_relaxed); }
  bool finish(std::uint64_t seq, Clock::time_point deadline) override {
    b_.shm[rank_].finished.store(seq + 1);
    wake();
    guarded(seq, [&] { return wait(seq, 1, deadline) && check_withdrawn(seq); });
    return ok_;
  }
  std::vector<int> missing(std::uint64_t seq, int phase) const override {
    std::vector<int> out;
    for (int q = 0; q < p_; ++q)
      if (!arrived(q, seq, phase)) out.push_back(q);
    return out;
  }

 private:
  // Runs a wait; if it fails (false or an exception), withdraws before passing the failure on.
  template <class W>
  void guarded(std::uint64_t seq, W&& w) {
    try {
      ok_ = w();
    } catch (...) {
      withdraw(seq);
      throw;
    }
    if (!ok_) withdraw(seq);
  }
  bool check_withdrawn(std::uint64_t seq) {
    for (int q = 0; q < p_; ++q)
      if (q != rank_ && b_.shm[q].withdrawn.load() == seq + 1)  // this collective, not a later one
        throw PeerFailure({q}, "rank " + std::to_string(q) + " left this collective after a failure");
    return true;
  }
  void withdraw(std::uint64_t seq) {
    ShmSlot& me = b_.shm[rank_];
    me.withdrawn.store(seq + 1);
    me.finished.store(seq + 1);  // done with the others' buffers (a failed wait touches none)
    wake();
    for (int q = 0; q < p_; ++q) {
      const ShmSlot& s = b_.shm[q];
      for (int i = 0; s.started.load() > seq && s.finished.load() <= seq; ++i) {
        if (i < 1000) cpu_relax();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  bool arrived(int q, std::uint64_t seq, int phase) const {
    const ShmSlot& s = b_.shm[q];
    return (phase == 0 ? s.published : s.finished).load(std::memory_order_acquire) > seq;
  }
  // The first member not yet arrived at (seq, phase), from `from` on; p_ when all have.
  int first_missing(std::uint64_t seq, int phase, int from) const {
    for (int q = from; q < p_; ++q)
      if (!arrived(q, seq, phase)) return q;
    return p_;
  }
  void wake() {
    for (int q = 0; q < p_; ++q)
      if (q != rank_) f_.ring(b_.members[q]);
  }
  void check(int q) {
    if (f_.aborted.load()) f_.throw_aborted();
    const int st = f_.status[b_.members[q]].load();
    if (st != 0)
      throw PeerFailure({q}, "rank " + std::to_string(q) + (st == 1 ? " returned from its function" : " threw") +
                                 " without entering this collective");
  }
  // The first member from q on not yet arrived (p_: all have). With `check`, throws when the
  // fabric was aborted or that member is gone, unless it arrived before that was seen (the
  // failure is read first, then the arrivals: a member that finished before a peer failed
  // counts as arrived).
  int poll(std::uint64_t seq, int phase, int q, bool check_peers) {
    q = first_missing(seq, phase, q);
    if (q == p_ || !check_peers) return q;
    if (!f_.aborted.load() && f_.status[b_.members[q]].load() == 0) return q;
    if ((q = first_missing(seq, phase, q)) == p_) return q;
    check(q);
    return q;
  }
  bool wait(std::uint64_t seq, int phase, Clock::time_point deadline) {
    int q = first_missing(seq, phase, 0);
    if (q == p_) return true;
    struct Blocked {
      std::atomic<int>& n;
      explicit Blocked(std::atomic<int>& c) : n(c) { n.fetch_add(1); }
      ~Blocked() { n.fetch_sub(1); }
    } blocked(f_.blocked[b_.members[rank_]]);
    const auto t0 = Clock::now();
    const auto spin_end = t0 + f_.spin, yield_end = t0 + f_.yield;
    for (unsigned i = 1;; ++i) {
      if ((q = poll(seq, phase, q, (i & 63) == 0)) == p_) return true;
      if ((i & 63) == 0 && Clock::now() >= spin_end) break;
      cpu_relax();
    }
    while (Clock::now() < yield_end) {
      if ((q = poll(seq, phase, q, true)) == p_) return true;
      std::this_thread::yield();
    }
    Bell& bell = f_.bells[b_.members[rank_]];
    for (;;) {
      if ((q = poll(seq, phase, q, true)) == p_) return true;
      const auto now = Clock::now();
      if (now >= deadline) return false;
      std::unique_lock lk(bell.m);
      bell.sleepers.fetch_add(1);
      if (!arrived(q, seq, phase) && !f_.aborted.load() && f_.status[b_.members[q]].load() == 0)
        bell.cv.wait_until(lk, std::min(deadline, now + std::chrono::milliseconds(20)));
      bell.sleepers.fetch_sub(1);
    }
  }

  Fabric& f_;
  Board& b_;
  int rank_, p_;
  bool ok_ = false;
};

// ---- ThreadsTransport ----
class ThreadsTransport final : public Transport {
 public:
  ThreadsTransport(std::shared_ptr<Fabric> f, int ctx, std::shared_ptr<Board> board, int rank)
      : f_(std::move(f)), ctx_(ctx), board_(std::move(board)), rank_(rank), shared_(*f_, *board_, rank_) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(board_->members.size()); }
  const char* backend() const override { return "threads"; }

  RequestPtr isend(int peer, int tag, const void* buf, std::size_t bytes) override {
    auto e = make(true, peer, tag);
    e->sbuf = buf;
    e->bytes = bytes;
    Entry* raw = e.get();
    auto req = std::make_unique<ThreadsRequest>(f_, std::move(e), me(), peer, world(peer));
    f_->post_send(raw);
    return req;
  }
  RequestPtr irecv(int peer, int tag, void* buf, std::size_t bytes, bool collective_mode) override {
    auto e = make(false, peer, tag);
    e->rbuf = buf;
    e->bytes = bytes;
    e->receiver_copies = collective_mode;
    Entry* raw = e.get();
    auto req = std::make_unique<ThreadsRequest>(f_, std::move(e), me(), peer, world(peer));
    f_->post_recv(raw);
    return req;
  }
  RequestPtr irecv_reduce(int peer, int tag, void* inout, std::size_t count, DType t, ReduceOp op) override {
    auto e = make(false, peer, tag);
    e->rbuf = inout;
    e->bytes = count * dtype_size(t);
    e->reduce = true;
    e->receiver_copies = true;
    e->count = count;
    e->type = t;
    e->op = op;
    Entry* raw = e.get();
    auto req = std::make_unique<ThreadsRequest>(f_, std::move(e), me(), peer, world(peer));
    f_->post_recv(raw);
    return req;
  }

  std::unique_ptr<Transport> split(const std::vector<int>& members, int color, std::uint64_t split_id) override {
    if (color < 0) return nullptr;
    std::vector<int> wm;
    int new_rank = -1;
    for (std::size_t i = 0; i < members.size(); ++i) {
      wm.push_back(world(members[i]));
      if (members[i] == rank_) new_rank = static_cast<int>(i);
    }
    auto [ctx, board] = f_->context_for(ctx_, split_id, color, wm);
    return std::make_unique<ThreadsTransport>(f_, ctx, board, new_rank);
  }

  void note_entered(std::uint64_t seq) override { board_->entered[rank_].store(seq + 1); }
  std::vector<int> not_arrived(std::uint64_t seq) const override {
    std::vector<int> out;
    for (int i = 0; i < size(); ++i)
      if (board_->entered[i].load() < seq + 1) out.push_back(i);
    return out;
  }
  std::vector<int> late_ranks(int peer) const override {
    std::vector<int> out;
    for (int w : f_->late(me(), world(peer))) {
      auto it = std::find(board_->members.begin(), board_->members.end(), w);
      if (it != board_->members.end()) out.push_back(static_cast<int>(it - board_->members.begin()));
    }
    if (out.empty()) out.push_back(peer);
    return out;
  }
  void abort(const std::string& reason) override { f_->abort(reason, {}); }
  SharedMemory* shared_memory() override { return &shared_; }

 private:
  int me() const { return board_->members[rank_]; }
  int world(int r) const { return board_->members[r]; }
  std::unique_ptr<Entry> make(bool send, int peer, int tag) {
    auto e = std::make_unique<Entry>();
    e->is_send = send;
    e->ctx = ctx_;
    e->tag = tag;
    e->src = send ? me() : world(peer);
    e->dst = send ? world(peer) : me();
    return e;
  }

  std::shared_ptr<Fabric> f_;
  int ctx_;
  std::shared_ptr<Board> board_;
  int rank_;
  ThreadsShared shared_;
};

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

// ---- run_threads ----
namespace {

// What the rank threads share with run_threads' caller, which outlives them: it joins them all
// (only a stuck-ranks handler that ends the process leaves earlier).
struct RunState {
  std::mutex m;
  std::condition_variable cv;
  std::exception_ptr first;
  int running = 0;  // threads started and not yet finished
  void fail(std::exception_ptr e) {
    {
      std::lock_guard g(m);
      if (!first) first = std::move(e);
    }
    cv.notify_all();
  }
  void finished() {
    {
      std::lock_guard g(m);
      --running;
    }
    cv.notify_all();
  }
};

void rank_main(const std::shared_ptr<Fabric>& f, const std::shared_ptr<Board>& board, RunState& run, int r,
               const std::function<void(Communicator&)>& fn, const ThreadsOptions& opts) {
  Fabric& fabric = *f;
  int how = 1;
  {
    auto t = std::make_shared<ThreadsTransport>(f, 0, board, r);
    Communicator comm(t, opts.name, {opts.timeout, opts.debug});
    try {
      fn(comm);
    } catch (...) {
      auto e = std::current_exception();
      run.fail(e);
      how = 2;
      // Abort first, so waiters see the reason rather than only "rank r threw". A CommError
      // passes on the ranks it blames; a mismatch needs no abort (every rank got the verdict).
      std::vector<int> blamed{r};
      bool abort = true;
      try {
        std::rethrow_exception(e);
      } catch (const CommError& ce) {
        blamed = ce.ranks();
        abort = ce.kind() != ErrorKind::mismatch;
      } catch (...) {
      }
      if (abort) fabric.abort("rank " + std::to_string(r) + " failed: " + what_of(e), blamed);
      fabric.finish(r, 2);
    }
  }
  if (how == 1) fabric.finish(r, 1);
  run.finished();
}

std::string start_failure(const std::exception& e) {
  if (auto* se = dynamic_cast<const std::system_error*>(&e)) return se->code().message();
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "out of memory";
  return e.what();
}

std::mutex g_stuck_m;
StuckRanksHandler g_stuck_handler;
Timeout g_stuck_grace = std::chrono::seconds(3);

}  // namespace

ThreadStartError::ThreadStartError(int rank, int world, const std::string& reason)
    : std::runtime_error("could not start the thread of rank " + std::to_string(rank) + " of " +
                         std::to_string(world) + ": " + reason),
      rank_(rank), world_(world) {}

void set_stuck_ranks_handler(StuckRanksHandler h, Timeout grace) {
  std::lock_guard g(g_stuck_m);
  g_stuck_handler = std::move(h);
  g_stuck_grace = grace.count() > 0 ? grace : std::chrono::seconds(3);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(getpid(), sizeof set, &set) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<int> core_binding(int world, int threads_per_rank) {
  if (threads_per_rank != 1 || world < 2) return {};
  if (const char* s = std::getenv("MESHTRAIN_COMM_PIN"); s && std::string(s) == "0") return {};
  const std::vector<int> allowed = allowed_cpus();
  const int n = static_cast<int>(allowed.size());
  if (n == 0 || world <= n || world % n != 0) return {};
  std::vector<int> cores(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) cores[static_cast<size_t>(r)] = allowed[static_cast<size_t>(r % n)];
  return cores;
}

void run_threads(int world, const std::function<void(Communicator&)>& fn, const ThreadsOptions& opts) {
  if (world < 1) throw std::invalid_argument("run_threads: world must be at least 1, got " + std::to_string(world));
  auto fabric = std::make_shared<Fabric>(world);
  const std::shared_ptr<Board> board = fabric->boards[0];  // read before ranks may split (boards grows)
  RunState run;
  std::vector<std::thread> threads;
  threads.reserve(world);
  const std::vector<int> cores = core_binding(world, opts.threads_per_rank);
  for (int r = 0; r < world; ++r) {
    const int core = cores.empty() ? -1 : cores[static_cast<size_t>(r)];
    std::function<void()> body = [f = fabric, &board, &run, &fn, &opts, r, core] {
      if (core >= 0) {  // a hint: a rank that cannot be bound runs where the scheduler puts it
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(core, &set);
        (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
      }
      rank_main(f, board, run, r, fn, opts);
    };
    {
      std::lock_guard g(run.m);
      ++run.running;
    }
    try {
      threads.push_back(opts.start_thread ? opts.start_thread(r, std::move(body)) : std::thread(std::move(body)));
    } catch (const std::exception& e) {
      {
        std::lock_guard g(run.m);
        --run.running;
      }
      // Ranks r.. never run: mark them failed, so a started rank waiting on one fails at once,
      // and abort the fabric, so every started rank fails at its next operation.
      const ThreadStartError err(r, world, start_failure(e));
      run.fail(std::make_exception_ptr(err));
      for (int q = r; q < world; ++q) fabric->status[q].store(2);
      fabric->abort(err.what(), {r});
      break;
    }
  }
  // Watchdog: after the first failure, ranks in a wait stop within milliseconds; ranks still
  // running after the grace are busy outside communication, and the handler decides.
  {
    std::unique_lock lk(run.m);
    run.cv.wait(lk, [&] { return run.running == 0 || run.first; });
    if (run.running > 0) {
      StuckRanksHandler handler = opts.on_stuck;
      Timeout grace = opts.stuck_grace;
      {
        std::lock_guard g(g_stuck_m);
        if (!handler) handler = g_stuck_handler;
        if (grace.count() <= 0) grace = g_stuck_grace;
      }
      if (handler && !run.cv.wait_for(lk, grace, [&] { return run.running == 0; })) {
        std::vector<int> stuck;
        for (int r = 0; r < static_cast<int>(threads.size()); ++r)
          if (fabric->status[r].load() == 0) stuck.push_back(r);
        const std::exception_ptr first = run.first;
        lk.unlock();
        if (!stuck.empty()) handler(first, stuck);
      }
    }
  }
  for (auto& t : threads)
    if (t.joinable()) t.join();
  if (run.first) std::rethrow_exception(run.first);
}

}  // namespace meshtrain::comm
