#include "meshtrain/parallel/data/data_parallel.h"

#include "meshtrain/parallel/bf16_wire.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <stdexcept>

namespace meshtrain::parallel {

// ---- buckets ----

struct DataParallel::Bucket {
  std::vector<nn::Param*> params;
  std::vector<int64_t> offsets;  // of each parameter in the flat buffers
  int64_t numel = 0;
  std::vector<std::size_t> counts;  // slice length of every dp rank
  int64_t slice_off = 0, slice_n = 0;
  Tensor values;       // (numel) full values; stage 3: only while gathered
  Tensor grads;        // (numel) full gradients; stage 2/3: only during backward
  Tensor value_shard;  // (slice_n) stage 3: the persistent values
  Tensor grad_shard;   // (slice_n) stage 2/3: the persistent gradients
  int ready = 0;
  comm::Work grad_work;
  comm::Work gather_work;
  std::vector<float> wire_out, wire_in;  // bf16 wire: packed slices (two bf16 per float slot)
  std::vector<double> exact;             // exact sums: the bucket's float64 totals
  bool gathered = false;

  void view_values() {
    for (size_t i = 0; i < params.size(); ++i)
      params[i]->value = Tensor::view(values, offsets[i], params[i]->local_shape());
  }
  void view_grads() {
    for (size_t i = 0; i < params.size(); ++i)
      params[i]->grad = Tensor::view(grads, offsets[i], params[i]->local_shape());
  }
};

namespace {

std::span<float> span_of(Tensor& t) { return {t.data(), static_cast<size_t>(t.numel())}; }

}  // namespace

DataParallel::DataParallel(std::vector<Unit> units, std::shared_ptr<comm::Communicator> dp,
                           const DataParallelOptions& opt)
    : dp_(std::move(dp)), opt_(opt) {
  if (opt_.zero < 0 || opt_.zero > 3) throw std::invalid_argument("--zero must be 0, 1, 2 or 3");
  if (opt_.bucket_bytes < 1) throw std::invalid_argument("the bucket size must be positive");
  for (auto& u : units)
    for (nn::Param* p : u.params) params_.push_back(p);

  // Group parameters: stage 3 by unit, otherwise in reverse order by size.
  auto own = [&](const nn::Param* p) {
    return std::find(opt_.own_bucket.begin(), opt_.own_bucket.end(), p) != opt_.own_bucket.end();
  };
  std::vector<std::vector<nn::Param*>> groups;
  if (opt_.zero == 3) {
    for (size_t i = 0; i < units.size(); ++i) {
      unit_of_[units[i].module] = i;
      unit_buckets_.emplace_back();
      std::vector<nn::Param*> rest;
      for (nn::Param* p : units[i].params) {
        if (!own(p)) {
          rest.push_back(p);
          continue;
        }
        unit_buckets_.back().push_back(groups.size());
        groups.push_back({p});
      }
      if (!rest.empty()) unit_buckets_.back().push_back(groups.size()), groups.push_back(std::move(rest));
    }
  } else {
    std::vector<nn::Param*> cur;
    int64_t bytes = 0;
    for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
      if (own(*it)) {
        groups.push_back({*it});
        continue;
      }
      cur.push_back(*it);
      bytes += (*it)->value.bytes();
      if (bytes >= opt_.bucket_bytes) groups.push_back(std::move(cur)), cur.clear(), bytes = 0;
    }
    if (!cur.empty()) groups.push_back(std::move(cur));
  }

