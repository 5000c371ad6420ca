#include "meshtrain/pipeline/executor.h"

#include <map>
#include <span>
#include <stdexcept>
#include <utility>

#include "meshtrain/pipeline/passes.h"

namespace meshtrain::pipeline {

namespace {
using Clock = std::chrono::steady_clock;
using Key = std::pair<int, int64_t>;  // (stage, micro-batch counted over steps)

std::span<float> span_of(Tensor& t) { return {t.data(), static_cast<size_t>(t.numel())}; }
std::span<const float> cspan_of(const Tensor& t) { return {t.data(), static_cast<size_t>(t.numel())}; }

std::invalid_argument bad(const std::string& msg) { return std::invalid_argument("pipeline executor: " + msg); }

// Sends in flight, each with the tensor it reads.
using Sends = std::vector<std::pair<comm::Work, Tensor>>;

// Sends whose data has left give their tensors back now rather than at the step's end: a
// tensor kept only for its send (a stage's output that no layer saved) is freed while the step
// goes on, as the memory model counts it. With threads a send completes when the receiver's
// buffer holds the data (at once where the receive was posted first, as the executor posts its
// receives when a step begins); under MPI when the library says so.
void release_sent(Sends& sends) {
  std::erase_if(sends, [](std::pair<comm::Work, Tensor>& s) {
    if (!s.first.is_completed()) return false;
    s.first.wait();  // rethrows the send's error
    return true;
  });
}

// Removes and returns the tensor under k; a missing one is a broken schedule, named by its action.
Tensor take(std::map<Key, Tensor>& from, const Key& k, const Action& a) {
  auto it = from.find(k);
  if (it == from.end())
    throw std::logic_error("pipeline executor: " + to_string(a) + " finds no tensor of stage " +
                           std::to_string(k.first) + " micro-batch " + std::to_string(k.second));
  Tensor t = std::move(it->second);
  from.erase(it);
  return t;
}
}  // namespace

Executor::Executor(Schedule schedule, int rank, comm::Communicator* pp,
                   std::vector<StageRunner*> chunks, int threads, kernels::Precision precision)
    : schedule_(std::move(schedule)), rank_(rank), pp_(pp), chunks_(std::move(chunks)), threads_(threads),
      precision_(precision) {
  const ScheduleShape& s = schedule_.shape;
  if (static_cast<int>(chunks_.size()) != s.chunks)
    throw bad(std::to_string(chunks_.size()) + " chunks given for a schedule of " + std::to_string(s.chunks));
  if (s.pp > 1 && (!pp_ || pp_->size() != s.pp))
    throw bad("a schedule over " + std::to_string(s.pp) + " pipeline ranks needs a pipeline group of that size");
  if (!schedule_.has_comm) schedule_ = add_send_recv(schedule_);
  if (auto f = validate(schedule_)) throw bad("invalid schedule: " + f->problem);
  if (schedule_.period > 0) cut_windows();
  const int64_t tags = int64_t{8} * s.stages() * s.microbatches;
  if (tags > comm::kMaxUserTag - kPipelineTagBase)
    throw bad(std::to_string(s.stages()) + " stages x " + std::to_string(s.microbatches) +
              " micro-batches need more message tags than a communicator has; use fewer micro-batches");
}

// A message's tag: the sending stage, the micro-batch within its step, the kind, and the step's
// parity (asynchronous schedules: step t's messages and step t+1's never match each other).
int Executor::tag(int sender_stage, int64_t mb, Msg kind) const {
  const int64_t m = schedule_.period > 0 ? schedule_.period : schedule_.shape.microbatches;
  int64_t step = 0;
  if (schedule_.period > 0) step = mb >= 0 ? mb / m : -((-mb + m - 1) / m);
  const int64_t local = mb - step * m;
  return kPipelineTagBase + static_cast<int>(((sender_stage * m + local) * 2 + (step & 1)) * 4) + static_cast<int>(kind);
}

// Asynchronous schedules: this rank's unrolled list (kUnrolledSteps steps) cut into its windows.
// Step k's window begins with its first forward F(k m) (and the receive just before it); the
// steady window is step 1's, renumbered as if it were step 0's; the drain is what the last
// unrolled window runs after a steady window's worth of computation, renumbered so that its
// micro-batches are the previous step's (-m .. -1).
void Executor::cut_windows() {
  const std::vector<Action>& list = schedule_.ranks[rank_];
  const int m = schedule_.period;
  auto start_of = [&](int mb) {  // the position where the window of F(mb) begins
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].kind == Kind::F && list[i].microbatch == mb)
        return i > 0 && list[i - 1].kind == Kind::RECV_F && list[i - 1].microbatch == mb ? i - 1 : i;
    throw std::logic_error("pipeline executor: the unrolled schedule has no forward of micro-batch " + std::to_string(mb));
  };
  const size_t c0 = start_of(m), c1 = start_of(2 * m);
  auto shifted = [&](size_t from, size_t to, int by) {
    std::vector<Action> out(list.begin() + static_cast<long>(from), list.begin() + static_cast<long>(to));
    for (Action& a : out) a.microbatch -= by;
    return out;
  };
  first_ = shifted(0, c0, 0);
  steady_ = shifted(c0, c1, m);
  // The last unrolled window: a steady window's computations (with their sends), then the drain.
  const auto computes = std::count_if(steady_.begin(), steady_.end(), [](const Action& a) { return is_compute(a.kind); });
  size_t at = c1;
  for (long seen = 0; at < list.size() && seen < computes; ++at) seen += is_compute(list[at].kind) ? 1 : 0;
  while (at < list.size() && is_send(list[at].kind)) ++at;
  drain_ = shifted(at, list.size(), 3 * m);
  for (const Action& a : steady_)
    if (a.microbatch < -m || a.microbatch >= m || (a.kind == Kind::F && a.microbatch < 0))
      throw std::logic_error("pipeline executor: the steady window holds " + to_string(a));
  for (const Action& a : drain_)
    if (a.microbatch < -m || a.microbatch >= 0 || a.kind == Kind::F || a.kind == Kind::RECV_F || a.kind == Kind::SEND_F)
      throw std::logic_error("pipeline executor: the drain holds " + to_string(a));
}

