// Parameter server protocol (see param_server.h for the rules).
//
// Wire format. Every request is a header of 8 doubles (tag kTagRequest) followed, for a push,
// by the shard's gradient (n[j] floats, tag kTagGrad). Every answer is a header of 8 doubles
// (tag kTagReply), then the shard's values (tag kTagValues) unless it is a refusal, then, from
// server 0 to worker 0, the rounds closed since the last answer (8 doubles each, tag
// kTagRounds). Messages between one pair and one tag match in posting order, so a header is
// always followed by its own payload.
#include "meshtrain/parallel/data/param_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>

namespace meshtrain::parallel {

namespace {

constexpr int kTagRequest = 0x5000, kTagGrad = 0x5001, kTagReply = 0x5002, kTagValues = 0x5003,
              kTagRounds = 0x5004;
// request header: [kind, clock, version read, loss, grad_sq, want_final]
enum Kind { kPush = 1, kPull = 2, kDone = 3 };
// reply header: [status, version, rounds following, ahead]
enum Status { kRefused = 0, kValues = 1, kFinal = 2 };
constexpr int kRoundFields = 7;

using Header = std::array<double, 8>;

}  // namespace

// ---- layout ----

PSLayout PSLayout::make(int workers, int servers, int64_t numel) {
  if (workers < 1 || servers < 1)
    throw std::invalid_argument("a parameter server needs at least one worker and one server (got " +
                                std::to_string(workers) + " and " + std::to_string(servers) + ")");
  if (numel < servers)
    throw std::invalid_argument("cannot cut " + std::to_string(numel) + " parameters into " +
                                std::to_string(servers) + " server shards; use fewer --ps-servers");
  PSLayout l;
  l.workers = workers, l.servers = servers, l.numel = numel;
  int64_t off = 0;
  for (int j = 0; j < servers; ++j) {
    const int64_t n = numel / servers + (j < numel % servers ? 1 : 0);
    l.off.push_back(off), l.n.push_back(n);
    off += n;
  }
  return l;
}

// ---- server ----

struct ParameterServer::Peer {
  Header req{};
  comm::Work req_work;
  bool done = false, want_final = false, final_sent = false;
  int64_t pull_clock = -1;  // pending read (-1: none)
  bool hold_reported = false;  // on_hold was called for the pending read
  Header rep{};
  std::vector<float> vals;
  std::vector<double> rounds;
  comm::Work rep_work, vals_work, rounds_work;
  void wait_replies() {
    rep_work.wait(), vals_work.wait(), rounds_work.wait();
    rep_work = {}, vals_work = {}, rounds_work = {};
  }
};

struct ParameterServer::Push {
  int worker = 0;
  int64_t clock = 0, version = 0;
  double loss = 0, grad_sq = 0;
  std::vector<float> grad;
};

ParameterServer::ParameterServer(comm::Communicator& world, const PSLayout& layout, int index,
                                 std::span<float> values, std::span<float> grad, PSServerOptions opt,
                                 ShardUpdate update)
    : world_(world), layout_(layout), index_(index), values_(values), grad_(grad), opt_(opt),
      update_(std::move(update)), peers_(layout.workers), pushed_(layout.workers, 0),
      applied_(layout.workers, 0) {
  const auto n = static_cast<size_t>(layout_.n.at(index_));
  if (values_.size() != n || grad_.size() != n)
    throw std::invalid_argument("parameter server " + std::to_string(index_) + ": shard buffers hold " +
                                std::to_string(values_.size()) + " and " + std::to_string(grad_.size()) +
                                " elements, the layout says " + std::to_string(n));
  if (world_.rank() != layout_.server_rank(index_))
    throw std::invalid_argument("parameter server " + std::to_string(index_) + " must run on rank " +
                                std::to_string(layout_.server_rank(index_)) + ", not " +
                                std::to_string(world_.rank()));
}

ParameterServer::~ParameterServer() {
  for (auto& p : peers_) {
    try {
      p.wait_replies();
    } catch (...) {
    }
  }
}

void ParameterServer::post(int w) {
  peers_[w].req_work = world_.irecv(peers_[w].req, w, {.tag = kTagRequest});
}

void ParameterServer::serve() {
  t0_ = comm::Clock::now();
  for (int w = 0; w < layout_.workers; ++w) post(w);
  auto last = comm::Clock::now();
  int idle = 0;
  while (!finished()) {
    bool progressed = false;
    for (int w = 0; w < layout_.workers; ++w) {
      Peer& p = peers_[w];
      if (p.done || !p.req_work.is_completed()) continue;
      p.req_work.wait();  // rethrows a failed peer as a CommError
      handle(w);
      if (!p.done) post(w);
      // A full round closes before the next push, so no round holds more than W.
      if (static_cast<int>(open_.size()) >= layout_.workers) maybe_close_round();
      progressed = true;
    }
    progressed |= answer_pulls();
    if (maybe_close_round()) progressed = true, answer_pulls();
    progressed |= answer_final();
    if (progressed) {
      last = comm::Clock::now(), idle = 0;
      continue;
    }
    if (comm::Clock::now() - last > world_.timeout()) {
      // Silent: the active workers not waiting for a read (they did not send their next
      // request); a worker whose read this server holds back is waiting, not late.
      std::vector<int> silent, active;
      for (int w = 0; w < layout_.workers; ++w)
        if (!peers_[w].done) {
          active.push_back(w);
          if (peers_[w].pull_clock < 0) silent.push_back(w);
        }
      if (silent.empty()) silent = active;
      throw comm::CommError(comm::ErrorKind::timeout, "ps_serve", world_.name(), static_cast<uint64_t>(version_),
                            silent,
                            "parameter server " + std::to_string(index_) + " heard no request within " +
                                std::to_string(world_.timeout().count()) + " ms (round " +
                                std::to_string(version_) + ", " + std::to_string(open_.size()) +
                                " pushes open)");
    }
    // Poll gently: the server shares cores with the workers it waits for.
    if (++idle > 64) std::this_thread::sleep_for(std::chrono::microseconds(idle > 1000 ? 200 : 50));
    else std::this_thread::yield();
  }
  for (auto& p : peers_) p.wait_replies();
}

bool ParameterServer::finished() const {
  if (!open_.empty()) return false;
  for (auto& p : peers_)
    if (!p.done || (p.want_final && !p.final_sent)) return false;
  return true;
}

void ParameterServer::handle(int w) {
  Peer& p = peers_[w];
  const Header h = p.req;
  const int kind = static_cast<int>(h[0]);
  if (kind == kPush) {
    Push push;
    push.worker = w;
    push.clock = static_cast<int64_t>(h[1]);
    push.version = static_cast<int64_t>(h[2]);
    push.loss = h[3], push.grad_sq = h[4];
    push.grad.resize(static_cast<size_t>(layout_.n[index_]));
    world_.recv(push.grad, w, {.tag = kTagGrad});
    open_.push_back(std::move(push));
    ++pushed_[w];
  } else if (kind == kPull) {
    p.pull_clock = static_cast<int64_t>(h[1]);
    p.hold_reported = false;
  } else if (kind == kDone) {
    p.done = true;
    p.want_final = h[5] != 0;
    p.pull_clock = -1;
  } else {
    throw std::runtime_error("parameter server " + std::to_string(index_) + ": worker " + std::to_string(w) +
                             " sent an unknown request kind " + std::to_string(kind));
  }
}

// ---- staleness rule and reads ----

bool ParameterServer::ready(int w, int64_t clock) const {
  if (opt_.staleness < 0) return true;
  for (int v = 0; v < layout_.workers; ++v)
    if (!peers_[v].done && applied_[v] < clock - opt_.staleness) return false;
  return true;
}

int64_t ParameterServer::ahead(int w, int64_t clock) const {
  int64_t slowest = -1;
  for (int v = 0; v < layout_.workers; ++v)
    if (v != w && !peers_[v].done) slowest = slowest < 0 ? pushed_[v] : std::min(slowest, pushed_[v]);
  return slowest < 0 ? 0 : clock - slowest;
}

bool ParameterServer::answer_pulls() {
  bool any = false;
  const bool lead = index_ == 0;
  for (int w = 0; w < layout_.workers; ++w) {
    Peer& p = peers_[w];
    if (p.done || p.pull_clock < 0) continue;
    if (lead && granted_ >= opt_.budget) {
      reply(w, kRefused);
    } else if (ready(w, p.pull_clock)) {
      const int64_t a = ahead(w, p.pull_clock);
      if (lead) ++granted_, reads_.push_back({w, p.pull_clock, a});
      p.rep[3] = static_cast<double>(a);
      reply(w, kValues);
    } else {
      if (!p.hold_reported && opt_.on_hold) opt_.on_hold({w, p.pull_clock, ahead(w, p.pull_clock)});
      p.hold_reported = true;
      continue;
    }
    p.pull_clock = -1;
    p.hold_reported = false;
    any = true;
  }
  return any;
}

void ParameterServer::reply(int w, int status) {
  Peer& p = peers_[w];
  p.wait_replies();  // the worker took the previous answer before asking again
  p.rep[0] = status;
  p.rep[1] = static_cast<double>(version_);
  p.rep[2] = 0;
  if (status == kFinal) p.rep[3] = 0;
  p.rounds.clear();
  if (index_ == 0 && w == 0) {
    for (const PSRound& r : rounds_)
      p.rounds.insert(p.rounds.end(), {static_cast<double>(r.round), r.loss, r.grad_norm, r.lr,
                                       static_cast<double>(r.pushes), static_cast<double>(r.staleness), r.t_s});
    p.rep[2] = static_cast<double>(rounds_.size());
    rounds_.clear();
  }
  p.rep_work = world_.isend(p.rep, w, {.tag = kTagReply});
  if (status != kRefused) {
    p.vals.assign(values_.begin(), values_.end());  // the values may change before the send completes
    p.vals_work = world_.isend(p.vals, w, {.tag = kTagValues});
  }
  if (!p.rounds.empty()) p.rounds_work = world_.isend(p.rounds, w, {.tag = kTagRounds});
}

bool ParameterServer::answer_final() {
  if (!open_.empty()) return false;
  for (auto& p : peers_)
    if (!p.done) return false;
  bool any = false;
  for (int w = 0; w < layout_.workers; ++w) {
    Peer& p = peers_[w];
    if (!p.want_final || p.final_sent) continue;
    reply(w, kFinal);
    p.final_sent = true;
    any = true;
  }
  return any;
}

// ---- rounds ----

bool ParameterServer::maybe_close_round() {
  if (open_.empty()) return false;
  if (static_cast<int>(open_.size()) < layout_.workers) {
    // Close early only when every active worker waits for this round (or none is left).
    for (auto& p : peers_)
      if (!p.done && p.pull_clock < 0) return false;
  }
  std::sort(open_.begin(), open_.end(), [](const Push& a, const Push& b) {
    return a.clock != b.clock ? a.clock < b.clock : a.worker < b.worker;
  });
  const size_t n = grad_.size();
  PSRound r;
  r.round = version_;
  r.pushes = static_cast<int64_t>(open_.size());
  for (size_t k = 0; k < open_.size(); ++k) {
    const Push& p = open_[k];
    const double norm = std::sqrt(p.grad_sq);
    float scale = 1.f;
    if (opt_.push_clip > 0 && norm > opt_.push_clip) scale = static_cast<float>(opt_.push_clip / norm);
    const float* g = p.grad.data();
    if (k == 0) {
      for (size_t i = 0; i < n; ++i) grad_[i] = scale * g[i];
    } else {
      for (size_t i = 0; i < n; ++i) grad_[i] += scale * g[i];
    }
    r.loss += p.loss / static_cast<double>(open_.size());
    r.grad_norm += norm / static_cast<double>(open_.size());
    r.staleness = std::max(r.staleness, version_ - p.version);
    ++applied_[p.worker];
  }
  const float inv = 1.f / static_cast<float>(open_.size());
  for (size_t i = 0; i < n; ++i) grad_[i] *= inv;
  PSUpdate u = update_(version_);
  if (opt_.staleness == 0) r.grad_norm = u.grad_norm;
  r.lr = u.lr;
  ++version_;
  r.t_s = std::chrono::duration<double>(comm::Clock::now() - t0_).count();
  if (index_ == 0) rounds_.push_back(r);
  open_.clear();
  return true;
}

// ---- worker ----

struct PSWorker::Server {
  Header push_hdr{}, ctl_hdr{}, rep{};
  comm::Work push_hdr_work, push_work, ctl_work;
  int64_t version = 0;  // rounds applied when this worker last read the shard
};

PSWorker::PSWorker(comm::Communicator& world, const PSLayout& layout, int worker)
    : world_(world), layout_(layout), worker_(worker), servers_(layout.servers) {
  if (world_.size() != layout_.workers + layout_.servers)
    throw std::invalid_argument("the world has " + std::to_string(world_.size()) + " ranks but " +
                                std::to_string(layout_.workers) + " workers and " +
                                std::to_string(layout_.servers) + " servers need " +
                                std::to_string(layout_.workers + layout_.servers));
}

PSWorker::~PSWorker() {
  for (auto& s : servers_) {
    try {
      s.push_hdr_work.wait(), s.push_work.wait(), s.ctl_work.wait();
    } catch (...) {
    }
  }
}

int PSWorker::recv_reply(int j, std::span<float> values) {
  Server& s = servers_[j];
  const int src = layout_.server_rank(j);
  world_.recv(s.rep, src, {.tag = kTagReply});
  const int status = static_cast<int>(s.rep[0]);
  if (status != kRefused) {
    s.version = static_cast<int64_t>(s.rep[1]);
    world_.recv(values.subspan(layout_.off[j], layout_.n[j]), src, {.tag = kTagValues});
  }
  if (j == 0) last_ahead_ = static_cast<int64_t>(s.rep[3]);
  const auto nr = static_cast<size_t>(s.rep[2]);
  if (nr > 0) {
    std::vector<double> buf(nr * kRoundFields);
    world_.recv(buf, src, {.tag = kTagRounds});
    for (size_t i = 0; i < nr; ++i) {
      const double* f = buf.data() + i * kRoundFields;
      rounds_.push_back({static_cast<int64_t>(f[0]), f[1], f[2], f[3], static_cast<int64_t>(f[4]),
                         static_cast<int64_t>(f[5]), f[6]});
    }
  }
  return status;
}

bool PSWorker::pull(int64_t clock, std::span<float> values) {
  if (static_cast<int64_t>(values.size()) != layout_.numel)
    throw std::invalid_argument("pull: the buffer holds " + std::to_string(values.size()) +
                                " values, the model " + std::to_string(layout_.numel));
  auto ask = [&](int j) {
    Server& s = servers_[j];
    s.ctl_work.wait();
    s.ctl_hdr = {kPull, static_cast<double>(clock), 0, 0, 0, 0, 0, 0};
    s.ctl_work = world_.isend(s.ctl_hdr, layout_.server_rank(j), {.tag = kTagRequest});
  };
  ask(0);  // server 0 grants or refuses
  if (recv_reply(0, values) == kRefused) return false;
  for (int j = 1; j < layout_.servers; ++j) ask(j);
  for (int j = 1; j < layout_.servers; ++j) recv_reply(j, values);
  wait_pushes();  // a server answers only after it took this worker's previous push
  return true;
}

void PSWorker::push(int64_t clock, std::span<const float> grads, double loss, double grad_sq) {
  if (static_cast<int64_t>(grads.size()) != layout_.numel)
    throw std::invalid_argument("push: the gradient holds " + std::to_string(grads.size()) +
                                " values, the model " + std::to_string(layout_.numel));
  wait_pushes();
  for (int j = 0; j < layout_.servers; ++j) {
    Server& s = servers_[j];
    const int dst = layout_.server_rank(j);
    s.push_hdr = {kPush, static_cast<double>(clock), static_cast<double>(s.version), loss, grad_sq, 0, 0, 0};
    s.push_hdr_work = world_.isend(s.push_hdr, dst, {.tag = kTagRequest});
    s.push_work = world_.isend(grads.subspan(layout_.off[j], layout_.n[j]), dst, {.tag = kTagGrad});
  }
}

void PSWorker::wait_pushes() {
  for (auto& s : servers_) {
    s.push_hdr_work.wait(), s.push_work.wait();
    s.push_hdr_work = {}, s.push_work = {};
  }
}

void PSWorker::finish(std::span<float> values) {
  if (finished_) return;
  finished_ = true;
  const bool want = !values.empty();
  for (int j = 0; j < layout_.servers; ++j) {
    Server& s = servers_[j];
    s.ctl_work.wait();
    s.ctl_hdr = {kDone, 0, 0, 0, 0, want ? 1.0 : 0.0, 0, 0};
    s.ctl_work = world_.isend(s.ctl_hdr, layout_.server_rank(j), {.tag = kTagRequest});
  }
  wait_pushes();
  if (want)
    for (int j = 0; j < layout_.servers; ++j)
      if (recv_reply(j, values) != kFinal)
        throw std::runtime_error("parameter server " + std::to_string(j) + " answered worker " +
                                 std::to_string(worker_) + "'s last read without the final values");
  for (auto& s : servers_) s.ctl_work.wait(), s.ctl_work = {};
}

std::vector<PSRound> PSWorker::take_rounds() {
  std::vector<PSRound> out;
  out.swap(rounds_);
  return out;
}

}  // namespace meshtrain::parallel
