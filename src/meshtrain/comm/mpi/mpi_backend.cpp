// The mpi backend: ranks are processes started by mpirun (OpenMPI); point-to-point over
// MPI_Isend/MPI_Irecv, the collective algorithms are the shared ones (algorithms.h), and
// Algorithm::native calls the library's own nonblocking collective (MPI_Iallreduce, ...) so
// the two can be compared in the same run.
//
// Deadlines: every wait polls MPI_Test (spin, then yield, then short sleeps) against the
// deadline, because a peer that died leaves MPI_Recv waiting forever under OpenMPI. After any
// failed operation the process is marked failed; its exit waits (at most 2 s) for the others to
// report, then calls MPI_Abort, which ends them instead of leaving them waiting until the job's
// end.
//
// Threads: all MPI calls are serialised by one mutex (the progress thread of async collectives
// and the caller may both talk to MPI), so MPI_THREAD_SERIALIZED suffices.
// Limits: counts must fit an int (MPI's), i.e. < 2^31 elements per message.
// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "meshtrain/comm/reduce.h"
#include "meshtrain/comm/world.h"

namespace meshtrain::comm {

namespace {

// ---- process-wide MPI state (MPI forces this global) ----
std::mutex g_mpi;                 // serialises every MPI call
std::atomic<bool> g_failed{false};  // an operation failed: abort instead of finalize at exit
MPI_Comm g_notice = MPI_COMM_NULL;  // world dup carrying abort notices (tag kNoticeTag)
constexpr int kNoticeTag = 1;
constexpr int kDoneTag = 2;  // "this failed process has reported and is leaving" (1 byte)
constexpr int kNoticeBytes = 512;
std::vector<MPI_Request> g_notice_sends;  // kept (not freed) so the exit can drive them
std::vector<char> g_silent;  // world ranks that missed a deadline of this process (under g_mpi)
int g_world_rank = 0, g_world_size = 1;

// What this process is blocked on, for the SIGTERM handler (double-buffered: the handler reads
// the slot last published). The fields are stored and the handler formats them: every wait
// publishes one, so formatting there would cost every small all-reduce its time.
struct Activity {
  const char* op;
  const char* group;  // the communicator's name, alive while it waits
  unsigned long long seq;
  int peer;
};
Activity g_activity[2];
std::atomic<int> g_activity_slot{-1};

void on_sigterm(int sig) {
  const int slot = g_activity_slot.load();
  char head[96];
  const int n = std::snprintf(head, sizeof head, "meshtrain: world rank %d terminated by the launcher", g_world_rank);
  if (n > 0) (void)!write(2, head, static_cast<std::size_t>(n));
  if (slot >= 0) {
    char a[384];
    const Activity& w = g_activity[slot];
    std::snprintf(a, sizeof a, "%s #%llu on group '%s' for rank %d (not heard from)", w.op, w.seq, w.group, w.peer);
    (void)!write(2, " while waiting in ", 18);
    (void)!write(2, a, std::strlen(a));
    (void)!write(2, " (a peer process probably died)", 31);
  }
  (void)!write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// A failed process is about to end the job with MPI_Abort, which kills every process at once:
// first it lets the others report. It tells each that it has reported (kDoneTag), and waits until
// every other process has said the same or kReportGrace has passed (a process that died or hangs
// in computation never answers), driving its own sends meanwhile: under OpenMPI a nonblocking
// send may only progress inside MPI calls of the sender. Without this, on a loaded machine the
// abort of the first failed process could kill a peer before that peer had seen the notice and
// named its failed operation.
// 10 s: answering takes a peer only a scheduling slot, but on an oversubscribed machine (three
// processes and a training run on 2 cores) 2 s was seen to pass before a waiting peer ran.
constexpr auto kReportGrace = std::chrono::seconds(10);

void finish_reporting() {
  static char byte = 1;
  std::vector<MPI_Request> sends;
  std::vector<char> heard(static_cast<std::size_t>(g_world_size), 0);
  int missing = g_world_size - 1;
  {
    std::lock_guard g(g_mpi);
    // A process that missed one of our deadlines (stopped, or behind a broken link) will not
    // answer either: waiting for it would only delay the end of the job by the whole grace.
    for (int r = 0; r < g_world_size && r < static_cast<int>(g_silent.size()); ++r)
      if (g_silent[static_cast<std::size_t>(r)] && r != g_world_rank) heard[static_cast<std::size_t>(r)] = 1, --missing;
    for (int r = 0; r < g_world_size; ++r) {
      if (r == g_world_rank) continue;
      sends.emplace_back();
      MPI_Isend(&byte, 1, MPI_CHAR, r, kDoneTag, g_notice, &sends.back());
    }
  }
  const auto end = std::chrono::steady_clock::now() + kReportGrace;
  while (missing > 0 && std::chrono::steady_clock::now() < end) {
    bool got = false;
    {
      std::lock_guard g(g_mpi);
      int flag = 0, done = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kDoneTag, g_notice, &flag, &st);
      if (flag) {
        char b = 0;
        MPI_Recv(&b, 1, MPI_CHAR, st.MPI_SOURCE, kDoneTag, g_notice, MPI_STATUS_IGNORE);
        if (!heard[static_cast<std::size_t>(st.MPI_SOURCE)]) heard[static_cast<std::size_t>(st.MPI_SOURCE)] = 1, --missing;
        got = true;
      }
      MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE);
      if (!g_notice_sends.empty())
        MPI_Testall(static_cast<int>(g_notice_sends.size()), g_notice_sends.data(), &done,
                    MPI_STATUSES_IGNORE);
    }
    if (!got) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void at_exit_hook() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_failed.load()) {
    finish_reporting();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
}

// Tells every other process that this one failed (fire and forget), so their waits end now
// with this reason instead of at their deadline.
void send_notice(const std::string& reason) {
  static std::atomic<bool> sent{false};
  if (sent.exchange(true) || g_notice == MPI_COMM_NULL) return;
  static char text[kNoticeBytes];
  std::snprintf(text, sizeof text, "%s", reason.c_str());
  std::lock_guard g(g_mpi);
  for (int r = 0; r < g_world_size; ++r) {
    if (r == g_world_rank) continue;
    g_notice_sends.emplace_back();
    MPI_Isend(text, kNoticeBytes, MPI_CHAR, r, kNoticeTag, g_notice, &g_notice_sends.back());
  }
}

// Throws PeerFailure if another process sent a notice. Called from every poll loop.
void check_notice() {
  int flag = 0;
  MPI_Status st;
  char text[kNoticeBytes];
  {
    std::lock_guard g(g_mpi);
    MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, g_notice, &flag, &st);
    if (!flag) return;
    MPI_Recv(text, kNoticeBytes, MPI_CHAR, st.MPI_SOURCE, kNoticeTag, g_notice, MPI_STATUS_IGNORE);
  }
  text[kNoticeBytes - 1] = 0;
  g_failed = true;
  throw PeerFailure({st.MPI_SOURCE}, std::string("process of world rank ") + std::to_string(st.MPI_SOURCE) +
                                         " failed: " + text);
}

void ensure_init() {
  static const bool once = [] {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (provided < MPI_THREAD_SERIALIZED)
        throw std::runtime_error("the MPI library does not support MPI_THREAD_SERIALIZED");
      std::atexit(at_exit_hook);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world_size);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_notice);
    std::signal(SIGTERM, on_sigterm);
    return true;
  }();
  (void)once;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}
MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}
int as_int(std::size_t n) {
  if (n > static_cast<std::size_t>(INT_MAX)) throw std::length_error("message of more than 2^31 elements");
  return static_cast<int>(n);
}

// ---- polling ----
// Spin ~50 us on MPI_Test, then yield, then sleep in growing steps up to 200 us.
template <class Test>
bool poll_until(Test&& test, Clock::time_point deadline) {
  for (int i = 0; i < 64; ++i) {  // the peer usually answers within a microsecond: no clock yet
    if (test()) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  const auto t0 = Clock::now();
  for (unsigned i = 0;; ++i) {
    if (test()) return true;
    if ((i & 255) == 255) check_notice();
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto waited = now - t0;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(2)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(waited < std::chrono::milliseconds(20) ? 20 : 200));
  }
}

// ---- scratch pool for irecv_reduce ----
class Pool {
 public:
  std::vector<char> take(std::size_t bytes) {
    std::lock_guard g(m_);
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->size() >= bytes) {
        std::vector<char> v = std::move(*it);
        free_.erase(it);
        return v;
      }
    return std::vector<char>(bytes);
  }
  void give(std::vector<char> v) {
    std::lock_guard g(m_);
    if (free_.size() < 64) free_.push_back(std::move(v));
  }

 private:
  std::mutex m_;
  std::vector<std::vector<char>> free_;
};

