#include "meshtrain/model/spec.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

#include "meshtrain/io/json.h"
#include "meshtrain/model/cnn_cost.h"

namespace meshtrain::model {

namespace {

class GPTSpec : public ModelSpec {
 public:
  explicit GPTSpec(GPTConfig c) : cfg_(std::move(c)) {}
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "gpt"; }
  InputKind input() const override { return InputKind::tokens; }
  nlohmann::json to_json() const override { return cfg_.to_json(); }
  int64_t num_units() const override { return cfg_.n_layer; }
  std::unique_ptr<Stage> make_stage(const StageSpec& spec, uint64_t seed, const StageFactories& f) const override {
    return std::make_unique<GPTStage>(cfg_, seed, spec, f.transformer ? f.transformer : plain_layout());
  }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override { return gpt_param_shapes(cfg_); }
  double flops_per_sample(int64_t T) const override { return cfg_.flops_per_token(T) * static_cast<double>(T); }
  int64_t default_batch() const override { return cfg_.batch; }
  int64_t default_seq() const override { return cfg_.seq; }
  const GPTConfig* gpt() const override { return &cfg_; }
  std::vector<OpCost> op_costs(const StageSpec& spec, const CostQuery& q) const override;
  double stage_param_elements(const StageSpec& spec, int tp) const override;
  // (rows, T, C) between blocks, whole on every tp rank (the stages exchange full activations).
  double boundary_bytes(int64_t, int64_t rows, int64_t T, int) const override {
    return 4.0 * static_cast<double>(rows * T * cfg_.n_embd);
  }

