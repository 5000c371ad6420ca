#include "meshtrain/plan/calibrate_cnn.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/kernels/conv.h"
#include "meshtrain/kernels/elementwise.h"
#include "meshtrain/kernels/layout.h"
#include "meshtrain/nn/activation.h"
#include "meshtrain/nn/batchnorm.h"
#include "meshtrain/nn/context.h"
#include "meshtrain/nn/pool.h"
#include "meshtrain/nn/shape.h"
#include "meshtrain/plan/calibrate_kernels.h"

namespace meshtrain::plan::detail {

double median_seconds(std::vector<double> times) {
  if (times.empty()) return 0;
  const auto mid = times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2);
  std::nth_element(times.begin(), mid, times.end());
  return *mid;
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The calling thread's CPU time: a call on one thread runs on it alone, so this is its time
// on a core whatever else the machine runs (the wall clock counts the time it waited for one).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The median of `reps` runs (at least `min_total` seconds of them) of each of two calls made one
// after the other (a layer's forward, then its backward). On one thread, its CPU time (the
// smaller of the two clocks): other work on a loaded machine does not stretch it.
std::pair<double, double> median_pair(const std::function<void()>& a, const std::function<void()>& b, int reps,
                                      double min_total, bool one_thread) {
  a(), b();  // untimed: primitives built, pages touched
  const auto start = Clock::now();
  auto timed = [&](const std::function<void()>& f) {
    const double c0 = thread_cpu_s();
    const auto t0 = Clock::now();
    f();
    const double wall = since(t0);
    return one_thread ? std::min(wall, thread_cpu_s() - c0) : wall;
  };
  std::vector<double> ta, tb;
  for (int i = 0; i < reps || since(start) < min_total; ++i) {
    ta.push_back(timed(a));
    tb.push_back(timed(b));
    if (i > 5000) break;
  }
  return {median_seconds(std::move(ta)), median_seconds(std::move(tb))};
}

struct ConvClass {
  int64_t ic, oc, k, stride, h;
};

// Small image models' convolutions (models/*.json, examples/models/*.json and their like):
// stems from one channel, 3 x 3 and 5 x 5 at 28, 14 and 7, 1 x 1 projections and reductions,
// strided downsampling.
std::vector<ConvClass> conv_classes(bool quick) {
  if (quick)
    return {{1, 32, 3, 1, 28}, {32, 64, 3, 1, 14}, {32, 16, 1, 1, 14}};
  return {{1, 32, 3, 1, 28},  {1, 8, 5, 1, 28},    {8, 16, 3, 1, 14},  {16, 16, 3, 1, 28},  {32, 32, 3, 1, 28},
          {16, 32, 3, 1, 14}, {32, 64, 3, 1, 14},  {64, 64, 3, 1, 14}, {64, 128, 3, 1, 7},  {128, 128, 3, 1, 7},
          {32, 64, 3, 2, 28}, {64, 128, 3, 2, 14}, {8, 16, 5, 1, 14},  {16, 32, 5, 1, 14},  {32, 16, 1, 1, 14},
          {64, 32, 1, 1, 14}, {16, 8, 1, 1, 28},   {32, 64, 1, 2, 28}, {64, 128, 1, 2, 14}, {128, 32, 1, 1, 7}};
}

ConvRate measure_conv(const ConvClass& c, int64_t n, bool blocked, int threads, bool quick) {
  const int b = blocked ? kernels::conv_activation_block() : 0;
  kernels::Conv2dShape s;
  s.N = n, s.IC = c.ic, s.H = c.h, s.W = c.h, s.OC = c.oc, s.KH = c.k, s.KW = c.k;
  s.stride_h = s.stride_w = c.stride, s.pad_h = s.pad_w = c.k / 2;
  s.src_block = b > 0 && c.ic % b == 0 ? b : 0;
  s.dst_block = b > 0 && c.oc % b == 0 ? b : 0;
  const int64_t in = s.N * s.IC * s.H * s.W, out = s.N * s.OC * s.OH() * s.OW(), wn = s.OC * s.IC * s.KH * s.KW;
  std::vector<float> x(static_cast<size_t>(in), 0.5f), dx(static_cast<size_t>(in)), y(static_cast<size_t>(out)),
      dy(static_cast<size_t>(out), 0.01f), w(static_cast<size_t>(wn), 0.1f), dw(static_cast<size_t>(wn)),
      bias(static_cast<size_t>(s.OC)), db(static_cast<size_t>(s.OC));
  const int reps = quick ? 3 : 5;
  const double min_total = quick ? 0.01 : 0.03;  // a round's
  auto [f, d] = median_pair([&] { kernels::conv2d_forward(y.data(), x.data(), w.data(), bias.data(), s, threads); },
                          [&] { kernels::conv2d_backward(dx.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), s, threads); },
                          reps, min_total, threads == 1);
  auto [wt, unused] = median_pair(
      [&] { kernels::conv2d_backward(nullptr, dw.data(), db.data(), dy.data(), x.data(), w.data(), s, threads); }, [] {},
      reps, min_total, threads == 1);
  (void)unused;
  const double flops = 2.0 * static_cast<double>(s.N * s.OH() * s.OW()) * static_cast<double>(s.OC * s.IC * s.KH * s.KW);
  ConvRate r;
  r.format = blocked ? "blocked" : "nchw";
  r.n = s.N, r.ic = c.ic, r.oc = c.oc, r.k = c.k, r.stride = c.stride, r.h = c.h, r.threads = threads;
  r.fwd_gflops = flops / f / 1e9, r.bwd_data_gflops = flops / d / 1e9, r.bwd_weights_gflops = flops / wt / 1e9;
  return r;
}

