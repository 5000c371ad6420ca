#include "meshtrain/pipeline/executor.h"

#include <map>
#include <span>
#include <stdexcept>
#include <utility>

#include "meshtrain/pipeline/passes.h"

namespace meshtrain::pipeline {

namespace {
using Clock = std::chrono::steady_clock;
using Key = std::pair<int, int>;  // (stage, micro-batch)

std::span<float> span_of(Tensor& t) { return {t.data(), static_cast<size_t>(t.numel())}; }
std::span<const float> cspan_of(const Tensor& t) { return {t.data(), static_cast<size_t>(t.numel())}; }

std::invalid_argument bad(const std::string& msg) { return std::invalid_argument("pipeline executor: " + msg); }

// Removes and returns the tensor under k; a missing one is a broken schedule, named by its action.
Tensor take(std::map<Key, Tensor>& from, Key k, const Action& a) {
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
                   std::vector<StageRunner*> chunks, int threads)
    : schedule_(std::move(schedule)), rank_(rank), pp_(pp), chunks_(std::move(chunks)), threads_(threads) {
  const ScheduleShape& s = schedule_.shape;
  if (static_cast<int>(chunks_.size()) != s.chunks)
    throw bad(std::to_string(chunks_.size()) + " chunks given for a schedule of " + std::to_string(s.chunks));
  if (s.pp > 1 && (!pp_ || pp_->size() != s.pp))
    throw bad("a schedule over " + std::to_string(s.pp) + " pipeline ranks needs a pipeline group of that size");
  if (!schedule_.has_comm) schedule_ = add_send_recv(schedule_);
  if (auto f = validate(schedule_)) throw bad("invalid schedule: " + f->problem);
  const int64_t tags = int64_t{2} * s.stages() * s.microbatches;
  if (tags > comm::kMaxUserTag - kPipelineTagBase)
    throw bad(std::to_string(s.stages()) + " stages x " + std::to_string(s.microbatches) +
              " micro-batches need more message tags than a communicator has; use fewer micro-batches");
}

int Executor::tag(int sender_stage, int mb, bool backward_msg) const {
  return kPipelineTagBase + (sender_stage * schedule_.shape.microbatches + mb) * 2 + (backward_msg ? 1 : 0);
}

// ---- one step ----

StepStats Executor::run_step() {
  const ScheduleShape& s = schedule_.shape;
  const std::vector<Action>& list = schedule_.ranks[rank_];
  const int last_stage = s.stages() - 1;
  const auto t_step = Clock::now();
  auto us = [&](Clock::time_point t) { return std::chrono::duration<double, std::micro>(t - t_step).count(); };

  // Receives are posted now, all of them, and waited for at their RECV action.
  std::map<Key, Tensor> act_in, grad_in;  // received (or handed over) inputs of F and B
  std::map<Key, comm::Work> recv_f, recv_b;
  for (const Action& a : list) {
    const Key k{a.stage, a.microbatch};
    if (a.kind == Kind::RECV_F) {
      Tensor buf = Tensor::empty(chunks_[a.chunk]->boundary_shape());
      recv_f[k] = pp_->irecv(span_of(buf), s.rank_of(a.stage - 1), {.tag = tag(a.stage - 1, a.microbatch, false)});
      act_in[k] = buf;
    } else if (a.kind == Kind::RECV_B) {
      Tensor buf = Tensor::empty(chunks_[a.chunk]->boundary_shape());
      recv_b[k] = pp_->irecv(span_of(buf), s.rank_of(a.stage + 1), {.tag = tag(a.stage + 1, a.microbatch, true)});
      grad_in[k] = buf;
    }
  }
  // The last backward (B, or I and W) of each chunk in this step (data parallelism syncs then).
  std::map<std::pair<int, Kind>, size_t> last_of;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == Kind::B || list[i].kind == Kind::I || list[i].kind == Kind::W)
      last_of[{list[i].chunk, list[i].kind}] = i;
  auto is_last = [&](size_t i) { return last_of[{list[i].chunk, list[i].kind}] == i; };