 private:
  GPTConfig cfg_;
};

// One rank's share of the layers of a GPT stage (model/stage.h, parallel/tensor/tp_layout.h): what
// each layer saves is what its forward hands to Context::save (tests/model/test_cost.cpp
// checks the sum against a stage's measured Context), FLOPs are 2mnk a product.
std::vector<OpCost> GPTSpec::op_costs(const StageSpec& spec, const CostQuery& q) const {
  const double tp = std::max(1, q.tp);
  const double C = static_cast<double>(cfg_.n_embd), V = static_cast<double>(cfg_.vocab_size);
  const double H = static_cast<double>(cfg_.n_head), T = static_cast<double>(q.T);
  const double N = static_cast<double>(q.rows) * T;   // tokens
  const double Ns = q.sequence_parallel ? N / tp : N;  // tokens of the regions split along T
  const int64_t n_tok = q.rows * q.T;
  const double f = 4.0;  // bytes a float
  auto gemm = [&](std::string name, int64_t m, int64_t n, int64_t k, double saved) {
    OpCost o;
    o.name = std::move(name), o.cls = OpClass::gemm, o.m = m, o.n = n, o.k = k;
    o.fwd_flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    o.bwd_flops = 2 * o.fwd_flops;
    // The bias (kernels/linear.cpp): written into the output before the product, and its
    // gradient summed over the output gradient's rows.
    o.fwd_bytes = o.bwd_bytes = 4.0 * static_cast<double>(m) * static_cast<double>(n);
    o.saved_bytes = saved;
    return o;
  };
  auto memory = [&](std::string name, double fwd, double bwd, double saved, const char* kernel = "add") {
    OpCost o;
    o.name = std::move(name), o.fwd_bytes = fwd, o.bwd_bytes = bwd, o.saved_bytes = saved, o.kernel = kernel;
    return o;
  };
  const int64_t c = cfg_.n_embd, ct = static_cast<int64_t>(C / tp);
  const double Hm = static_cast<double>(cfg_.mlp_width());  // the MLP's hidden width (4C: GPT-2's)
  const int64_t ht = static_cast<int64_t>(Hm / tp);
  std::vector<OpCost> ops;
  if (spec.embedding) {
    OpCost e = memory("embedding", 3 * f * N * C, 3 * f * N * C, 0);
    if (tp > 1) e.tp_fwd_bytes = f * N * C;  // the vocabulary-parallel lookup's partial rows
    ops.push_back(e);
  }
  const int64_t end = spec.end_layer < 0 ? cfg_.n_layer : spec.end_layer;
  for (int64_t i = spec.first_layer; i < end; ++i) {
    const std::string b = "h." + std::to_string(i);
    ops.push_back(memory(b + ".ln_1", 2 * f * Ns * C, 4 * f * Ns * C, f * Ns * (C + 2), "layernorm"));
    ops.push_back(gemm(b + ".attn.c_attn", n_tok, 3 * ct, c, f * Ns * C));
    OpCost a;
    a.name = b + ".attn.core", a.cls = OpClass::attention;
    a.m = q.T, a.n = cfg_.n_embd / cfg_.n_head, a.k = static_cast<int64_t>(H / tp);
    a.fwd_flops = 2.0 * static_cast<double>(q.rows) * T * T * C / tp, a.bwd_flops = 2 * a.fwd_flops;
    a.saved_bytes = f * N * (4 * C + H) / tp;  // qkv, y, log-sum-exp
    a.temp_bytes = f * N * (4 * C / tp + 2 * C);  // dqkv, dy and the residual gradients
    ops.push_back(a);
    // c_proj's saved input is the attention's output y, already counted (one storage).
    OpCost proj = gemm(b + ".attn.c_proj", n_tok, c, ct, 0);
    proj.tp_fwd_bytes = tp > 1 ? f * N * C : 0;
    ops.push_back(proj);
    ops.push_back(memory(b + ".residual_1", 3 * f * Ns * C, 2 * f * Ns * C, 0));
    ops.push_back(memory(b + ".ln_2", 2 * f * Ns * C, 4 * f * Ns * C, f * Ns * (C + 2), "layernorm"));
    OpCost fc = gemm(b + ".mlp.c_fc", n_tok, ht, c, f * Ns * C);
    fc.tp_bwd_bytes = tp > 1 ? f * N * C : 0;
    ops.push_back(fc);
    OpCost g = memory(b + ".mlp.gelu", 2 * f * N * Hm / tp, 3 * f * N * Hm / tp, f * N * Hm / tp, "gelu");
    g.temp_bytes = f * (N * 2 * Hm / tp + 2 * Ns * C);  // dg, dh and the residual gradients
    ops.push_back(g);
    OpCost mp = gemm(b + ".mlp.c_proj", n_tok, c, ht, f * N * Hm / tp);
    mp.tp_fwd_bytes = tp > 1 ? f * N * C : 0;
    ops.push_back(mp);
    OpCost r = memory(b + ".residual_2", 2 * f * Ns * C, 2 * f * Ns * C, 0);
    r.tp_bwd_bytes = tp > 1 ? f * N * C : 0;  // the attention's column input
    r.unit_end = true;
    ops.push_back(r);
  }
  if (spec.head) {
    ops.push_back(memory("ln_f", 2 * f * Ns * C, 4 * f * Ns * C, f * Ns * (C + 2), "layernorm"));
    OpCost h = gemm("head", n_tok, static_cast<int64_t>(V / tp), c, f * N * C);
    h.tp_bwd_bytes = tp > 1 ? f * N * C : 0;
    ops.push_back(h);
    OpCost ce = memory("cross_entropy", 2 * f * N * V / tp, 2 * f * N * V / tp, f * N * (V / tp + 1), "gelu");
    ce.temp_bytes = f * N * 2 * C;  // dlogits in place of the logits; dh
    if (tp > 1) ce.tp_fwd_bytes = 2 * f * N;    // the vocabulary shards' maximum and sum
    ops.push_back(ce);
  }
  return ops;
}

double GPTSpec::stage_param_elements(const StageSpec& spec, int tp_) const {
  const double tp = std::max(1, tp_);
  const double C = static_cast<double>(cfg_.n_embd), V = static_cast<double>(cfg_.vocab_size);
  const double P = static_cast<double>(cfg_.block_size);
  const int64_t end = spec.end_layer < 0 ? cfg_.n_layer : spec.end_layer;
  // A block: c_attn, c_fc (column: weight and bias split), c_proj x2 (row: weight split, bias
  // whole), two layernorms whole; with the MLP's width H (GPT-2: 4C, 12 C^2 + 7C split).
  const double H = static_cast<double>(cfg_.mlp_width());
  const double block = (4 * C * C + 2 * C * H + 3 * C + H) / tp + 2 * C + 4 * C;
  double n = block * static_cast<double>(end - spec.first_layer);
  if (spec.embedding) n += V * C / tp + P * C;
  if (spec.head) n += 2 * C + (spec.embedding ? 0 : V * C / tp);
  return n;
}

class CNNSpec : public ModelSpec {
 public:
  explicit CNNSpec(CNNConfig c) : cfg_(std::move(c)), units_(cnn_num_units(cfg_)) {}
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "cnn"; }
  InputKind input() const override { return InputKind::images; }
  nlohmann::json to_json() const override { return cfg_.to_json(); }
  int64_t num_units() const override { return units_; }
  std::unique_ptr<Stage> make_stage(const StageSpec& spec, uint64_t seed, const StageFactories& f) const override {
    return std::make_unique<CNNStage>(cfg_, seed, spec.first_layer, spec.end_layer, spec.embedding, spec.head, f.conv);
  }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override { return cnn_param_shapes(cfg_); }
  std::vector<std::pair<std::string, Shape>> buffer_shapes() const override { return cnn_buffer_shapes(cfg_); }
  // The sum of cnn_unit_flops, from the counts taken at construction.
  double flops_per_sample(int64_t) const override {
    double sum = 0;
    for (double f : flops_) sum += f;
    return sum;
  }
  int64_t default_batch() const override { return cfg_.batch; }
  Shape sample_shape() const override { return {cfg_.channels, cfg_.height, cfg_.width}; }
  int64_t classes() const override { return cfg_.classes; }
  const CNNConfig* cnn() const override { return &cfg_; }
  std::vector<OpCost> op_costs(const StageSpec& spec, const CostQuery& q) const override;
  double stage_param_elements(const StageSpec& spec, int tp) const override;
  double boundary_bytes(int64_t unit, int64_t rows, int64_t, int tp) const override {
    const Shape& chw = shapes_.at(static_cast<size_t>(unit));
    double n = 1;
    for (int64_t d : chw) n *= static_cast<double>(d);
    return 4.0 * n * static_cast<double>(rows) / std::max(1, tp);
  }
  double skip_bytes(int64_t unit, int64_t rows) const override {
    if (!cfg_.graph) return 0;
    const std::vector<int> skips = unit_skips(*cfg_.graph);
    if (unit < 0 || unit >= static_cast<int64_t>(skips.size())) return 0;
    const int k = skips[static_cast<size_t>(unit)];
    if (k == kNoSkip) return 0;
    const Shape chw{cfg_.channels, cfg_.height, cfg_.width};
    const Shape shape = k < 0 ? chw : infer_shapes(*cfg_.graph, chw)[static_cast<size_t>(k)];
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    return 4.0 * n * static_cast<double>(rows);
  }