  const int P = dp_->size(), r = dp_->rank();
  for (auto& g : groups) {
    auto b = std::make_unique<Bucket>();
    b->params = g;
    for (nn::Param* p : g) {
      b->offsets.push_back(b->numel);
      b->numel += p->value.numel();
      bucket_of_[p] = b.get();
    }
    int64_t off = 0;
    for (int q = 0; q < P; ++q) {
      int64_t n = b->numel / P + (q < b->numel % P ? 1 : 0);
      b->counts.push_back(static_cast<size_t>(n));
      if (q == r) b->slice_off = off, b->slice_n = n;
      off += n;
    }
    // Move the values into the flat buffer (identical on every rank by construction).
    b->values = Tensor::empty({b->numel});
    for (size_t i = 0; i < g.size(); ++i)
      std::memcpy(b->values.data() + b->offsets[i], g[i]->value.data(), g[i]->value.bytes());
    b->view_values();
    b->grads = Tensor({b->numel});
    b->view_grads();
    if (opt_.zero >= 2) b->grad_shard = Tensor({b->slice_n});
    if (opt_.zero == 3) {
      b->value_shard = Tensor::empty({b->slice_n});
      std::memcpy(b->value_shard.data(), b->values.data() + b->slice_off, b->slice_n * sizeof(float));
      b->gathered = true;
    }
    buckets_.push_back(std::move(b));
  }
  if (opt_.zero == 3)
    for (size_t b = 0; b < buckets_.size(); ++b) release_bucket(b);

  // Segment parameters: this rank's slice of each parameter, for the sharded optimizer.
  if (opt_.zero >= 1) {
    for (auto& b : buckets_) {
      const int64_t lo = b->slice_off, hi = b->slice_off + b->slice_n;
      for (size_t i = 0; i < b->params.size(); ++i) {
        nn::Param* p = b->params[i];
        const int64_t s = std::max(lo, b->offsets[i]);
        const int64_t e = std::min(hi, b->offsets[i] + p->local_numel());
        if (s >= e) continue;
        auto seg = std::make_unique<nn::Param>();
        seg->name = p->name + "@" + std::to_string(s - b->offsets[i]);
        seg->global_shape = {e - s};
        seg->decay = p->decay;
        seg->value = opt_.zero == 3 ? Tensor::view(b->value_shard, s - lo, {e - s})
                                    : Tensor::view(b->values, s, {e - s});
        seg->grad = opt_.zero >= 2 ? Tensor::view(b->grad_shard, s - lo, {e - s})
                                   : Tensor::view(b->grads, s, {e - s});
        origin_[seg.get()] = p;
        segment_offset_[seg.get()] = s - b->offsets[i];
        segments_.push_back(std::move(seg));
      }
    }
  }

  hooks_.grad_ready = [this](nn::Param* p) { grad_ready(p); };
  if (opt_.zero == 3) {
    hooks_.pre_forward = [this](const nn::Module* m) { on_pre(m, false); };
    hooks_.post_forward = [this](const nn::Module* m) { on_post(m, false); };
    hooks_.pre_backward = [this](const nn::Module* m) { on_pre(m, true); };
    hooks_.post_backward = [this](const nn::Module* m) { on_post(m, true); };
  }
}

DataParallel::~DataParallel() {
  // Buffers of pending operations must outlive them.
  for (auto& b : buckets_) {
    try {
      b->grad_work.wait();
      b->gather_work.wait();
    } catch (...) {
    }
  }
}

// ---- gradient synchronisation ----

void DataParallel::begin_step() {
  for (auto& b : buckets_) {
    if (b->grads.numel() != b->numel) {
      b->grads = Tensor({b->numel});
      b->view_grads();
    } else {
      b->grads.zero();
    }
    b->ready = 0;
  }
}

void DataParallel::grad_ready(nn::Param* p) {
  if (!sync_) return;
  auto it = bucket_of_.find(p);
  if (it == bucket_of_.end()) return;
  Bucket& b = *it->second;
  if (++b.ready == static_cast<int>(b.params.size())) launch(b);
}

// ---- exact sums ----
// A float64 sum of the ranks' float64 totals differs from one order to another by float64
// round-off only, far below the float32 rounding that follows: every layout rounds to the same
// float32 gradient (but for a total within float64 round-off of a float32 rounding boundary).
void DataParallel::launch_exact(Bucket& b) {
  b.exact.assign(static_cast<size_t>(b.numel), 0.0);
  for (size_t i = 0; i < b.params.size(); ++i) {
    const std::vector<double>& g = b.params[i]->grad_exact;
    if (static_cast<int64_t>(g.size()) != b.params[i]->local_numel())
      throw std::logic_error("exact sums: " + b.params[i]->name + " has no float64 gradient total");
    std::copy(g.begin(), g.end(), b.exact.begin() + b.offsets[i]);
  }
  b.grad_work = dp_->all_reduce_async(std::span<double>(b.exact), {.op = comm::ReduceOp::sum, .algorithm = opt_.allreduce});
}