// ---- MpiRequest ----
class MpiRequest final : public Request {
 public:
  MpiRequest(int peer, std::shared_ptr<Pool> pool) : peer_(peer), pool_(std::move(pool)) {}
  ~MpiRequest() override {
    if (done_) return;
    std::lock_guard g(g_mpi);
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (!flag) {
      // Abandoned after a failure: cancel, and make the process abort at exit.
      MPI_Cancel(&req_);
      MPI_Request_free(&req_);
      g_failed = true;
    }
    if (pool_ && !scratch_.empty()) pool_->give(std::move(scratch_));
  }
  int peer() const override { return peer_; }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    {
      std::lock_guard g(g_mpi);
      MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    }
    if (!flag) return false;
    done_ = true;
    if (target_) {
      reduce_into(target_, scratch_.data(), count_, type_, op_);
      pool_->give(std::move(scratch_));
    }
    return true;
  }
  bool wait_until(Clock::time_point deadline) override { return poll_until([&] { return test(); }, deadline); }

  MPI_Request req_ = MPI_REQUEST_NULL;
  // irecv_reduce: the message lands in scratch_, then target_ op= scratch_.
  void* target_ = nullptr;
  std::vector<char> scratch_;
  std::size_t count_ = 0;
  DType type_ = DType::f32;
  ReduceOp op_ = ReduceOp::sum;

 private:
  int peer_;
  bool done_ = false;
  std::shared_ptr<Pool> pool_;
};

// ---- shared memory on one host ----
// A group whose processes are all on one host (the hosts of mpi_hosts) gets, when its transport
// is made, an MPI-3 shared window: per process a 128-byte header (two announcements, a cache
// line each) and a stage of kStageBytes, which shm.cpp copies its data into, exchanges through
// and copies the result out of. The waits poll the headers as poll_until polls MPI_Test (with
// the abort notices and the deadline). The window is never freed before MPI_Finalize:
// MPI_Win_free synchronises the group, and processes may drop their communicators in different
// orders (or fail). MESHTRAIN_COMM_MPI_SHM=0 turns it off.
//
// Where the MPI library refuses the window (MPI_ERR_RMA_SHARED: it counts the processes on
// different nodes, e.g. the network-namespace hosts of tests/hosts, whose second host's node
// name is an address while its processes' host name is the machine's), the segments are a
// POSIX shared-memory file (/dev/shm) instead, made by the group's rank 0 and mapped by all:
// meshtrain's hosts (host name and network namespace) are then the processes that share it.
// A token written by rank 0 and read by every member proves the mapping is shared; where it is
// not (or the file cannot be made), the group has no shared memory and the algorithms that need
// it are not used.
std::vector<int> g_hosts;  // host of each world rank, set before the world's transport is made
constexpr std::size_t kStageBytes = std::size_t{1} << 20;
constexpr std::size_t kHeaderBytes = 128;

class MpiShared final : public SharedMemory {
 public:
  MpiShared(MPI_Comm comm, int rank, int size, std::size_t stage_bytes)
      : rank_(rank), size_(size), stage_bytes_(stage_bytes), segs_(static_cast<std::size_t>(size)) {
    std::lock_guard g(g_mpi);
    if (!window(comm) && !posix(comm)) return;
    char* mine = segs_[static_cast<std::size_t>(rank_)];
    new (mine) std::atomic<std::uint64_t>(0);
    new (mine + 64) std::atomic<std::uint64_t>(0);
    MPI_Barrier(comm);  // every header is initialised before anyone reads one
    ok_ = true;
  }
  bool ok() const { return ok_; }
  void* stage() override { return segs_[static_cast<std::size_t>(rank_)] + kHeaderBytes; }
  std::size_t limit() const override { return stage_bytes_; }
  bool publish(std::uint64_t seq, void*, Clock::time_point deadline) override {
    flag(rank_, 0).store(seq + 1);
    return poll_until([&] { return all(seq, 0); }, deadline);
  }
  void* buffer(int member) const override { return segs_[static_cast<std::size_t>(member)] + kHeaderBytes; }
  bool finish(std::uint64_t seq, Clock::time_point deadline) override {
    flag(rank_, 1).store(seq + 1);
    return poll_until([&] { return all(seq, 1); }, deadline);
  }
  std::vector<int> missing(std::uint64_t seq, int phase) const override {
    std::vector<int> out;
    for (int q = 0; q < size_; ++q)
      if (flag(q, phase).load() <= seq) out.push_back(q);
    return out;
  }