// ---- one step ----

StepStats Executor::run_step() {
  if (schedule_.period == 0) return run_list(schedule_.ranks[rank_], 0, true);
  const std::vector<Action>& list = flushed_ ? first_ : steady_;
  flushed_ = false;
  return run_list(list, next_batch_++, false);
}

StepStats Executor::drain() {
  if (schedule_.period == 0 || flushed_) return {};
  flushed_ = true;
  return run_list(drain_, next_batch_, true);
}

StepStats Executor::run_list(const std::vector<Action>& list, int64_t batch, bool last_window) {
  const ScheduleShape& s = schedule_.shape;
  const int64_t base = batch * (schedule_.period > 0 ? schedule_.period : 0);  // micro-batch 0's number
  const auto t_step = Clock::now();
  auto us = [&](Clock::time_point t) { return std::chrono::duration<double, std::micro>(t - t_step).count(); };

  // Receives are posted now, all of them, and waited for at their RECV action.
  std::map<Key, Tensor> act_in, grad_in;  // received (or handed over) inputs of F and B
  std::map<Key, comm::Work> recv_f, recv_b;
  for (const Action& a : list) {
    const Key k{a.stage, base + a.microbatch};
    if (a.kind == Kind::RECV_F) {
      Tensor buf = Tensor::empty(chunks_[a.chunk]->input_shape());
      recv_f[k] = pp_->irecv(span_of(buf), s.rank_of(s.prev(a.stage)), {.tag = tag(s.prev(a.stage), k.second, Msg::activation)});
      act_in[k] = buf;
    } else if (a.kind == Kind::RECV_B) {
      Tensor buf = Tensor::empty(chunks_[a.chunk]->output_shape());
      recv_b[k] = pp_->irecv(span_of(buf), s.rank_of(s.next(a.stage)), {.tag = tag(s.next(a.stage), k.second, Msg::gradient)});
      grad_in[k] = buf;
    }
  }
  // Skip connections across stages: the skip tensor of (producing stage, mb) travels to the
  // consuming stage's rank before its F; its gradient back before the producer's B (or I).
  std::map<Key, Tensor> portal_in, portal_grad_in;  // keyed by (this rank's stage, mb)
  std::map<Key, comm::Work> recv_portal, recv_portal_grad;
  StepStats st;
  for (const Action& a : list) {
    const Key k{a.stage, base + a.microbatch};
    StageRunner& c = *chunks_[a.chunk];
    if (a.kind == Kind::F && c.portal_from() >= 0 && s.rank_of(c.portal_from()) != rank_) {
      Tensor buf = Tensor::empty(c.portal_shape());
      recv_portal[k] = pp_->irecv(span_of(buf), s.rank_of(c.portal_from()),
                                  {.tag = tag(c.portal_from(), k.second, Msg::portal)});
      portal_in[k] = buf;
      st.portal_bytes_received += buf.bytes();
    } else if ((a.kind == Kind::B || a.kind == Kind::I) && c.portal_to() >= 0 && s.rank_of(c.portal_to()) != rank_) {
      Tensor buf = Tensor::empty(c.portal_shape());
      recv_portal_grad[k] = pp_->irecv(span_of(buf), s.rank_of(c.portal_to()),
                                       {.tag = tag(c.portal_to(), k.second, Msg::portal_grad)});
      portal_grad_in[k] = buf;
      st.portal_bytes_received += buf.bytes();
    }
  }
  // A skip tensor (or its gradient) leaving stage `from` for stage `to`: sent, or kept for a
  // stage of this rank.
  Sends& sends = sends_;
  auto ship = [&](Tensor t, int from, int to, int64_t mb, Msg kind, std::map<Key, Tensor>& local) {
    if (s.rank_of(to) == rank_) {
      local[{to, mb}] = std::move(t);
      return;
    }
    st.portal_bytes_sent += t.bytes();
    sends.emplace_back(pp_->isend(cspan_of(t), s.rank_of(to), {.tag = tag(from, mb, kind)}), t);
  };

  // The last backward (B, or I and W) of each chunk in this step (data parallelism syncs then).
  std::map<std::pair<int, Kind>, size_t> last_of;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == Kind::B || list[i].kind == Kind::I || list[i].kind == Kind::W)
      last_of[{list[i].chunk, list[i].kind}] = i;
  // An asynchronous window's lists hold the backwards of two steps: the last of a step is its
  // micro-batch m - 1 (numbered -1 when it is the previous step's).
  auto is_last = [&](size_t i) {
    if (schedule_.period > 0) return list[i].microbatch == -1 || list[i].microbatch == schedule_.period - 1;
    return last_of[{list[i].chunk, list[i].kind}] == i;
  };

  std::map<Key, std::unique_ptr<nn::Context>>& live = live_;
  std::map<Key, Tensor> act_out, grad_out;  // outputs waiting for SEND or for the next stage here
  st.start = t_step;
  st.timeline.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const Key k{a.stage, base + a.microbatch};
    const auto t0 = Clock::now();
    switch (a.kind) {
      case Kind::RECV_F: recv_f.at(k).wait(); break;
      case Kind::RECV_B: recv_b.at(k).wait(); break;
      case Kind::SEND_F: {
        Tensor t = take(act_out, k, a);
        sends.emplace_back(pp_->isend(cspan_of(t), s.rank_of(s.next(a.stage)), {.tag = tag(a.stage, k.second, Msg::activation)}), t);
        break;
      }
      case Kind::SEND_B: {
        Tensor t = take(grad_out, k, a);
        sends.emplace_back(pp_->isend(cspan_of(t), s.rank_of(s.prev(a.stage)), {.tag = tag(a.stage, k.second, Msg::gradient)}), t);
        if (i > 0 && list[i - 1].kind == Kind::B)  // the B's own work that waited for this send
          chunks_[a.chunk]->after_backward(a.microbatch);
        break;
      }
      case Kind::F: {
        Tensor input;  // received, or the previous stage's output on this rank
        if (s.prev(a.stage) >= 0) input = act_in.count(k) ? take(act_in, k, a) : take(act_out, {s.prev(a.stage), k.second}, a);
        StageRunner& c = *chunks_[a.chunk];
        nn::Portal portal;
        if (c.portal_from() >= 0) {
          if (recv_portal.count(k)) recv_portal[k].wait();
          portal.in = take(portal_in, k, a);
        }
        auto& ctx = live[k] = std::make_unique<nn::Context>(threads_, /*training=*/true, precision_);
        ctx->weights_epoch = weights_epoch_;
        ctx->grad_slices = grad_slices_;
        ctx->kernel_span = kernel_spans_;
        Tensor out = c.forward(*ctx, a.microbatch, input, portal);
        if (s.next(a.stage) >= 0) act_out[k] = std::move(out);
        if (c.portal_to() >= 0) ship(portal.out, a.stage, c.portal_to(), k.second, Msg::portal, portal_in);
        int64_t saved = 0;
        for (auto& [key, c] : live) saved += c->saved_bytes();
        st.peak_saved_bytes = std::max(st.peak_saved_bytes, saved);
        st.max_in_flight = std::max(st.max_in_flight, static_cast<int>(live.size()));
        break;
      }
      case Kind::B:
      case Kind::I: {
        Tensor dy;  // received, or the next stage's input gradient on this rank
        if (s.next(a.stage) >= 0) dy = grad_in.count(k) ? take(grad_in, k, a) : take(grad_out, {s.next(a.stage), k.second}, a);
        auto it = live.find(k);
        if (it == live.end()) throw std::logic_error("pipeline executor: " + to_string(a) + " before its forward");
        StageRunner& c = *chunks_[a.chunk];
        nn::Portal portal;
        if (c.portal_to() >= 0) {
          if (recv_portal_grad.count(k)) recv_portal_grad[k].wait();
          portal.in = take(portal_grad_in, k, a);
        }
        Tensor dx;
        if (a.kind == Kind::B) {
          dx = c.backward(*it->second, a.microbatch, dy, is_last(i), portal);
          live.erase(it);
        } else {  // the context waits for its W
          dx = c.backward_input(*it->second, a.microbatch, dy, is_last(i), portal);
        }
        if (s.prev(a.stage) >= 0) grad_out[k] = std::move(dx);
        // What the stage does after a backward waits for the gradient's send when one follows.
        const bool sent_next = i + 1 < list.size() && list[i + 1].kind == Kind::SEND_B && list[i + 1].stage == a.stage &&
                               list[i + 1].microbatch == a.microbatch;
        if (a.kind == Kind::B && !sent_next) c.after_backward(a.microbatch);
        if (c.portal_from() >= 0)
          ship(portal.out, a.stage, c.portal_from(), k.second, Msg::portal_grad, portal_grad_in);
        break;
      }
      case Kind::W: {
        auto node = live.extract(k);
        if (node.empty()) throw std::logic_error("pipeline executor: " + to_string(a) + " without its I");
        chunks_[a.chunk]->backward_weights(*node.mapped(), a.microbatch, is_last(i));
        break;
      }
    }
    if (a.kind == Kind::I) {  // deferred weight-gradient inputs count as held
      int64_t saved = 0;
      for (auto& [key, c] : live) saved += c->saved_bytes();
      st.peak_saved_bytes = std::max(st.peak_saved_bytes, saved);
    }
    release_sent(sends);
    const auto t1 = Clock::now();
    if (is_compute(a.kind)) st.compute_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
    st.timeline.push_back({a, us(t0), us(t1)});
  }
  // The sends of a window that leaves work in flight may wait for receives the next window posts.
  if (last_window) {
    for (auto& [w, t] : sends) w.wait();
    sends.clear();
  }
  // What may stay: after a window of an asynchronous schedule, the contexts of this step's
  // micro-batches whose backward the next window runs; nothing of the step before.
  const bool left = last_window ? !live.empty()
                                : std::any_of(live.begin(), live.end(), [&](const auto& e) { return e.first.second < base; });
  if (left || !act_out.empty() || !grad_out.empty() || !portal_in.empty() || !portal_grad_in.empty())
    throw bad("rank " + std::to_string(rank_) + " ended the step with work left (" + std::to_string(live.size()) +
              " contexts, " + std::to_string(act_out.size() + grad_out.size()) + " unsent tensors)");
  st.step_us = us(Clock::now());
  st.bubble = st.step_us > 0 ? (st.step_us - st.compute_us) / st.step_us : 0.0;
  return st;
}

