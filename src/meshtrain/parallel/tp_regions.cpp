// Tensor-parallel region operations: each forward next to its backward mirror (tp_regions.h).
#include "meshtrain/parallel/tp_regions.h"

#include <cstring>
#include <span>
#include <stdexcept>
#include <string>

namespace meshtrain::parallel {

namespace {

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
  tp.all_gather(all(x), all(out), {.algorithm = kTPAlgorithm});
  return out;
}

// Own (B, T/p, C) shard of the sum over ranks of (B, T, C).
Tensor reduce_scatter_seq(comm::Communicator& tp, const Tensor& x) {
  Tensor out = Tensor::empty(sp_local_shape(x.shape(), tp.size()));
  tp.reduce_scatter(all(x), all(out), {.algorithm = kTPAlgorithm});
  return out;
}

// The same two, started asynchronously.
comm::Work all_gather_seq_start(comm::Communicator& tp, const Tensor& x, Tensor& out) {
  out = Tensor::empty(sp_full_shape(x.shape(), tp.size()));
  return tp.all_gather_async(all(x), all(out), {.algorithm = kTPAlgorithm});
}
comm::Work reduce_scatter_seq_start(comm::Communicator& tp, const Tensor& x, Tensor& out) {
  out = Tensor::empty(sp_local_shape(x.shape(), tp.size()));
  return tp.reduce_scatter_async(all(x), all(out), {.algorithm = kTPAlgorithm});
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
  tp.all_reduce(all(dy), {.algorithm = kTPAlgorithm});
  return dy;
}
comm::Work CopyToTP::backward_start(comm::Communicator& tp, Tensor& dy) {
  return tp.all_reduce_async(all(dy), {.algorithm = kTPAlgorithm});
}

// ---- ReduceFromTP ----
Tensor ReduceFromTP::forward(comm::Communicator& tp, Tensor x) {
  tp.all_reduce(all(x), {.algorithm = kTPAlgorithm});
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
