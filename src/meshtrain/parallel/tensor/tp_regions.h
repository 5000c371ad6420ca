// Tensor-parallel region operations (Megatron-LM's mappings), each written as a pair: a
// forward and, right beside it, its backward mirror. Every communication of tensor parallelism
// goes through these five, over the tp communicator passed in (no global group), so the
// communicator's byte counter sees all of it.
//
//   region              forward                        backward
//   CopyToTP            identity                       all-reduce
//   ReduceFromTP        all-reduce                     identity
//   ScatterToSP         keep own sequence shard        all-gather
//   GatherFromSP        all-gather                     reduce-scatter
//   ReduceScatterToSP   reduce-scatter                 all-gather
//
// Sequence shards (sequence parallelism). An activation (B, T, C) is (N = B*T) token rows of
// C floats. Rank r of p holds the contiguous token rows [r N/p, (r+1) N/p): shaped
// (B, T/p, C), it is the full tensor's flat range [r, r+1) * N*C/p, so the ring all-gather's
// rank-major output *is* the full tensor, with no permutation. The layers a shard passes
// through (layernorm, residual add, bias add) act per token and do not care which rows they
// get. A 2-D activation (N, C) is split along its rows the same way.
//
// Split forms: `*_start` begins the same communication asynchronously and returns its Work
// (the output is allocated at once; it, and the input, must stay untouched until the Work
// completes), so a layer can overlap it with computation that does not need the result.
//
// bf16 on the wire (--comm-dtype bf16): while a TPWireScope(true) is alive on the calling rank
// thread, the three collectives below carry bf16 and sum in float32 (parallel/bf16_wire.h):
// an all-reduce leaves every rank the bf16 of the float32 sum, an all-gather every rank the
// bf16 of each shard, a reduce-scatter the owner's float32 sum. They then run to completion
// inside the `*_start` calls (which return a finished Work): the bf16 exchange is two steps
// with a sum between, not one asynchronous operation.
//
// Limits: float32 activations; T (or N for 2-D) must divide by p (validate_tp checks seq % tp).
// Collectives run with kTPAlgorithm (ring): bandwidth-optimal and with an exact, documented
// byte count (an all-reduce of n floats over p ranks sends 2 (p-1)/p n floats per rank).
#pragma once

#include "meshtrain/comm/communicator.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::parallel {

inline constexpr comm::Algorithm kTPAlgorithm = comm::Algorithm::ring;

// The wire type of the calling thread's tensor-parallel regions (see the top of this file).
class TPWireScope {
 public:
  explicit TPWireScope(bool bf16);
  ~TPWireScope();
  TPWireScope(const TPWireScope&) = delete;
  TPWireScope& operator=(const TPWireScope&) = delete;
  static bool bf16();  // the calling thread's current setting

 private:
  bool previous_;
};

// Shape of the full activation whose sequence shard has shape `local`, and the reverse.
Shape sp_full_shape(const Shape& local, int p);
Shape sp_local_shape(const Shape& full, int p);  // throws if the sequence does not divide

// ---- copy to the tp region: identity forward, all-reduce backward ----
struct CopyToTP {
  static Tensor forward(comm::Communicator& tp, const Tensor& x);  // returns x
  static Tensor backward(comm::Communicator& tp, Tensor dy);       // sums dy over tp, in place
  static comm::Work backward_start(comm::Communicator& tp, Tensor& dy);
};

// ---- reduce from the tp region: all-reduce forward, identity backward ----
struct ReduceFromTP {
  static Tensor forward(comm::Communicator& tp, Tensor x);             // in place
  static Tensor backward(comm::Communicator& tp, const Tensor& dy);    // returns dy
};

// ---- scatter to the sequence region: keep own shard forward, all-gather backward ----
struct ScatterToSP {
  static Tensor forward(comm::Communicator& tp, const Tensor& x);   // (B, T, C) -> (B, T/p, C)
  static Tensor backward(comm::Communicator& tp, const Tensor& dy); // (B, T/p, C) -> (B, T, C)
};

// ---- gather from the sequence region: all-gather forward, reduce-scatter backward ----
struct GatherFromSP {
  static Tensor forward(comm::Communicator& tp, const Tensor& x);   // (B, T/p, C) -> (B, T, C)
  static Tensor backward(comm::Communicator& tp, const Tensor& dy); // (B, T, C) -> (B, T/p, C)
  static comm::Work forward_start(comm::Communicator& tp, const Tensor& x, Tensor& out);
  static comm::Work backward_start(comm::Communicator& tp, const Tensor& dy, Tensor& out);
};

// ---- reduce-scatter to the sequence region: reduce-scatter forward, all-gather backward ----
struct ReduceScatterToSP {
  static Tensor forward(comm::Communicator& tp, const Tensor& x);   // (B, T, C) -> (B, T/p, C)
  static Tensor backward(comm::Communicator& tp, const Tensor& dy); // (B, T/p, C) -> (B, T, C)
};

}  // namespace meshtrain::parallel
