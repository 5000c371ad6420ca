// Tensor-parallel region operations: each forward next to its backward mirror (tp_regions.h).
#include "meshtrain/parallel/tensor/tp_regions.h"

#include "meshtrain/parallel/bf16_wire.h"

#include <cstring>
#include <span>
#include <stdexcept>
#include <string>

namespace meshtrain::parallel {

// ---- wire type ----
namespace {
thread_local bool tp_bf16_wire = false;
}  // namespace
TPWireScope::TPWireScope(bool bf16) : previous_(tp_bf16_wire) { tp_bf16_wire = bf16; }
TPWireScope::~TPWireScope() { tp_bf16_wire = previous_; }
bool TPWireScope::bf16() { return tp_bf16_wire; }

namespace {

// The three collectives of the regions, on the wire type of the calling thread.
void tp_all_reduce(comm::Communicator& tp, std::span<float> x) {
  if (tp_bf16_wire) return all_reduce_bf16(tp, x);
  tp.all_reduce(x, {.algorithm = kTPAlgorithm});
}
comm::Work tp_all_reduce_start(comm::Communicator& tp, std::span<float> x) {
  if (tp_bf16_wire) return all_reduce_bf16(tp, x), comm::Work{};
  return tp.all_reduce_async(x, {.algorithm = kTPAlgorithm});
}
comm::Work tp_all_gather(comm::Communicator& tp, std::span<const float> in, std::span<float> out, bool async) {
  if (tp_bf16_wire) return all_gather_bf16(tp, in, out), comm::Work{};
  if (async) return tp.all_gather_async(in, out, {.algorithm = kTPAlgorithm});
  tp.all_gather(in, out, {.algorithm = kTPAlgorithm});
  return {};
}
comm::Work tp_reduce_scatter(comm::Communicator& tp, std::span<const float> in, std::span<float> out, bool async) {
  if (tp_bf16_wire) return reduce_scatter_bf16(tp, in, out), comm::Work{};
  if (async) return tp.reduce_scatter_async(in, out, {.algorithm = kTPAlgorithm});
  tp.reduce_scatter(in, out, {.algorithm = kTPAlgorithm});
  return {};
}

// The dimension a sequence shard splits: T of (B, T, C), N of (N, C).
int seq_dim(const Shape& s) {
  if (s.size() == 3) return 1;
  if (s.size() == 2) return 0;
  throw std::invalid_argument("sequence-parallel activation must be (B, T, C) or (N, C), got " +
                              shape_str(s));
}

std::span<float> all(Tensor& t) { return {t.data(), static_cast<size_t>(t.numel())}; }
std::span<const float> all(const Tensor& t) {
  return {t.data(), static_cast<size_t>(t.numel())};
}

// Full (B, T, C) from every rank's (B, T/p, C) shard: the rank-major gather is the full tensor.
Tensor all_gather_seq(comm::Communicator& tp, const Tensor& x) {
  Tensor out = Tensor::empty(sp_full_shape(x.shape(), tp.size()));
  tp_all_gather(tp, all(x), all(out), false);
  return out;
}

// Own (B, T/p, C) shard of the sum over ranks of (B, T, C).
Tensor reduce_scatter_seq(comm::Communicator& tp, const Tensor& x) {
  Tensor out = Tensor::empty(sp_local_shape(x.shape(), tp.size()));
  tp_reduce_scatter(tp, all(x), all(out), false);
  return out;
}

// The same two, started asynchronously.
comm::Work all_gather_seq_start(comm::Communicator& tp, const Tensor& x, Tensor& out) {
  out = Tensor::empty(sp_full_shape(x.shape(), tp.size()));
  return tp_all_gather(tp, all(x), all(out), true);
}
comm::Work reduce_scatter_seq_start(comm::Communicator& tp, const Tensor& x, Tensor& out) {
  out = Tensor::empty(sp_local_shape(x.shape(), tp.size()));
  return tp_reduce_scatter(tp, all(x), all(out), true);
}

}  // namespace

Shape sp_full_shape(const Shape& local, int p) {
  Shape s = local;
  s[seq_dim(s)] *= p;
  return s;
}

Shape sp_local_shape(const Shape& full, int p) {
  Shape s = full;
  const int d = seq_dim(s);
  if (s[d] % p != 0)
    throw std::invalid_argument("sequence parallelism: sequence dimension of " + shape_str(full) +
                                " does not divide over " + std::to_string(p) +
                                " tensor-parallel ranks");
  s[d] /= p;
  return s;
}

// ---- CopyToTP ----
Tensor CopyToTP::forward(comm::Communicator&, const Tensor& x) { return x; }
Tensor CopyToTP::backward(comm::Communicator& tp, Tensor dy) {
  tp_all_reduce(tp, all(dy));
  return dy;
}
comm::Work CopyToTP::backward_start(comm::Communicator& tp, Tensor& dy) {
  return tp_all_reduce_start(tp, all(dy));
}

// ---- ReduceFromTP ----
Tensor ReduceFromTP::forward(comm::Communicator& tp, Tensor x) {
  tp_all_reduce(tp, all(x));
  return x;
}
Tensor ReduceFromTP::backward(comm::Communicator&, const Tensor& dy) { return dy; }

// ---- ScatterToSP ----
Tensor ScatterToSP::forward(comm::Communicator& tp, const Tensor& x) {
  Tensor out = Tensor::empty(sp_local_shape(x.shape(), tp.size()));
  std::memcpy(out.data(), x.data() + tp.rank() * out.numel(), out.bytes());
  return out;
}
Tensor ScatterToSP::backward(comm::Communicator& tp, const Tensor& dy) {
  return all_gather_seq(tp, dy);
}

// ---- GatherFromSP ----
Tensor GatherFromSP::forward(comm::Communicator& tp, const Tensor& x) {
  return all_gather_seq(tp, x);
}
Tensor GatherFromSP::backward(comm::Communicator& tp, const Tensor& dy) {
  return reduce_scatter_seq(tp, dy);
}
comm::Work GatherFromSP::forward_start(comm::Communicator& tp, const Tensor& x, Tensor& out) {
  return all_gather_seq_start(tp, x, out);
}
comm::Work GatherFromSP::backward_start(comm::Communicator& tp, const Tensor& dy, Tensor& out) {
  return reduce_scatter_seq_start(tp, dy, out);
}

// ---- ReduceScatterToSP ----
Tensor ReduceScatterToSP::forward(comm::Communicator& tp, const Tensor& x) {
  return reduce_scatter_seq(tp, x);
}
Tensor ReduceScatterToSP::backward(comm::Communicator& tp, const Tensor& dy) {
  return all_gather_seq(tp, dy);
}

}  // namespace meshtrain::parallel
