// What a model says about its own cost, for the planner (plan/cost.h) and the memory model
// (plan/memory.h): per layer, the forward and backward FLOPs, the bytes a memory-bound layer
// moves, the activations it saves for backward and the transient bytes its backward holds, and
// the tensor-parallel all-reduces it needs — for one micro-batch on one rank of a layout.
//
// Every model family answers through ModelSpec::op_costs (model/spec.h), so the planner plans
// any model the trainer knows without knowing which it is. GPT answers analytically (it must
// answer for models far larger than this machine can build: GPT-3 175B); the CNNs answer from
// their units' FLOPs and from what their layers save when a stage runs one small forward (a
// CNN is small enough to build), scaled to the micro-batch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace meshtrain::model {

enum class OpClass {
  gemm,       // a matrix product (m x k)(k x n); its backward two products of the same size
  attention,  // causal attention's core (scores, softmax, weighted sum); backward twice forward
  memory,     // element-wise and normalisation layers: time from bytes moved
  conv,       // a convolution (nn::Conv2d): its three calls at the machine file's rates for its shape class
  layer,      // a memory-bound layer of a CNN (batch norm, pooling, sums, concat): its measured call times
};

struct OpCost {
  std::string name;  // "h.3.mlp.c_fc", "embedding", "head", "block1" ...
  OpClass cls = OpClass::memory;
  int64_t m = 0, n = 0, k = 0;            // gemm: the forward product's shape; attention: T, head size, heads
  // memory: the kernel whose measured rate applies ("add", "layernorm", "gelu"; a machine
  // file measures each, plan/machine.h)
  std::string kernel = "add";
  double fwd_flops = 0, bwd_flops = 0;    // floating-point operations
  double fwd_bytes = 0, bwd_bytes = 0;    // bytes read and written by memory-bound work
  // Activations kept from forward until this op's backward (tensor storage: a tensor two
  // layers save is counted once, on the first).
  double saved_bytes = 0;
  // Transient bytes alive while its backward runs (gradients of its input and output, and of
  // the residual stream around it).
  double temp_bytes = 0;
  // Tensor parallelism: bytes all-reduced over the tp group in forward and in backward.
  double tp_fwd_bytes = 0, tp_bwd_bytes = 0;
  bool unit_end = false;                  // the last op of a pipeline unit (block)

  // ---- convolutional networks (model/cnn_cost.cpp) ----
  // conv: the convolution on this rank, input (rows, ic, h, w), oc filters of kernel x kernel;
  // nchw: its activations are NCHW (converted inside each call), else oneDNN's blocked layout;
  // input_grad false: the model's first layer (no backward-data call).
  // layer: `kernel` names the measured layer (plan/machine.h LayerRate), `elements` its input's
  // floats on this rank, `nchw` its format.
  int64_t ic = 0, oc = 0, kernel_size = 1, stride = 1, h = 0, w = 0, elements = 0;
  bool nchw = true, input_grad = true;
  // The intra-layer group's other communication: all-reduces are tp_fwd_bytes / tp_bwd_bytes in
  // tp_fwd_calls / tp_bwd_calls calls (batch-norm statistics: several small ones); all-gathers
  // (bytes of the whole gathered tensor); a row band's halo exchange (bytes this rank sends to
  // its neighbours, and the number of messages each way).
  int tp_fwd_calls = 1, tp_bwd_calls = 1;
  double tp_fwd_gather_bytes = 0, tp_bwd_gather_bytes = 0;
  double halo_fwd_bytes = 0, halo_bwd_bytes = 0;
  int halo_msgs = 0;
};

// The micro-batch and the layout a cost is asked for.
struct CostQuery {
  CostQuery(int64_t rows = 1, int64_t T = 1, int tp = 1, bool sequence_parallel = false)
      : rows(rows), T(T), tp(tp), sequence_parallel(sequence_parallel) {}
  int64_t rows = 1;  // samples in the micro-batch
  int64_t T = 1;     // sequence length (token models)
  int tp = 1;        // ranks of the intra-layer group
  bool sequence_parallel = false;
  // Image models: how the intra-layer group splits them (cnn_layout.h: filters and channels,
  // row bands, or the branches of a block), which rank of the group is asked (ranks differ under
  // the branch split), and the branch split's --branch-balance ("": by FLOPs).
  enum class Split { tensor, spatial, branch } split = Split::tensor;
  int tp_rank = 0;
  std::string branch_balance;
  // Without a balance the trainer places each block's branches by their measured seconds
  // (model::measure_branch_costs), by block name; empty: by FLOPs.
  std::map<std::string, std::vector<double>> branch_costs;
};

double total_flops(const std::vector<OpCost>& ops);        // forward + backward
double total_saved_bytes(const std::vector<OpCost>& ops);  // saved by one forward
// The most a micro-batch's activations and its backward's transients hold at once: backward
// runs the ops in reverse, releasing what each saved, so while op j runs the saved bytes of
// ops 0..j and j's transients are alive: max over j of (sum_{k <= j} saved_k + temp_j).
double backward_peak_bytes(const std::vector<OpCost>& ops);

}  // namespace meshtrain::model
