// Point-to-point send and receive of a Communicator: posted at once on the transport (not
// through the collective queue), completed by Work::wait / is_completed, which turn a missed
// deadline or a dead peer into a CommError naming "send"/"recv", the group, the per-communicator
// point-to-point sequence number and the peer.
#include <sstream>

#include "meshtrain/comm/communicator.h"

namespace meshtrain::comm {

namespace {
class P2PWork final : public WorkImpl {
 public:
  P2PWork(std::shared_ptr<Transport> t, RequestPtr r, const char* op, std::string group, std::uint64_t seq,
          int peer, Timeout timeout, std::shared_ptr<StatsCounters> stats)
      : t_(std::move(t)), r_(std::move(r)), op_(op), group_(std::move(group)), seq_(seq), peer_(peer),
        timeout_(timeout), stats_(std::move(stats)) {}
  ~P2PWork() override {
    std::lock_guard lk(m_);
    r_.reset();  // cancels a pending request before the transport goes
  }

  bool test() override {
    std::lock_guard lk(m_);
    if (done_) return true;
    try {
      if (r_->test()) done_ = true;
    } catch (const PeerFailure& e) {
      record(e);
    }
    return done_;
  }
  std::exception_ptr error() override {
    test();
    std::lock_guard lk(m_);
    return err_;
  }
  void wait(Timeout t) override {
    std::lock_guard lk(m_);
    if (!done_) {
      const auto t0 = Clock::now();
      bool ok = false;
      try {
        ok = r_->wait_until(t0 + (t.count() > 0 ? t : timeout_));
      } catch (const PeerFailure& e) {
        record(e);
        ok = true;
      }
      stats_->wait_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
      if (!ok) {
        std::ostringstream why;
        why << "no matching " << (op_[0] == 's' ? "receive" : "send") << " from rank " << peer_ << " within "
            << (t.count() > 0 ? t : timeout_).count() << " ms";
        // The peer may itself have been waiting for a rank busy outside communication: blame that one.
        std::vector<int> late = t_->late_ranks(peer_);
        if (late != std::vector<int>{peer_})
          why << "; rank " << peer_ << " was itself waiting for " << format_ranks(late)
              << ", which did not post its side (busy outside communication)";
        throw CommError(ErrorKind::timeout, op_, group_, seq_, std::move(late), why.str());
      }
      done_ = true;
    }
    if (err_) std::rethrow_exception(err_);
  }

 private:
  void record(const PeerFailure& e) {
    done_ = true;
    err_ = std::make_exception_ptr(CommError(ErrorKind::peer_failed, op_, group_, seq_, e.ranks, e.what()));
  }
  std::shared_ptr<Transport> t_;
  RequestPtr r_;
  const char* op_;
  std::string group_;
  std::uint64_t seq_;
  int peer_;
  Timeout timeout_;
  std::shared_ptr<StatsCounters> stats_;
  std::mutex m_;
  bool done_ = false;
  std::exception_ptr err_;
};
}  // namespace

// ---- send / recv ----
Work Communicator::isend_v(ConstView in, int dst, const P2POptions& o, bool blocking) {
  (void)blocking;
  if (dst < 0 || dst >= size_) usage("send", "destination " + std::to_string(dst) + " is not a rank of the group");
  if (o.tag < 0 || o.tag > kMaxUserTag) usage("send", "tag " + std::to_string(o.tag) + " is outside [0, 2^24)");
  const std::size_t bytes = in.count * dtype_size(in.type);
  std::uint64_t seq;
  {
    std::lock_guard lk(qm_);
    seq = p2p_seq_++;
  }
  stats_->ops.fetch_add(1);
  stats_->bytes_sent.fetch_add(bytes);
  if (!hosts_.empty() && hosts_[dst] != hosts_[rank_]) stats_->bytes_sent_cross_host.fetch_add(bytes);
  RequestPtr r = t_->isend(dst, o.tag, in.data, bytes);
  return Work(std::make_shared<P2PWork>(t_, std::move(r), "send", name_, seq, dst,
                                        o.timeout.count() > 0 ? o.timeout : timeout_, stats_));
}

Work Communicator::irecv_v(MutView out, int src, const P2POptions& o, bool blocking) {
  (void)blocking;
  if (src < 0 || src >= size_) usage("recv", "source " + std::to_string(src) + " is not a rank of the group");
  if (o.tag < 0 || o.tag > kMaxUserTag) usage("recv", "tag " + std::to_string(o.tag) + " is outside [0, 2^24)");
  const std::size_t bytes = out.count * dtype_size(out.type);
  std::uint64_t seq;
  {
    std::lock_guard lk(qm_);
    seq = p2p_seq_++;
  }
  stats_->ops.fetch_add(1);
  stats_->bytes_received.fetch_add(bytes);
  RequestPtr r = t_->irecv(src, o.tag, out.data, bytes, /*collective_mode=*/false);
  return Work(std::make_shared<P2PWork>(t_, std::move(r), "recv", name_, seq, src,
                                        o.timeout.count() > 0 ? o.timeout : timeout_, stats_));
}

}  // namespace meshtrain::comm