 private:
  // What a stage of units [first, end) keeps in one forward, measured on such a stage: a
  // constant part and a part per image (cached). A unit's share is the growth from the stage
  // without it (units share storage across their boundary: one saves its output, the next
  // its input).
  std::pair<double, double> kept_by(int64_t first, int64_t end) const;
  // What unit u allocates beyond what it keeps, at its peak over a forward and a backward of
  // the unit alone, measured the same way: the convolutions' layout conversions and
  // scratchpads, outputs and gradients in flight (a constant part and a part per image).
  std::pair<double, double> transient_of(int64_t unit) const;
  // Per unit: its parameter elements, counted once on the built model (the planner asks
  // for every stage of every layout it tries).
  const std::vector<double>& params_per_unit() const;

  CNNConfig cfg_;
  int64_t units_;
  std::vector<Shape> shapes_ = cnn_unit_shapes(cfg_);
  std::vector<double> flops_ = cnn_unit_flops(cfg_);
  mutable std::mutex probe_mutex_;
  mutable std::map<std::pair<int64_t, int64_t>, std::pair<double, double>> probes_;
  mutable std::map<int64_t, std::pair<double, double>> transients_;
  mutable std::once_flag counted_;
  mutable std::vector<double> params_;
};

namespace {
// A probe's micro-batch: `rows` zero images and labels for a stage, and the stage's input shape.
struct ProbeBatch {
  ProbeBatch(const CNNStage& stage, int64_t rows)
      : in(stage.input_shape(rows, 1)), images(static_cast<size_t>(shape_numel(in)), 0.f),
        targets(static_cast<size_t>(rows), 0),
        mb{.images = images.data(), .targets = targets.data(), .rows = rows} {}
  Shape in;
  std::vector<float> images;
  std::vector<int32_t> targets;
  MicroBatch mb;
};
}  // namespace

std::pair<double, double> CNNSpec::kept_by(int64_t first, int64_t end) const {
  if (end <= first) return {0, 0};
  std::lock_guard<std::mutex> lock(probe_mutex_);
  if (auto it = probes_.find({first, end}); it != probes_.end()) return it->second;
  CNNStage stage(cfg_, 0, first, end, first == 0, end == units_);
  // The tensor memory the forward keeps (a storage two layers save counts once): what is live
  // after it once the input and output handles are dropped (each counts when a layer keeps
  // it). At 1 and 2 images: a constant part (per-channel statistics) and a part per image.
  auto kept = [&](int64_t rows) {
    const ProbeBatch b(stage, rows);
    const int64_t before = tensor_bytes_live_thread();
    nn::Context ctx(1, true);
    {
      StageResult r;
      Tensor x = first == 0 ? Tensor() : Tensor::zeros(b.in);
      stage.forward(ctx, x, b.mb, &r, nullptr);
    }
    return static_cast<double>(tensor_bytes_live_thread() - before);
  };
  const double one = kept(1), two = kept(2);
  return probes_[{first, end}] = {2 * one - two, two - one};
}