Tensor StageRunner::backward_input(nn::Context&, int, const Tensor&, bool, nn::Portal&) {
  throw std::invalid_argument("this pipeline stage cannot split its backward into I and W");
}
void StageRunner::backward_weights(nn::Context&, int, bool) {
  throw std::invalid_argument("this pipeline stage cannot split its backward into I and W");
}
Shape StageRunner::boundary_shape() const {
  throw std::logic_error("a pipeline stage gives neither its boundary shape nor its input and output shapes");
}

// ---- forward only ----

void Executor::forward_only(int microbatches) {
  const ScheduleShape& s = schedule_.shape;
  Sends sends;
  std::map<Key, Tensor> skips;  // skip tensors made for a later stage of this rank
  for (int mb = 0; mb < microbatches; ++mb) {
    Tensor x;
    // Bidirectional (Chimera): the down pipeline alone (it holds every model stage once).
    for (int c = 0; c < (s.bidirectional ? 1 : s.chunks); ++c) {
      const int stage = s.stage_of(rank_, c);
      StageRunner& r = *chunks_[c];
      if (s.prev(stage) >= 0 && s.rank_of(s.prev(stage)) != rank_) {
        x = Tensor::empty(r.input_shape());
        pp_->recv(span_of(x), s.rank_of(s.prev(stage)), {.tag = tag(s.prev(stage), mb, Msg::activation)});
      }
      nn::Portal portal;
      if (r.portal_from() >= 0) {
        if (s.rank_of(r.portal_from()) == rank_) {
          portal.in = skips.at({stage, mb});
          skips.erase({stage, mb});
        } else {
          portal.in = Tensor::empty(r.portal_shape());
          pp_->recv(span_of(portal.in), s.rank_of(r.portal_from()), {.tag = tag(r.portal_from(), mb, Msg::portal)});
        }
      }
      nn::Context ctx(threads_, /*training=*/false, precision_);
      x = r.forward(ctx, mb, x, portal);
      if (s.next(stage) >= 0 && s.rank_of(s.next(stage)) != rank_)
        sends.emplace_back(pp_->isend(cspan_of(x), s.rank_of(s.next(stage)), {.tag = tag(stage, mb, Msg::activation)}), x);
      if (r.portal_to() >= 0) {
        if (s.rank_of(r.portal_to()) == rank_) skips[{r.portal_to(), mb}] = portal.out;
        else
          sends.emplace_back(pp_->isend(cspan_of(portal.out), s.rank_of(r.portal_to()), {.tag = tag(stage, mb, Msg::portal)}),
                             portal.out);
      }
    }
    release_sent(sends);
  }
  for (auto& [w, t] : sends) w.wait();
}

}  // namespace meshtrain::pipeline
