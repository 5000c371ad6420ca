// 2-D convolution over oneDNN's convolution_forward / _backward_data / _backward_weights.
//
// Plans. A plan is one primitive plus, for each of its tensor arguments, the caller's plain
// layout (NCHW, OIHW, x) and the layout the primitive chose (format_tag::any), with the reorder
// primitive between them when they differ. Plans are built on first use per (shape, bias,
// thread budget) and kept per calling thread: oneDNN sizes a JIT kernel's thread partition
// when the primitive is created, so a plan is only valid under the budget it was made with.
// The backward primitives are made with the forward primitive descriptor as their hint, which
// makes them choose the forward pass's layouts. The three plans of a shape are separate, so an
// evaluation-only model never builds backward primitives.
//
// Memory. The converted arguments live in Tensors made for the call (tensor storage of 1 MiB
// and more comes from the process's arena, tensor/tensor.h, so repeated calls do not
// fault in fresh pages) and so does the primitive's scratchpad (user scratchpad mode; oneDNN's
// own mode allocates and frees it inside every call).
//
// Accumulation. oneDNN writes the weight gradient; the gradient rule wants it added. The
// primitive writes into a temporary in its own layout and the reorder back to OIHW carries a
// sum post-op (dst = reorder(src) + dst), so the conversion and the addition are one pass. The
// bias gradient (OC floats) is added by a loop.
#include "meshtrain/kernels/conv.h"
#include "meshtrain/kernels/flops.h"
#include "meshtrain/kernels/layout.h"

#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::kernels {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The calling thread's OpenMP budget (kernels/gemm.cpp does the same for its libraries).
void set_budget(int threads) {
  const int t = threads < 1 ? 1 : threads;
  if (omp_get_max_threads() != t) omp_set_num_threads(t);
}

// ---- arguments ----
// One tensor argument of a primitive: the caller's layout, the primitive's, and the reorder
// between them (null when they agree). `to_inner` converts an input, otherwise the reorder
// converts an output back to the caller's layout (adding into it when made with accumulate).
struct Arg {
  memory::desc outer, inner;
  dnnl::reorder reorder;

  Arg() = default;
  Arg(const memory::desc& outer_md, const memory::desc& inner_md, bool to_inner, bool accumulate = false)
      : outer(outer_md), inner(inner_md) {
    if (outer == inner && !accumulate) return;
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    const auto& e = cpu_engine();
    reorder = to_inner ? dnnl::reorder(dnnl::reorder::primitive_desc(e, outer, e, inner, attr))
                       : dnnl::reorder(dnnl::reorder::primitive_desc(e, inner, e, outer, attr));
  }
  bool converts() const { return static_cast<bool>(reorder); }
};

// Storage for a call: a Tensor large enough for `bytes` (blocked layouts pad channels to the
// block), at least one element so that its pointer is never null. Exactly the size of an
// activation of the same shape where no padding is needed, so the arena hands the blocks of
// one back to the other (one element more would round up to another size class).
float* scratch_floats(Tensor& holder, size_t bytes) {
  const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
  holder = Tensor::empty({static_cast<int64_t>(floats > 0 ? floats : 1)});
  return holder.data();
}

// The primitive's view of an input: the caller's array itself or its conversion.
memory input(const Arg& a, const float* user, Tensor& holder, dnnl::stream& s) {
  memory um(a.outer, cpu_engine(), const_cast<float*>(user));
  if (!a.converts()) return um;
  memory im(a.inner, cpu_engine(), scratch_floats(holder, a.inner.get_size()));
  a.reorder.execute(s, um, im);
  return im;
}

// Where the primitive writes an output: the caller's array itself or a temporary that
// finish_output converts into it.
memory output(const Arg& a, float* user, Tensor& holder) {
  if (!a.converts()) return memory(a.outer, cpu_engine(), user);
  return memory(a.inner, cpu_engine(), scratch_floats(holder, a.inner.get_size()));
}