std::pair<double, double> CNNSpec::transient_of(int64_t u) const {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  if (auto it = transients_.find(u); it != transients_.end()) return it->second;
  const bool first = u == 0, last = u + 1 == units_;
  CNNStage stage(cfg_, 0, u, u + 1, first, last);
  auto transient = [&](int64_t rows) {
    const ProbeBatch b(stage, rows);
    const Tensor x = first ? Tensor() : Tensor::zeros(b.in);
    nn::Context ctx(1, true);
    const int64_t before = tensor_bytes_live_thread();
    reset_tensor_bytes_peak_thread();
    int64_t kept = 0;
    {
      StageResult r;
      Tensor y = stage.forward(ctx, x, b.mb, &r, nullptr);
      const Shape out = y.shape();
      y = Tensor();
      kept = tensor_bytes_live_thread() - before;
      const Tensor dy = last ? Tensor() : Tensor::zeros(out);
      stage.backward(ctx, dy, 1.0f, nullptr);
    }
    return static_cast<double>(tensor_bytes_peak_thread() - before - kept);
  };
  const double one = transient(1), two = transient(2);
  return transients_[u] = {2 * one - two, two - one};
}

// Per layer as the compiler builds it (model/cnn_cost.h: its shape class, its layout's share
// and communication); per unit what its layers keep (measured, kept_by) and what it allocates
// for a while beyond that (measured, transient_of), on the unit's last op.
std::vector<OpCost> CNNSpec::op_costs(const StageSpec& spec, const CostQuery& q) const {
  const double tp = std::max(1, q.tp), rows = static_cast<double>(q.rows);
  const int64_t end = spec.end_layer < 0 ? units_ : spec.end_layer;
  std::vector<OpCost> ops = cnn_layer_costs(cfg_, spec.first_layer, end, spec.head, q);
  int64_t u = spec.first_layer;
  for (OpCost& o : ops) {
    if (!o.unit_end) continue;
    const auto [c1, p1] = kept_by(spec.first_layer, u + 1);
    const auto [c0, p0] = kept_by(spec.first_layer, u);
    o.saved_bytes = (c1 - c0 + (p1 - p0) * rows) / tp;
    const auto [t0, t1] = transient_of(u);
    o.temp_bytes = std::max(0.0, t0 + t1 * rows) / tp;
    ++u;
  }
  return ops;
}

const std::vector<double>& CNNSpec::params_per_unit() const {
  std::call_once(counted_, [&] {
    auto all = build_cnn_units(cfg_, 0, *single_rank_cnn_layout());
    for (const auto& unit : all) {
      std::vector<nn::Param*> ps;
      unit->collect_params(ps);
      double n = 0;
      for (nn::Param* p : ps) n += static_cast<double>(p->value.numel());
      params_.push_back(n);
    }
  });
  return params_;
}

double CNNSpec::stage_param_elements(const StageSpec& spec, int tp) const {
  const int64_t end = spec.end_layer < 0 ? units_ : spec.end_layer;
  const std::vector<double>& per_unit = params_per_unit();
  double n = 0;
  for (int64_t u = spec.first_layer; u < end; ++u) n += per_unit[static_cast<size_t>(u)];
  return n / std::max(1, tp);
}

}  // namespace

std::shared_ptr<const ModelSpec> gpt_spec(const GPTConfig& cfg) { return std::make_shared<GPTSpec>(cfg); }
std::shared_ptr<const ModelSpec> cnn_spec(const CNNConfig& cfg) { return std::make_shared<CNNSpec>(cfg); }

std::vector<TorchEntry> torch_state_dict(const ModelSpec& spec) {
  std::vector<TorchEntry> out;
  for (const auto& [name, shape] : spec.param_shapes()) {
    const bool linear = shape.size() == 2 && name.ends_with(".weight");
    out.push_back({name, linear ? Shape{shape[1], shape[0]} : shape, linear, false});
  }
  // Buffers after the parameters, as nn.Module lists them (a module's parameters, then its buffers).
  for (const auto& [name, shape] : spec.buffer_shapes()) {
    out.push_back({name, shape, false, false});
    if (name.ends_with(".running_var"))
      out.push_back({name.substr(0, name.size() - 12) + ".num_batches_tracked", Shape{}, false, true});
  }
  return out;
}