  std::map<Key, std::unique_ptr<nn::Context>> live;
  std::map<Key, Tensor> act_out, grad_out;  // outputs waiting for SEND or for the next stage here
  std::vector<std::pair<comm::Work, Tensor>> sends;
  StepStats st;
  st.start = t_step;
  st.timeline.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const Key k{a.stage, a.microbatch};
    const auto t0 = Clock::now();
    switch (a.kind) {
      case Kind::RECV_F: recv_f.at(k).wait(); break;
      case Kind::RECV_B: recv_b.at(k).wait(); break;
      case Kind::SEND_F: {
        Tensor t = take(act_out, k, a);
        sends.emplace_back(pp_->isend(cspan_of(t), s.rank_of(a.stage + 1), {.tag = tag(a.stage, a.microbatch, false)}), t);
        break;
      }
      case Kind::SEND_B: {
        Tensor t = take(grad_out, k, a);
        sends.emplace_back(pp_->isend(cspan_of(t), s.rank_of(a.stage - 1), {.tag = tag(a.stage, a.microbatch, true)}), t);
        break;
      }
      case Kind::F: {
        Tensor input;  // received, or the previous stage's output on this rank
        if (a.stage > 0) input = act_in.count(k) ? take(act_in, k, a) : take(act_out, {a.stage - 1, a.microbatch}, a);
        auto& ctx = live[k] = std::make_unique<nn::Context>(threads_);
        Tensor out = chunks_[a.chunk]->forward(*ctx, a.microbatch, input);
        if (a.stage < last_stage) act_out[k] = std::move(out);
        int64_t saved = 0;
        for (auto& [key, c] : live) saved += c->saved_bytes();
        st.peak_saved_bytes = std::max(st.peak_saved_bytes, saved);
        st.max_in_flight = std::max(st.max_in_flight, static_cast<int>(live.size()));
        break;
      }
      case Kind::B:
      case Kind::I: {
        Tensor dy;  // received, or the next stage's input gradient on this rank
        if (a.stage < last_stage) dy = grad_in.count(k) ? take(grad_in, k, a) : take(grad_out, {a.stage + 1, a.microbatch}, a);
        auto it = live.find(k);
        if (it == live.end()) throw std::logic_error("pipeline executor: " + to_string(a) + " before its forward");
        Tensor dx;
        if (a.kind == Kind::B) {
          dx = chunks_[a.chunk]->backward(*it->second, a.microbatch, dy, is_last(i));
          live.erase(it);
        } else {  // the context waits for its W
          dx = chunks_[a.chunk]->backward_input(*it->second, a.microbatch, dy, is_last(i));
        }
        if (a.stage > 0) grad_out[k] = std::move(dx);
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
    const auto t1 = Clock::now();
    if (is_compute(a.kind)) st.compute_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
    st.timeline.push_back({a, us(t0), us(t1)});
  }
  for (auto& [w, t] : sends) w.wait();
  if (!live.empty() || !act_out.empty() || !grad_out.empty())
    throw bad("rank " + std::to_string(rank_) + " ended the step with work left (" + std::to_string(live.size()) +
              " contexts, " + std::to_string(act_out.size() + grad_out.size()) + " unsent tensors)");
  st.step_us = us(Clock::now());
  st.bubble = st.step_us > 0 ? (st.step_us - st.compute_us) / st.step_us : 0.0;
  return st;
}

Tensor StageRunner::backward_input(nn::Context&, int, const Tensor&, bool) {
  throw std::invalid_argument("this pipeline stage cannot split its backward into I and W");
}
void StageRunner::backward_weights(nn::Context&, int, bool) {
  throw std::invalid_argument("this pipeline stage cannot split its backward into I and W");
}

// ---- forward only ----

void Executor::forward_only(int microbatches) {
  const ScheduleShape& s = schedule_.shape;
  const int last_stage = s.stages() - 1;
  std::vector<std::pair<comm::Work, Tensor>> sends;
  for (int mb = 0; mb < microbatches; ++mb) {
    Tensor x;
    for (int c = 0; c < s.chunks; ++c) {
      const int stage = s.stage_of(rank_, c);
      if (stage > 0 && s.rank_of(stage - 1) != rank_) {
        x = Tensor::empty(chunks_[c]->boundary_shape());
        pp_->recv(span_of(x), s.rank_of(stage - 1), {.tag = tag(stage - 1, mb, false)});
      }
      nn::Context ctx(threads_, /*training=*/false);
      x = chunks_[c]->forward(ctx, mb, x);
      if (stage < last_stage && s.rank_of(stage + 1) != rank_)
        sends.emplace_back(pp_->isend(cspan_of(x), s.rank_of(stage + 1), {.tag = tag(stage, mb, false)}), x);
    }
  }
  for (auto& [w, t] : sends) w.wait();
}

}  // namespace meshtrain::pipeline