void DataParallel::finish_exact(Bucket& b) {
  const double inv = 1.0 / static_cast<double>(dp_->size());  // exact for a power-of-two dp
  if (opt_.zero >= 2) {
    float* shard = b.grad_shard.data();
    for (int64_t j = 0; j < b.slice_n; ++j)
      shard[j] = static_cast<float>(b.exact[static_cast<size_t>(b.slice_off + j)] * inv);
  } else {
    float* g = b.grads.data();
    for (int64_t j = 0; j < b.numel; ++j) g[j] = static_cast<float>(b.exact[static_cast<size_t>(j)] * inv);
  }
  b.exact = {};
}

// ---- bf16 on the wire (parallel/bf16_wire.h) ----
void DataParallel::launch_bf16(Bucket& b) {
  pack_bf16_slices(b.grads.data(), b.counts, b.wire_out);
  b.wire_in.assign(b.wire_out.size(), 0.f);
  b.grad_work = dp_->all_to_all_async(std::span<const float>(b.wire_out), std::span<float>(b.wire_in));
}

void DataParallel::finish_bf16(Bucket& b) {
  const int P = dp_->size();
  // The owner's float32 sum of every rank's bf16 slice, in rank order, then the average.
  std::vector<float> sum(static_cast<size_t>(b.slice_n));
  sum_bf16_blocks(b.wire_in, P, bf16_slots(b.counts), b.slice_n, 1.0f / static_cast<float>(P), sum.data());
  if (opt_.zero >= 2) std::copy(sum.begin(), sum.end(), b.grad_shard.data());
  else all_gather_bf16(*dp_, sum.data(), b.counts, b.grads.data());  // every rank takes the bf16 of it
  b.wire_out = {};
  b.wire_in = {};
}

void DataParallel::launch(Bucket& b) {
  if (counted_) {  // this rank's local gradients, before the communication averages them
    for (size_t i = 0; i < b.params.size(); ++i) {
      if (!counted_(b.params[i])) continue;
      const float* g = b.grads.data() + b.offsets[i];
      double s = 0;
      for (int64_t j = 0, n = b.params[i]->local_numel(); j < n; ++j) s += static_cast<double>(g[j]) * g[j];
      local_sq_ += s;
    }
  }
  if (opt_.bf16_wire) return launch_bf16(b);
  if (opt_.exact_sums) return launch_exact(b);
  if (opt_.zero <= 1) {
    b.grad_work = dp_->all_reduce_async(span_of(b.grads), {.op = comm::ReduceOp::avg, .algorithm = opt_.allreduce});
  } else {
    b.grad_work = dp_->reduce_scatter_async(span_of(b.grads), span_of(b.grad_shard), b.counts,
                                            {.op = comm::ReduceOp::avg});
  }
}

void DataParallel::finish_grad_sync() {
  for (auto& b : buckets_) {
    if (b->ready != static_cast<int>(b->params.size()))
      throw std::logic_error("bucket gradient never became ready: a parameter's backward did not "
                             "run (" + b->params.front()->name + ")");
    b->grad_work.wait();
    b->grad_work = {};
    if (opt_.bf16_wire) finish_bf16(*b);
    if (opt_.exact_sums) finish_exact(*b);
    b->ready = 0;
    if (opt_.zero >= 2) {
      for (nn::Param* p : b->params) p->grad = Tensor();
      b->grads = Tensor();
    }
  }
}

std::vector<nn::Param*> DataParallel::optimizer_params() {
  if (opt_.zero == 0) return params_;
  std::vector<nn::Param*> out;
  for (auto& s : segments_) out.push_back(s.get());
  return out;
}