void finish_output(const Arg& a, memory written, float* user, dnnl::stream& s) {
  if (!a.converts()) return;
  memory um(a.outer, cpu_engine(), user);
  a.reorder.execute(s, written, um);
}

memory scratchpad(size_t bytes, Tensor& holder) {
  return memory({{static_cast<memory::dim>(bytes)}, memory::data_type::u8, Tag::a}, cpu_engine(),
                bytes ? static_cast<void*>(scratch_floats(holder, bytes)) : nullptr);
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

// ---- descriptors of one shape ----
// The oneDNN tag of an activation layout (kernels/layout.h).
Tag activation_tag(int block) {
  switch (block) {
    case 0: return Tag::nchw;
    case 8: return Tag::nChw8c;
    case 16: return Tag::nChw16c;
    default: throw std::invalid_argument("conv2d: no oneDNN layout for " + std::to_string(block) + "-channel blocks");
  }
}

struct Dims {
  memory::dims src, wei, bias, dst, strides, pad;
  Tag src_tag, dst_tag;
  explicit Dims(const Conv2dShape& c)
      : src{c.N, c.IC, c.H, c.W}, wei{c.OC, c.IC, c.KH, c.KW}, bias{c.OC}, dst{c.N, c.OC, c.OH(), c.OW()},
        strides{c.stride_h, c.stride_w}, pad{c.pad_h, c.pad_w}, src_tag(activation_tag(c.src_block)),
        dst_tag(activation_tag(c.dst_block)) {}
  memory::desc any(const memory::dims& d) const { return {d, kF32, Tag::any}; }
  memory::desc plain_src() const { return {src, kF32, src_tag}; }
  memory::desc plain_wei() const { return {wei, kF32, Tag::oihw}; }
  memory::desc plain_bias() const { return {bias, kF32, Tag::x}; }
  memory::desc plain_dst() const { return {dst, kF32, dst_tag}; }
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::convolution_forward::primitive_desc forward_pd(const Dims& d, bool bias) {
  using F = dnnl::convolution_forward;
  const auto pk = dnnl::prop_kind::forward_training;
  const auto algo = dnnl::algorithm::convolution_direct;
  const F::desc desc = bias ? F::desc(pk, algo, d.any(d.src), d.any(d.wei), d.plain_bias(), d.any(d.dst),
                                      d.strides, d.pad, d.pad)
                            : F::desc(pk, algo, d.any(d.src), d.any(d.wei), d.any(d.dst), d.strides, d.pad, d.pad);
  return F::primitive_desc(desc, user_scratchpad(), cpu_engine());
}

// ---- plans ----
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int, int, bool, int>;

Key key_of(const Conv2dShape& c, bool bias, int threads) {
  return {c.N,        c.IC,     c.H,        c.W,         c.OC,        c.KH, c.KW,   c.stride_h,
          c.stride_w, c.pad_h,  c.pad_w,    c.src_block, c.dst_block, bias, threads};
}

struct ForwardPlan {
  dnnl::convolution_forward prim;
  Arg src, wei, dst;
  size_t scratch = 0;
};

struct BackwardDataPlan {
  dnnl::convolution_backward_data prim;
  Arg ddst, wei, dsrc;
  size_t scratch = 0;
};

struct BackwardWeightsPlan {
  dnnl::convolution_backward_weights prim;
  Arg src, ddst, dwei;  // dwei's reorder adds into the caller's gradient
  size_t scratch = 0;
};

const ForwardPlan& forward_plan(const Conv2dShape& c, bool bias, int threads) {
  thread_local std::map<Key, ForwardPlan> cache;
  const Key key = key_of(c, bias, threads);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const Dims d(c);
  const auto pd = forward_pd(d, bias);
  ForwardPlan p;
  p.prim = dnnl::convolution_forward(pd);
  p.src = Arg(d.plain_src(), pd.src_desc(), true);
  p.wei = Arg(d.plain_wei(), pd.weights_desc(), true);
  p.dst = Arg(d.plain_dst(), pd.dst_desc(), false);
  p.scratch = pd.scratchpad_desc().get_size();
  return cache.emplace(key, std::move(p)).first->second;
}

const BackwardDataPlan& backward_data_plan(const Conv2dShape& c, int threads) {
  thread_local std::map<Key, BackwardDataPlan> cache;
  const Key key = key_of(c, false, threads);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using B = dnnl::convolution_backward_data;
  const Dims d(c);
  const auto hint = forward_pd(d, false);
  const B::desc desc(dnnl::algorithm::convolution_direct, d.any(d.src), d.any(d.wei), d.any(d.dst), d.strides,
                     d.pad, d.pad);
  const B::primitive_desc pd(desc, user_scratchpad(), cpu_engine(), hint);
  BackwardDataPlan p;
  p.prim = B(pd);
  p.ddst = Arg(d.plain_dst(), pd.diff_dst_desc(), true);
  p.wei = Arg(d.plain_wei(), pd.weights_desc(), true);
  p.dsrc = Arg(d.plain_src(), pd.diff_src_desc(), false);
  p.scratch = pd.scratchpad_desc().get_size();
  return cache.emplace(key, std::move(p)).first->second;
}

const BackwardWeightsPlan& backward_weights_plan(const Conv2dShape& c, bool bias, int threads) {
  thread_local std::map<Key, BackwardWeightsPlan> cache;
  const Key key = key_of(c, bias, threads);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using B = dnnl::convolution_backward_weights;
  const Dims d(c);
  const auto hint = forward_pd(d, bias);
  const auto algo = dnnl::algorithm::convolution_direct;
  const B::desc desc = bias ? B::desc(algo, d.any(d.src), d.any(d.wei), d.plain_bias(), d.any(d.dst), d.strides,
                                      d.pad, d.pad)
                            : B::desc(algo, d.any(d.src), d.any(d.wei), d.any(d.dst), d.strides, d.pad, d.pad);
  const B::primitive_desc pd(desc, user_scratchpad(), cpu_engine(), hint);
  BackwardWeightsPlan p;
  p.prim = B(pd);
  p.src = Arg(d.plain_src(), pd.src_desc(), true);
  p.ddst = Arg(d.plain_dst(), pd.diff_dst_desc(), true);
  p.dwei = Arg(d.plain_wei(), pd.diff_weights_desc(), false, /*accumulate=*/true);
  p.scratch = pd.scratchpad_desc().get_size();
  return cache.emplace(key, std::move(p)).first->second;
}

}  // namespace

int conv_activation_block() {
  static const int block = [] {
    const Conv2dShape c{.N = 32, .IC = 32, .H = 14, .W = 14, .OC = 32, .KH = 3, .KW = 3, .pad_h = 1, .pad_w = 1};
    const Dims d(c);
    const memory::desc chosen = forward_pd(d, false).src_desc();
    for (int b : {16, 8})
      if (chosen == memory::desc(d.src, kF32, activation_tag(b))) return b;
    return 0;
  }();
  return block;
}

// ---- shape ----
void Conv2dShape::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("conv2d: " + what);
  };
  need(N >= 0, "batch size N must not be negative");
  need(IC > 0 && OC > 0, "channel counts IC and OC must be positive");
  need(H > 0 && W > 0, "image height and width must be positive");
  need(KH > 0 && KW > 0, "kernel height and width must be positive");
  need(stride_h > 0 && stride_w > 0, "strides must be positive");
  need(pad_h >= 0 && pad_w >= 0, "paddings must not be negative");
  need(src_block == 0 || (src_block > 0 && IC % src_block == 0),
       "the input's layout of " + std::to_string(src_block) + "-channel blocks cannot hold IC = " + std::to_string(IC));
  need(dst_block == 0 || (dst_block > 0 && OC % dst_block == 0),
       "the output's layout of " + std::to_string(dst_block) + "-channel blocks cannot hold OC = " +
           std::to_string(OC));
  need(H + 2 * pad_h >= KH && W + 2 * pad_w >= KW,
       "the padded image (" + std::to_string(H + 2 * pad_h) + " x " + std::to_string(W + 2 * pad_w) +
           ") is smaller than the kernel (" + std::to_string(KH) + " x " + std::to_string(KW) + ")");
}