// A layer on an (n, 32, h, h) input through a Context, forward then backward.
LayerRate measure_layer(const std::string& op, bool blocked, int64_t n, int64_t h, int threads, bool quick) {
  const int64_t C = 32;
  const int b = blocked ? kernels::conv_activation_block() : 0;
  const int block = b > 0 && C % b == 0 ? b : 0;
  const Shape shape{n, C, h, h};
  Tensor x = Tensor::zeros(shape), other = Tensor::zeros(shape);
  x.fill(0.5f), other.fill(-0.25f);
  std::unique_ptr<nn::Layer> layer;
  std::function<void()> fwd, bwd;
  std::unique_ptr<nn::Context> ctx;
  Tensor y, dy;
  auto with_layer = [&](std::unique_ptr<nn::Layer> l) {
    layer = std::move(l);
    fwd = [&] {
      ctx = std::make_unique<nn::Context>(threads, true);
      y = layer->forward(*ctx, x);
      if (dy.shape() != y.shape()) dy = Tensor::zeros(y.shape()), dy.fill(0.01f);
    };
    bwd = [&] { (void)layer->backward(*ctx, dy); };
  };
  nn::ConcatChannels cat;
  nn::ReLU relu;
  if (op == "batchnorm" || op == "batchnorm_relu") {
    auto bn = std::make_unique<nn::BatchNorm2d>("calibrate.bn", C);
    bn->block = block, bn->relu_after = op == "batchnorm_relu";
    with_layer(std::move(bn));
  } else if (op == "relu") {
    with_layer(std::make_unique<nn::ReLU>());
  } else if (op == "maxpool") {
    with_layer(std::make_unique<nn::MaxPool2d>(2));
  } else if (op == "avgpool") {
    with_layer(std::make_unique<nn::AvgPool2d>(2));
  } else if (op == "global_pool") {
    with_layer(std::make_unique<nn::GlobalAvgPool>(block));
  } else if (op == "flatten") {
    with_layer(std::make_unique<nn::Flatten>());
  } else if (op == "add_relu") {
    fwd = [&] {
      ctx = std::make_unique<nn::Context>(threads, true);
      y = relu.forward_sum(*ctx, x, other);
      if (dy.shape() != y.shape()) dy = Tensor::zeros(y.shape()), dy.fill(0.01f);
    };
    bwd = [&] { (void)relu.backward(*ctx, dy); };
  } else if (op == "add") {  // the sum; backward: the gradients of its source summed (graph.h)
    y = Tensor::zeros(shape);
    fwd = [&] { kernels::add(y.data(), x.data(), other.data(), x.numel(), threads); };
    bwd = [&] { kernels::add(y.data(), x.data(), other.data(), x.numel(), threads); };
  } else if (op == "concat") {  // two halves of the channels joined
    const Shape half{n, C / 2, h, h};
    std::vector<Tensor> parts{Tensor::zeros(half), Tensor::zeros(half)};
    fwd = [&, parts] {
      ctx = std::make_unique<nn::Context>(threads, true);
      y = cat.forward(*ctx, parts);
      if (dy.shape() != y.shape()) dy = Tensor::zeros(y.shape()), dy.fill(0.01f);
    };
    bwd = [&] { (void)cat.backward(*ctx, dy); };
  } else {  // reorder: NCHW to the blocked layout (forward) and back (backward)
    y = Tensor::zeros(shape);
    const int rb = b > 0 ? b : 16;
    fwd = [&, rb] { kernels::to_activation_layout(y.data(), x.data(), n, C, h * h, rb); };
    bwd = [&, rb] { kernels::from_activation_layout(other.data(), y.data(), n, C, h * h, rb); };
  }
  const auto [f, bw] = median_pair(fwd, bwd, quick ? 3 : 5, quick ? 0.01 : 0.02, threads == 1);  // a round's
  LayerRate r;
  r.op = op, r.format = blocked ? "blocked" : "nchw", r.elements = x.numel(), r.threads = threads;
  r.fwd_s = std::max(f, 1e-9), r.bwd_s = std::max(bw, 1e-9);
  return r;
}

}  // namespace

