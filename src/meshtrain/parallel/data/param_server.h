// Parameter server: the protocol between worker ranks (compute gradients, push them, pull
// parameters) and server ranks (each owns one contiguous shard of the flattened parameters and
// applies the updates), with a staleness bound. The optimizer itself is the caller's (a
// ShardUpdate callback; train/ps_trainer.cpp runs AdamW over the shard), so this file knows
// nothing of models.
//
// Ranks of the world: workers 0..W-1, servers W..W+S-1. Shard j is the flat elements
// [off[j], off[j] + n[j]) with n[j] = numel / S + (j < numel % S).
//
// Rounds. A server collects pushes into an open round and closes it when it holds W pushes
// (one optimizer step of W * rows samples, the same amount as one synchronous step), or
// earlier when every active worker is blocked waiting for it (so a bound smaller than W - 1,
// or the end of the run, never deadlocks). Closing sums the pushes in (clock, worker) order,
// divides by their number, and calls the update with the round's index (the schedule's step).
// With staleness 0 a round is exactly the W pushes of one clock, so the update equals
// all-reduce data parallelism's.
//
// Staleness rule (stale synchronous parallel, Ho et al. 2013): a worker about to compute its
// step c (clock c, having pushed c gradients) gets the parameters only when, for every active
// worker v, applied(v) >= c - s, where applied(v) counts v's pushes already inside closed
// rounds: the values it reads include every update of clocks <= c - s - 1, and no worker runs
// more than s steps ahead of the slowest. s = 0: bulk-synchronous; s < 0: asynchronous (reads
// never wait). A worker that finished does not hold others back.
//
// Budget: server 0 grants reads; after `budget` grants it answers "done", so a run consumes a
// fixed number of pushes however they split between fast and slow workers. A worker asks
// server 0 first and the other servers only after a grant.
//
// Clipping: with staleness 0 the caller's update clips by the global norm of the averaged
// gradient (servers sum their partial squares); otherwise rounds mix gradients from different
// parameter versions, so each push is clipped by its own norm (the worker sends it) to
// `push_clip` before it is averaged.
//
// Deadlines (DESIGN decision 7): every worker wait uses the communicator's timeout; a server
// that hears nothing from its active workers for that long throws a CommError naming them.
// Concurrency: each object belongs to its rank's thread. Messages use user tags 0x5000-0x5004.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "meshtrain/comm/communicator.h"

namespace meshtrain::parallel {

// ---- layout ----
struct PSLayout {
  int workers = 1, servers = 1;
  int64_t numel = 0;
  std::vector<int64_t> off, n;  // per server
  static PSLayout make(int workers, int servers, int64_t numel);
  int server_rank(int j) const { return workers + j; }
};

// One closed round of a server (server 0 sends its rounds to worker 0 for the metrics).
struct PSRound {
  int64_t round = 0;
  double loss = 0;       // mean of the pushes' losses
  double grad_norm = 0;  // staleness 0: global norm of the average; else mean of the pushes' norms
  double lr = 0;
  int64_t pushes = 0;
  int64_t staleness = 0;  // the most rounds applied between a push's read and its application
  double t_s = 0;         // seconds since the server started serving
};

// A read granted by server 0 (the staleness test checks `ahead` <= s).
struct PSRead {
  int worker = 0;
  int64_t clock = 0;
  int64_t ahead = 0;  // clock minus the pushes of the slowest other active worker
};

struct PSServerOptions {
  int64_t staleness = 0;  // -1: unbounded
  int64_t budget = 0;     // reads server 0 grants in all
  float push_clip = 0;    // > 0: clip each push to this norm before averaging
  // Called on the server's thread when the staleness rule first holds back a worker's read
  // (once per read; `ahead` as in PSRead, from pushes received so far). Optional; lets a test
  // or a report see the bound act instead of inferring it from timings.
  std::function<void(const PSRead&)> on_hold = nullptr;
};

// The optimizer step of a round: `grad` (the server's grad span) holds the round's average;
// update the values in place. Returns the gradient norm it saw and the learning rate.
struct PSUpdate {
  double grad_norm = 0, lr = 0;
};
using ShardUpdate = std::function<PSUpdate(int64_t round)>;

// ---- server ----
class ParameterServer {
 public:
  // `values` (n[index]) start as the shard's initial values; `grad` (n[index]) is where rounds
  // put their average for `update`. Both must outlive the server.
  ParameterServer(comm::Communicator& world, const PSLayout& layout, int index, std::span<float> values,
                  std::span<float> grad, PSServerOptions opt, ShardUpdate update);
  ~ParameterServer();
  // Serves until every worker said done and every final read was answered.
  void serve();

  const std::vector<PSRead>& reads() const { return reads_; }
  const std::vector<int64_t>& pushes() const { return pushed_; }
  int64_t rounds() const { return version_; }

 private:
  struct Peer;
  struct Push;
  void post(int w);
  void handle(int w);
  bool answer_pulls();
  bool ready(int w, int64_t clock) const;
  int64_t ahead(int w, int64_t clock) const;
  bool maybe_close_round();
  bool answer_final();
  void reply(int w, int status);
  bool finished() const;

  comm::Communicator& world_;
  PSLayout layout_;
  int index_;
  std::span<float> values_, grad_;
  PSServerOptions opt_;
  ShardUpdate update_;
  std::vector<Peer> peers_;
  std::vector<int64_t> pushed_, applied_;
  std::vector<Push> open_;
  std::vector<PSRound> rounds_;  // server 0: not yet sent to worker 0
  std::vector<PSRead> reads_;
  int64_t version_ = 0, granted_ = 0;
  comm::Clock::time_point t0_;
};

// ---- worker ----
class PSWorker {
 public:
  PSWorker(comm::Communicator& world, const PSLayout& layout, int worker);
  ~PSWorker();
  // Reads the parameters for step `clock` into `values` (numel), waiting as the staleness
  // rule says. False: the sample budget is spent (call finish()).
  bool pull(int64_t clock, std::span<float> values);
  // Sends step `clock`'s gradient (numel). Returns at once; `grads` must stay untouched until
  // the next pull() or finish() returns.
  void push(int64_t clock, std::span<const float> grads, double loss, double grad_sq);
  // Tells the servers this worker is done. With `values` (numel) non-empty, waits until every
  // round is applied and reads the final parameters.
  void finish(std::span<float> values);
  // Rounds server 0 reported so far (worker 0 only); the caller takes them.
  std::vector<PSRound> take_rounds();
  // Staleness bound gap of the last granted read (clock minus the slowest other's pushes).
  int64_t last_ahead() const { return last_ahead_; }

 private:
  struct Server;
  int recv_reply(int j, std::span<float> values);
  void wait_pushes();

  comm::Communicator& world_;
  PSLayout layout_;
  int worker_;
  std::vector<Server> servers_;
  std::vector<PSRound> rounds_;
  int64_t last_ahead_ = 0;
  bool finished_ = false;
};

}  // namespace meshtrain::parallel