// Multiply-adds of one pass (forward, the input gradient or the weight gradient): every output
// position of every filter over the kernel's window of every input channel.
static double macs(const Conv2dShape& s) {
  return static_cast<double>(s.N * s.OC * s.OH() * s.OW()) * static_cast<double>(s.IC * s.KH * s.KW);
}

// ---- forward ----
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const Conv2dShape& s, int threads) {
  s.validate();
  if (s.N == 0) return;
  count_flops(macs(s) * 2);
  const int t = threads < 1 ? 1 : threads;
  set_budget(t);
  const ForwardPlan& p = forward_plan(s, bias != nullptr, t);
  dnnl::stream& st = thread_stream();
  Tensor src_buf, wei_buf, dst_buf, pad_buf;
  const memory src = input(p.src, inp, src_buf, st);
  const memory wei = input(p.wei, weight, wei_buf, st);
  const memory dst = output(p.dst, out, dst_buf);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst},
                                       {DNNL_ARG_SCRATCHPAD, scratchpad(p.scratch, pad_buf)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory({{s.OC}, kF32, Tag::x}, cpu_engine(), const_cast<float*>(bias)));
  p.prim.execute(st, args);
  finish_output(p.dst, dst, out, st);
  st.wait();
}

// ---- backward ----
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, const Conv2dShape& s, int threads) {
  s.validate();
  if (s.N == 0) return;  // no rows: nothing to write, nothing to add
  count_flops(2 * macs(s) * ((dinp ? 1 : 0) + (dweight ? 1 : 0)));
  const int t = threads < 1 ? 1 : threads;
  set_budget(t);
  dnnl::stream& st = thread_stream();
  // dout converted for the data pass, reused by the weights pass when both chose one layout.
  Tensor ddst_buf;
  memory ddst;
  if (dinp) {
    const BackwardDataPlan& p = backward_data_plan(s, t);
    Tensor wei_buf, dsrc_buf, pad_buf;
    ddst = input(p.ddst, dout, ddst_buf, st);
    const memory wei = input(p.wei, weight, wei_buf, st);
    const memory dsrc = output(p.dsrc, dinp, dsrc_buf);
    p.prim.execute(st, {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc},
                        {DNNL_ARG_SCRATCHPAD, scratchpad(p.scratch, pad_buf)}});
    finish_output(p.dsrc, dsrc, dinp, st);
  }
  if (dweight || dbias) {
    const BackwardWeightsPlan& p = backward_weights_plan(s, dbias != nullptr, t);
    Tensor src_buf, ddst_buf2, dwei_buf, dbias_buf, pad_buf;
    const memory src = input(p.src, inp, src_buf, st);
    if (!ddst || ddst.get_desc() != p.ddst.inner) ddst = input(p.ddst, dout, ddst_buf2, st);
    // Always a temporary (the reorder back adds it into dweight); discarded when dweight is null.
    const memory dwei(p.dwei.inner, cpu_engine(), scratch_floats(dwei_buf, p.dwei.inner.get_size()));
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst},
                                         {DNNL_ARG_DIFF_WEIGHTS, dwei},
                                         {DNNL_ARG_SCRATCHPAD, scratchpad(p.scratch, pad_buf)}};
    float* db = dbias ? scratch_floats(dbias_buf, static_cast<size_t>(s.OC) * sizeof(float)) : nullptr;
    if (dbias) args.emplace(DNNL_ARG_DIFF_BIAS, memory({{s.OC}, kF32, Tag::x}, cpu_engine(), db));
    p.prim.execute(st, args);
    if (dweight) finish_output(p.dwei, dwei, dweight, st);
    st.wait();
    if (dbias)
      for (int64_t o = 0; o < s.OC; ++o) dbias[o] += db[o];
  }
  st.wait();
}

}  // namespace meshtrain::kernels