ConvRate median_conv(const std::vector<ConvRate>& rounds) {
  return median_of_rounds(rounds, {&ConvRate::fwd_gflops, &ConvRate::bwd_data_gflops, &ConvRate::bwd_weights_gflops});
}

LayerRate median_layer(const std::vector<LayerRate>& rounds) {
  return median_of_rounds(rounds, {&LayerRate::fwd_s, &LayerRate::bwd_s});
}

void add_cnn_tasks(MachineProfile& p, const std::vector<int>& threads, bool quick, RoundTasks& tasks, int rounds) {
  const int block = kernels::conv_activation_block();
  // One measuring function per row, run in rounds below: a convolution's row or a layer's.
  struct Row {
    std::optional<ConvRate> conv;
    std::optional<LayerRate> layer;
  };
  std::vector<std::function<Row()>> rows;
  for (const ConvClass& c : conv_classes(quick))
    for (bool blocked : {true, false}) {
      // The blocked format differs from NCHW only where a channel count divides by the block.
      if (blocked && (block == 0 || (c.ic % block != 0 && c.oc % block != 0))) continue;
      // A small micro-batch (the activations in the core's caches) and a large one (the layout
      // conversions of NCHW calls go to memory): the cost model picks by output positions.
      for (int64_t n : quick ? std::vector<int64_t>{32} : std::vector<int64_t>{8, 64})
        for (int t : threads)
          rows.push_back([c, n, blocked, t, quick] { return Row{measure_conv(c, n, blocked, t, quick), {}}; });
    }
  // (n, h): 25 Ki floats (the caches), 784 Ki and 1.5 Mi floats
  // (quick: the middle one alone, priced in proportion to the elements).
  std::vector<std::pair<int64_t, int64_t>> sizes{{32, 28}};
  if (!quick) sizes = {{4, 14}, {32, 28}, {64, 28}};
  struct Op {
    const char* name;
    bool both_formats;
  };
  const Op ops[] = {{"batchnorm", true}, {"batchnorm_relu", true}, {"relu", false},       {"add", false},
                    {"add_relu", false}, {"maxpool", false},       {"avgpool", false},     {"global_pool", true},
                    {"concat", false},   {"flatten", false},       {"reorder", false}};
  for (const Op& op : ops)
    for (bool blocked : {false, true}) {
      if (blocked && (!op.both_formats || block == 0)) continue;
      for (const auto& [n, h] : sizes)
        for (int t : threads)
          rows.push_back([name = std::string(op.name), blocked, n, h, t, quick] {
            return Row{{}, measure_layer(name, blocked, n, h, t, quick)};
          });
    }

  // The rounds' figures of every row, then each row's median into the machine file.
  const auto line = [](const Row& row) {
    if (row.conv) {
      const ConvRate& r = *row.conv;
      return "conv " + r.format + " n" + std::to_string(r.n) + " " + std::to_string(r.ic) + "->" + std::to_string(r.oc) + " k" +
             std::to_string(r.k) + " s" + std::to_string(r.stride) + " at " + std::to_string(r.h) + " threads " +
             std::to_string(r.threads) + ": " + fmt("%.1f", r.fwd_gflops) + " / " + fmt("%.1f", r.bwd_data_gflops) + " / " +
             fmt("%.1f", r.bwd_weights_gflops) + " GFLOP/s (forward / data / weights)";
    }
    const LayerRate& r = *row.layer;
    return r.op + " " + r.format + " " + std::to_string(r.elements) + " floats threads " + std::to_string(r.threads) + ": " +
           fmt("%.1f", r.fwd_s * 1e6) + " / " + fmt("%.1f", r.bwd_s * 1e6) + " us (forward / backward)";
  };
  const auto keep = [&p, rounds = std::max(1, rounds)](const std::vector<std::vector<Row>>& measured) {
    for (const std::vector<Row>& of : measured) {
      std::vector<ConvRate> conv;
      std::vector<LayerRate> layer;
      for (const Row& r : of) {
        if (r.conv) conv.push_back(*r.conv);
        if (r.layer) layer.push_back(*r.layer);
      }
      if (!conv.empty()) p.conv.push_back(median_conv(conv));
      if (!layer.empty()) p.cnn_layers.push_back(median_layer(layer));
    }
    return "convolutional layers: " + std::to_string(p.conv.size()) + " convolution and " + std::to_string(p.cnn_layers.size()) +
           " layer rows, each the median of " + std::to_string(rounds) + " round(s)";
  };
  add_round_tasks<Row>(std::move(rows), line, keep, tasks, rounds);
}

}  // namespace meshtrain::plan::detail