 private:
  std::atomic<std::uint64_t>& flag(int q, int phase) const {
    return *reinterpret_cast<std::atomic<std::uint64_t>*>(segs_[static_cast<std::size_t>(q)] + 64 * phase);
  }
  bool all(std::uint64_t seq, int phase) const {
    for (int q = 0; q < size_; ++q)
      if (flag(q, phase).load(std::memory_order_acquire) <= seq) return false;
    return true;
  }

  // The MPI-3 window; false (on every member) where the library refuses it.
  bool window(MPI_Comm comm) {
    MPI_Errhandler fatal;
    MPI_Comm_get_errhandler(comm, &fatal);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    char* mine = nullptr;
    int ok = MPI_Win_allocate_shared(static_cast<MPI_Aint>(kHeaderBytes + stage_bytes_), 1, info, comm, &mine, &win_) ==
             MPI_SUCCESS;
    MPI_Info_free(&info);
    MPI_Comm_set_errhandler(comm, fatal);
    MPI_Errhandler_free(&fatal);
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
    if (!all) return false;  // a window made by some members is left to MPI_Finalize
    for (int q = 0; q < size_; ++q) {
      MPI_Aint bytes = 0;
      int unit = 0;
      void* at = nullptr;
      MPI_Win_shared_query(win_, q, &bytes, &unit, &at);
      segs_[static_cast<std::size_t>(q)] = static_cast<char*>(at);
    }
    return true;
  }
  // A POSIX shared-memory file of every member's segment (whole pages each); false on every
  // member where it cannot be made or is not shared. Unlinked once all mapped it.
  bool posix(MPI_Comm comm) {
    static std::atomic<unsigned> made{0};
    const std::size_t per = (kHeaderBytes + stage_bytes_ + 4095) / 4096 * 4096, total = per * static_cast<std::size_t>(size_);
    struct {
      char name[56];
      std::uint64_t token;
    } id{};
    if (rank_ == 0) {
      std::snprintf(id.name, sizeof id.name, "/meshtrain-%d-%u", static_cast<int>(getpid()), made.fetch_add(1));
      id.token = (static_cast<std::uint64_t>(getpid()) << 32) ^ static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
    }
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
    int fd = -1, ok = 1;
    if (rank_ == 0) {
      fd = shm_open(id.name, O_CREAT | O_EXCL | O_RDWR, 0600);
      ok = fd >= 0 && ftruncate(fd, static_cast<off_t>(total)) == 0;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (ok && rank_ != 0) ok = (fd = shm_open(id.name, O_RDWR, 0)) >= 0;
    void* base = ok ? mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd);
    ok = base != MAP_FAILED;
    if (ok && rank_ == 0) std::memcpy(static_cast<char*>(base) + kHeaderBytes - 8, &id.token, 8);
    MPI_Barrier(comm);
    std::uint64_t seen = 0;
    if (ok) std::memcpy(&seen, static_cast<char*>(base) + kHeaderBytes - 8, 8);
    int mine = ok && seen == id.token, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm);
    if (rank_ == 0 && fd >= 0) shm_unlink(id.name);
    if (!all) {
      if (ok) munmap(base, total);
      return false;
    }
    for (int q = 0; q < size_; ++q) segs_[static_cast<std::size_t>(q)] = static_cast<char*>(base) + per * static_cast<std::size_t>(q);
    return true;
  }

  int rank_, size_;
  std::size_t stage_bytes_;
  std::vector<char*> segs_;
  MPI_Win win_ = MPI_WIN_NULL;
  bool ok_ = false;
};