namespace {
Graph (*onnx_reader)(const std::string&) = nullptr;
}  // namespace

void set_onnx_reader(Graph (*reader)(const std::string& path)) { onnx_reader = reader; }
bool is_onnx_path(const std::string& name) { return name.size() > 5 && name.ends_with(".onnx"); }

bool is_cnn_name(const std::string& name) {
  for (const std::string& n : cnn_config_names())
    if (n == name) return true;
  // a model file: a layer graph (or a config), or an ONNX file of an image classifier
  return (name.size() > 5 && name.ends_with(".json")) || is_onnx_path(name);
}

std::shared_ptr<const ModelSpec> model_spec(const std::string& name) {
  if (name.size() > 5 && name.ends_with(".json")) return model_spec_from_file(name);
  if (is_onnx_path(name)) {
    if (!onnx_reader)
      throw std::invalid_argument(name + " is an ONNX file, and this program was built without ONNX import "
                                  "(install libonnx-dev and rebuild, or give a model file, --model FILE.json)");
    return cnn_spec(cnn_config(std::make_shared<const Graph>(onnx_reader(name))));
  }
  if (is_cnn_name(name)) return cnn_spec(cnn_config(name));
  try {
    return gpt_spec(gpt_config(name));
  } catch (const std::invalid_argument&) {
    std::string names;
    for (const std::string& n : gpt_config_names()) names += n + ", ";
    for (const std::string& n : cnn_config_names()) names += n + ", ";
    names.resize(names.size() - 2);
    throw std::invalid_argument("unknown model '" + name + "'; the named models are " + names +
                                " (or a model file, --model FILE.json)");
  }
}

std::shared_ptr<const ModelSpec> model_spec_from_file(const std::string& path) {
  const std::string source = "model config file " + path;
  // The strict reading every JSON file gets (io/json.h): a key given twice ("scale", "name")
  // is refused, not taken at its last value.
  const std::string text = io::read_text_file(path, source, "give a model file (JSON) or a named model");
  nlohmann::json j = io::parse_json_strict(text, source,
                                           "it must be an object such as {\"n_layer\": 4, \"n_embd\": 128, ...} or "
                                           "{\"family\": \"cnn\", \"name\": \"resnet-small\"}, or a layer graph "
                                           "{\"name\": ..., \"input\": ..., \"layers\": [...]}");
  if (!j.is_object())
    throw std::invalid_argument(source + " is " + std::string(j.type_name()) + ", but a model file must be a JSON object: "
                                "a layer graph {\"name\": ..., \"input\": ..., \"layers\": [...]} (docs/models.md) or a GPT "
                                "config {\"n_layer\": ..., \"n_embd\": ..., ...} (README)");
  if (is_graph_json(j)) {
    auto g = std::make_shared<const Graph>(parse_graph(j, source));
    return g->tokens() ? gpt_spec(gpt_config(*g)) : cnn_spec(cnn_config(g));
  }
  if (j.is_object() && j.contains("family") && j["family"] != "gpt") {
    if (j["family"] != "cnn")
      throw std::invalid_argument(source + ": \"family\" must be \"gpt\" or \"cnn\", not " + j["family"].dump());
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "family" && it.key() != "name" && it.key() != "scale")
        throw std::invalid_argument(source + ": unknown field \"" + it.key() +
                                    "\" for a CNN; give \"family\": \"cnn\", \"name\": one of cnn-small, "
                                    "resnet-small, inception-small, and optionally \"scale\"");
    if (!j.contains("name") || !j["name"].is_string())
      throw std::invalid_argument(source + ": a CNN config needs \"name\": cnn-small, resnet-small or inception-small");
    CNNConfig cfg;
    try {
      cfg = cnn_config(j["name"].get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(source + ": " + e.what());
    }
    // "scale": k takes images k times larger each way (the data set's upsampled, nearest
    // neighbour), e.g. 4 for 112 x 112 from Fashion-MNIST's 28 x 28.
    if (j.contains("scale")) {
      const auto& k = j["scale"];
      if (!k.is_number_integer() || k.get<int64_t>() < 1 || k.get<int64_t>() > 16)
        throw std::invalid_argument(source + ": \"scale\" must be an integer 1..16 (the input's size over the data "
                                    "set's), not " + k.dump());
      cfg.scale = k.get<int64_t>();
      cfg.height *= cfg.scale;
      cfg.width *= cfg.scale;
    }
    return cnn_spec(cfg);
  }
  return gpt_spec(gpt_config_from_file(path));  // every check of a GPT config (and of bad JSON)
}

}  // namespace meshtrain::model