double DataParallel::reduce_grad_sq(double local) {
  if (opt_.zero == 0) return local;
  std::array<double, 1> v{local};
  dp_->all_reduce(v);
  return v[0];
}

const nn::Param* DataParallel::origin(const nn::Param* q) const {
  auto it = origin_.find(q);
  return it == origin_.end() ? q : it->second;
}

std::span<float> DataParallel::synced_grad(const nn::Param* p) {
  auto it = bucket_of_.find(p);
  if (it == bucket_of_.end()) throw std::logic_error("synced_grad: " + p->name + " is not synchronised here");
  if (opt_.zero <= 1) return {const_cast<nn::Param*>(p)->grad.data(), static_cast<size_t>(p->grad.numel())};
  Bucket& b = *it->second;
  if (b.params.size() != 1)
    throw std::logic_error("synced_grad: " + p->name + " shares its bucket; give it own_bucket");
  return span_of(b.grad_shard);
}

void DataParallel::finish_optimizer_step() {
  if (opt_.zero == 3) {
    // A unit prefetched for an order the schedule did not follow (interleaved pipelines run
    // several chunks' units in turn) may still hold values gathered before this update.
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (buckets_[b]->gathered) release_bucket(b);
    return;
  }
  if (opt_.zero == 0) return;
  std::vector<comm::Work> works;
  std::vector<Tensor> inputs;
  for (auto& b : buckets_) {
    inputs.push_back(Tensor::empty({b->slice_n}));
    std::memcpy(inputs.back().data(), b->values.data() + b->slice_off, b->slice_n * sizeof(float));
    works.push_back(dp_->all_gather_async(span_of(inputs.back()), span_of(b->values), b->counts));
  }
  for (auto& w : works) w.wait();
}

// ---- ZeRO-3 units ----

void DataParallel::gather_bucket(size_t i, bool wait) {
  Bucket& b = *buckets_[i];
  if (!b.gathered) {
    b.values = Tensor::empty({b.numel});
    b.view_values();
    b.gather_work = dp_->all_gather_async(span_of(b.value_shard), span_of(b.values), b.counts);
    b.gathered = true;
  }
  if (wait) {
    b.gather_work.wait();
    b.gather_work = {};
  }
}

void DataParallel::release_bucket(size_t i) {
  Bucket& b = *buckets_[i];
  b.gather_work.wait();
  b.gather_work = {};
  for (nn::Param* p : b.params) p->value = Tensor(), p->drop_bf16();  // the bf16 copy goes with the values
  b.values = Tensor();
  b.gathered = false;
}

void DataParallel::on_pre(const nn::Module* m, bool backward) {
  auto it = unit_of_.find(m);
  if (it == unit_of_.end()) return;
  const size_t u = it->second, n = unit_buckets_.size();
  for (size_t b : unit_buckets_[u]) gather_bucket(b, true);
  // Prefetch the next unit in execution order: forward root, 1, 2, ...; backward root, n-1, ...
  size_t next = n;
  if (!backward) next = u + 1;
  else next = u == 0 ? n - 1 : u - 1;
  if (next >= 1 && next < n)
    for (size_t b : unit_buckets_[next]) gather_bucket(b, false);
}

void DataParallel::on_post(const nn::Module* m, bool backward) {
  auto it = unit_of_.find(m);
  if (it == unit_of_.end()) return;
  for (size_t b : unit_buckets_[it->second]) release_bucket(b);
}

// ---- checkpoints ----

int64_t DataParallel::segment_offset(const nn::Param* q) const {
  auto it = segment_offset_.find(q);
  return it == segment_offset_.end() ? 0 : it->second;
}

DataParallel::Memory DataParallel::memory() const {
  Memory m;
  for (auto& b : buckets_) {
    m.param_bytes += (opt_.zero == 3 ? b->slice_n : b->numel) * static_cast<int64_t>(sizeof(float));
    m.grad_bytes += (opt_.zero >= 2 ? b->slice_n : b->numel) * static_cast<int64_t>(sizeof(float));
  }
  return m;
}

}  // namespace meshtrain::parallel