// Whether every process of `comm` is on one host (false when the hosts are not known).
bool on_one_host(MPI_Comm comm, int size) {
  if (g_hosts.empty() || size < 2) return false;
  if (const char* s = std::getenv("MESHTRAIN_COMM_MPI_SHM"); s && std::strcmp(s, "0") == 0) return false;
  std::lock_guard g(g_mpi);
  MPI_Group mine, world;
  MPI_Comm_group(comm, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> in(static_cast<std::size_t>(size)), out(static_cast<std::size_t>(size), MPI_UNDEFINED);
  for (int i = 0; i < size; ++i) in[static_cast<std::size_t>(i)] = i;
  MPI_Group_translate_ranks(mine, size, in.data(), world, out.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  for (int w : out)
    if (w < 0 || w >= static_cast<int>(g_hosts.size()) || g_hosts[static_cast<std::size_t>(w)] != g_hosts[static_cast<std::size_t>(out[0])])
      return false;
  return true;
}

// ---- MpiTransport ----
class MpiTransport final : public Transport {
 public:
  // Collective over `comm` (the shared window).
  explicit MpiTransport(MPI_Comm comm, std::size_t stage_bytes = kStageBytes) : comm_(comm), pool_(std::make_shared<Pool>()) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (on_one_host(comm_, size_)) {
      shared_ = std::make_unique<MpiShared>(comm_, rank_, size_, stage_bytes);
      if (!shared_->ok()) shared_.reset();
    }
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !g_failed.load()) {
      std::lock_guard g(g_mpi);
      MPI_Comm_free(&comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  RequestPtr isend(int peer, int tag, const void* buf, std::size_t bytes) override {
    auto r = std::make_unique<MpiRequest>(peer, nullptr);
    std::lock_guard g(g_mpi);
    MPI_Isend(buf, as_int(bytes), MPI_BYTE, peer, tag, comm_, &r->req_);
    return r;
  }
  RequestPtr irecv(int peer, int tag, void* buf, std::size_t bytes, bool) override {
    auto r = std::make_unique<MpiRequest>(peer, nullptr);
    std::lock_guard g(g_mpi);
    MPI_Irecv(buf, as_int(bytes), MPI_BYTE, peer, tag, comm_, &r->req_);
    return r;
  }
  RequestPtr irecv_reduce(int peer, int tag, void* inout, std::size_t count, DType t, ReduceOp op) override {
    auto r = std::make_unique<MpiRequest>(peer, pool_);
    const std::size_t bytes = count * dtype_size(t);
    r->scratch_ = pool_->take(bytes);
    r->target_ = inout;
    r->count_ = count;
    r->type_ = t;
    r->op_ = op;
    std::lock_guard g(g_mpi);
    MPI_Irecv(r->scratch_.data(), as_int(bytes), MPI_BYTE, peer, tag, comm_, &r->req_);
    return r;
  }

  std::unique_ptr<Transport> split(const std::vector<int>& members, int color, std::uint64_t id) override {
    return split_shared(members, color, id, kStageBytes);
  }
  std::unique_ptr<Transport> split_shared(const std::vector<int>& members, int color, std::uint64_t,
                                          std::size_t stage_bytes) override {
    int key = 0;
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank_) key = static_cast<int>(i);
    MPI_Comm child = MPI_COMM_NULL;
    {
      std::lock_guard g(g_mpi);
      MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child);
    }
    if (color < 0) return nullptr;
    return std::make_unique<MpiTransport>(child, std::max(stage_bytes, kStageBytes));
  }

  void waiting(const char* op, const std::string& group, std::uint64_t seq, int peer) override {
    if (!op) {
      g_activity_slot.store(-1);
      return;
    }
    const int slot = g_activity_slot.load() == 0 ? 1 : 0;
    g_activity[slot] = {op, group.c_str(), static_cast<unsigned long long>(seq), peer};
    g_activity_slot.store(slot);
  }

  void abort(const std::string& reason) override {
    g_failed = true;
    send_notice(reason);
  }
  SharedMemory* shared_memory() override { return shared_.get(); }

  void note_silent(const std::vector<int>& ranks) override {
    std::lock_guard g(g_mpi);
    MPI_Group mine, world;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> in(ranks.begin(), ranks.end()), out(ranks.size(), MPI_UNDEFINED);
    MPI_Group_translate_ranks(mine, static_cast<int>(in.size()), in.data(), world, out.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    g_silent.resize(static_cast<std::size_t>(g_world_size), 0);
    for (int w : out)
      if (w >= 0 && w < g_world_size) g_silent[static_cast<std::size_t>(w)] = 1;
  }

  NativeResult native(const NativeCall& c, Clock::time_point deadline) override {
    MPI_Request req = MPI_REQUEST_NULL;
    const MPI_Datatype t = mpi_type(c.dtype);
    {
      std::lock_guard g(g_mpi);
      switch (c.kind) {
        case OpKind::all_reduce:
          MPI_Iallreduce(c.in == c.out ? MPI_IN_PLACE : c.in, c.out, as_int(c.count), t, mpi_op(c.op), comm_, &req);
          break;
        case OpKind::reduce_scatter: {
          ints_.assign(c.counts->begin(), c.counts->end());
          MPI_Ireduce_scatter(c.in, c.out, ints_.data(), t, mpi_op(c.op), comm_, &req);
          break;
        }
        case OpKind::all_gather: {
          ints_.assign(c.counts->begin(), c.counts->end());
          displs_.assign(size_, 0);
          for (int i = 1; i < size_; ++i) displs_[i] = displs_[i - 1] + ints_[i - 1];
          MPI_Iallgatherv(c.in, as_int(c.count), t, c.out, ints_.data(), displs_.data(), t, comm_, &req);
          break;
        }
        case OpKind::broadcast:
          MPI_Ibcast(c.out, as_int(c.count), t, c.root, comm_, &req);
          break;
        case OpKind::reduce:
          MPI_Ireduce(c.in, rank_ == c.root ? c.out : nullptr, as_int(c.count), t, mpi_op(c.op), c.root, comm_, &req);
          break;
        case OpKind::all_to_all:
          MPI_Ialltoall(c.in, as_int(c.count), t, c.out, as_int(c.count), t, comm_, &req);
          break;
        case OpKind::barrier:
          MPI_Ibarrier(comm_, &req);
          break;
      }
    }
    const bool ok = poll_until([&] {
      int flag = 0;
      std::lock_guard g(g_mpi);
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      return flag != 0;
    }, deadline);
    if (!ok) g_failed = true;  // the request stays pending; the process must abort
    return ok ? NativeResult::done : NativeResult::timeout;
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Pool> pool_;
  std::vector<int> ints_, displs_;
  std::unique_ptr<MpiShared> shared_;  // all members on one host
};

}  // namespace

// ---- hosts ----
// The host of every process: processes with the same host name (MPI_Get_processor_name) and the
// same network namespace are one host, named by the lowest world rank among them. The namespace
// tells apart the hosts made of network namespaces on one machine (tests/hosts), whose host
// names agree. One MPI_Allgather over MPI_COMM_WORLD, once, when the world is made. (A first
// version asked MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); OpenMPI 4.1.4 crashed in its first
// collective on that communicator with two ranks in each of two namespace hosts.)
static std::vector<int> mpi_hosts() {
  constexpr int kKey = MPI_MAX_PROCESSOR_NAME + 64;
  char key[kKey] = {};
  int len = 0;
  std::lock_guard g(g_mpi);
  MPI_Get_processor_name(key, &len);
  char ns[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  if (n > 0) std::snprintf(key + len, kKey - len, " %s", ns);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(static_cast<std::size_t>(size) * kKey);
  MPI_Allgather(key, kKey, MPI_CHAR, all.data(), kKey, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<int> hosts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    int first = 0;
    while (std::memcmp(&all[static_cast<std::size_t>(first) * kKey], &all[static_cast<std::size_t>(r) * kKey], kKey) != 0) ++first;
    hosts[static_cast<std::size_t>(r)] = first;
  }
  return hosts;
}

// The link between hosts `auto` assumes under mpirun (hier against the flat algorithms): TCP on
// 10 Gbit/s Ethernet, 50 us a message. An assumption, not a measurement; --allreduce chooses
// explicitly.
constexpr CostParams kTcpLink{50e-6, 1.0 / 1.25e9, 1.0 / 10.0e9};

// ---- entry points (world.h) ----
bool have_mpi() { return true; }

std::shared_ptr<Communicator> mpi_world(const Communicator::Config& cfg) {
  ensure_init();
  static std::shared_ptr<Communicator> world = [&] {
    std::vector<int> hosts = mpi_hosts();
    g_hosts = hosts;
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    auto w = std::make_shared<Communicator>(std::make_shared<MpiTransport>(dup), "world", cfg);
    if (std::count(hosts.begin(), hosts.end(), 0) != static_cast<long>(hosts.size()))
      w->set_hosts(std::move(hosts), kTcpLink);
    return w;
  }();
  return world;
}

void mpi_report_failure(const std::string& reason) {
  ensure_init();
  g_failed = true;
  send_notice(reason);
}

void mpi_abort(int code) {
  ensure_init();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace meshtrain::comm
