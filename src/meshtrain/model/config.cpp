#include "meshtrain/model/config.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "meshtrain/io/json.h"
#include "meshtrain/model/graph.h"

namespace meshtrain::model {

int64_t GPTConfig::num_params() const {
  const int64_t C = n_embd, H = mlp_width();
  int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * H + H) + (H * C + C);
  return vocab_size * C + block_size * C + n_layer * per_layer + 2 * C;
}

double GPTConfig::flops_per_token(int64_t T) const {
  // 6 flops per parameter per token (forward 2, backward 4), without the position table,
  // plus the attention matmuls: q.k and p.v, 2*T*C each per layer forward, halved by the
  // causal mask, times 3 for forward + backward.
  double n = static_cast<double>(num_params() - block_size * n_embd);
  return 6.0 * n + 6.0 * static_cast<double>(n_layer) * static_cast<double>(T) * n_embd;
}

double GPTConfig::activation_bytes(int64_t B, int64_t T) const {
  // 8C + 2H a layer and token: with GPT-2's MLP (H = 4C), 16C.
  const double C = static_cast<double>(n_embd), H = static_cast<double>(mlp_width());
  double per_token = static_cast<double>(n_layer) * (8 * C + 2 * H + static_cast<double>(n_head) + 4) +
                     (C + 2) + C + static_cast<double>(vocab_size) + 1;
  return 4.0 * per_token * static_cast<double>(B * T);
}

void GPTConfig::validate() const {
  auto bad = [&](const std::string& what) {
    throw std::invalid_argument("model " + name + ": " + what);
  };
  auto in_range = [&](const char* field, int64_t v, int64_t lo) {
    if (v < lo || v > kMaxField)
      bad(std::string(field) + " must be between " + std::to_string(lo) + " and " + std::to_string(kMaxField) +
          ", got " + std::to_string(v));
  };
  in_range("n_layer", n_layer, 1);
  in_range("n_embd", n_embd, 1);
  in_range("n_head", n_head, 1);
  in_range("vocab_size", vocab_size, 2);
  in_range("block_size", block_size, 1);
  if (n_inner != 0) in_range("n_inner", n_inner, 1);
  if (n_embd % n_head != 0)
    bad("n_embd " + std::to_string(n_embd) + " is not divisible by n_head " +
        std::to_string(n_head) + "; pick n_head dividing it");
  if ((skip_from >= 0) != (skip_to >= 0) || skip_from < -1 || skip_to < -1)
    bad("skip_from and skip_to come together (both -1: no skip connection)");
  if (skip_from >= 0 && !(skip_from + 1 < skip_to && skip_to < n_layer))
    bad("the skip connection from block " + std::to_string(skip_from) + " to block " + std::to_string(skip_to) +
        " must jump over at least one block and end inside the model's " + std::to_string(n_layer) +
        " blocks (skip_from + 1 < skip_to < n_layer)");
}

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j = {{"name", name},           {"n_layer", n_layer},       {"n_embd", n_embd},
                      {"n_head", n_head},       {"vocab_size", vocab_size}, {"block_size", block_size},
                      {"batch", batch},         {"seq", seq}};
  if (has_skip()) j["skip_from"] = skip_from, j["skip_to"] = skip_to;  // absent: no skip
  if (n_inner > 0) j["n_inner"] = n_inner;                              // absent: 4 x n_embd
  if (gelu_exact) j["activation_function"] = "gelu";                    // absent: "gelu_new"
  return j;
}

namespace {

// One integer field of a config object: a JSON integer (or a float with an integral value)
// within [lo, GPTConfig::kMaxField].
int64_t int_field(const nlohmann::json& j, const char* field, int64_t lo, const std::string& source) {
  const nlohmann::json& v = j.at(field);
  const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(GPTConfig::kMaxField);
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(source + ": field \"" + field + "\" must be " + range + ", " + what);
  };
  if (v.is_number_unsigned()) {
    // nlohmann stores every non-negative integer as unsigned, 0 included.
    if (v.get<uint64_t>() < static_cast<uint64_t>(lo) || v.get<uint64_t>() > static_cast<uint64_t>(GPTConfig::kMaxField))
      fail("got " + v.dump());
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) {
    if (v.get<int64_t>() < lo || v.get<int64_t>() > GPTConfig::kMaxField) fail("got " + v.dump());
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(GPTConfig::kMaxField))) fail("got " + v.dump());
    if (d != std::floor(d)) fail("not the fraction " + v.dump());
    return static_cast<int64_t>(d);
  }
  fail("not the " + std::string(v.type_name()) + " " + v.dump());
  return 0;  // not reached
}

}  // namespace

GPTConfig GPTConfig::from_json(const nlohmann::json& j, const std::string& source) {
  static const char* required[] = {"n_layer", "n_embd", "n_head", "vocab_size", "block_size"};
  static const char* optional[] = {"name",    "batch", "seq", "skip_from", "skip_to", "family",
                                   "n_inner", "activation_function"};
  const std::string fields =
      "n_layer, n_embd, n_head, vocab_size, block_size (required) and name, batch, seq, n_inner, activation_function, "
      "skip_from, skip_to";
  if (!j.is_object())
    throw std::invalid_argument(source + " must be a JSON object with the fields " + fields + ", not " +
                                (j.is_array() ? "an array" : "a " + std::string(j.type_name())));
  for (auto& [key, value] : j.items()) {
    auto known = [&](const char* k) { return key == k; };
    if (std::none_of(std::begin(required), std::end(required), known) &&
        std::none_of(std::begin(optional), std::end(optional), known))
      throw std::invalid_argument(source + ": unknown field \"" + key + "\"; the fields are " + fields);
  }
  std::string missing;
  for (const char* k : required)
    if (!j.contains(k)) missing += std::string(missing.empty() ? "" : ", ") + k;
  if (!missing.empty()) throw std::invalid_argument(source + ": missing field(s) " + missing + "; the fields are " + fields);
  if (j.contains("family") && j["family"] != "gpt")
    throw std::invalid_argument(source + ": field \"family\" of a GPT config must be \"gpt\", not " + j["family"].dump());
  GPTConfig c;
  if (j.contains("name")) {
    if (!j["name"].is_string())
      throw std::invalid_argument(source + ": field \"name\" must be a string, not " + j["name"].dump());
    c.name = j["name"].get<std::string>();
  }
  c.n_layer = int_field(j, "n_layer", 1, source);
  c.n_embd = int_field(j, "n_embd", 1, source);
  c.n_head = int_field(j, "n_head", 1, source);
  c.vocab_size = int_field(j, "vocab_size", 2, source);
  c.block_size = int_field(j, "block_size", 1, source);
  c.batch = j.contains("batch") ? int_field(j, "batch", 1, source) : c.batch;
  c.seq = j.contains("seq") ? int_field(j, "seq", 1, source) : std::min(c.block_size, c.seq);
  if (j.contains("n_inner")) c.n_inner = int_field(j, "n_inner", 1, source);
  if (j.contains("activation_function")) {
    const nlohmann::json& a = j["activation_function"];
    if (a != "gelu_new" && a != "gelu")
      throw std::invalid_argument(source + ": field \"activation_function\" is " + a.dump() +
                                  "; give \"gelu_new\" (the tanh GELU, GPT-2's) or \"gelu\" (the exact one)");
    c.gelu_exact = a == "gelu";
  }
  if (j.contains("skip_from") != j.contains("skip_to"))
    throw std::invalid_argument(source + ": give both skip_from and skip_to (a skip connection's two blocks), or neither");
  if (j.contains("skip_from")) {
    c.skip_from = int_field(j, "skip_from", 0, source);
    c.skip_to = int_field(j, "skip_to", 0, source);
    if (!(c.skip_from + 1 < c.skip_to && c.skip_to < c.n_layer))
      throw std::invalid_argument(source + ": the skip connection from block " + std::to_string(c.skip_from) +
                                  " to block " + std::to_string(c.skip_to) + " must jump over at least one block and end "
                                  "inside the " + std::to_string(c.n_layer) + " blocks (skip_from + 1 < skip_to < n_layer)");
  }
  if (c.n_embd % c.n_head != 0)
    throw std::invalid_argument(source + ": n_embd " + std::to_string(c.n_embd) + " is not divisible by n_head " +
                                std::to_string(c.n_head) + "; pick an n_head that divides it");
  if (c.seq > c.block_size)
    throw std::invalid_argument(source + ": field \"seq\" (the default sequence length) " + std::to_string(c.seq) +
                                " is longer than block_size " + std::to_string(c.block_size) +
                                "; lower seq or raise block_size");
  c.validate();
  return c;
}

GPTConfig gpt_config(const std::string& name) {
  const std::shared_ptr<const Graph> g = named_graph(name);
  if (!g || !g->tokens()) {
    std::string names;
    for (auto& n : gpt_config_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model '" + name + "'; choose one of " + names +
                                ", or give --config FILE.json");
  }
  return gpt_config(*g);
}

std::vector<std::string> gpt_config_names() {  // smallest first
  std::vector<std::pair<int64_t, std::string>> by_size;
  for (const std::string& n : named_graph_names())
    if (named_graph(n)->tokens()) by_size.push_back({gpt_config(*named_graph(n)).num_params(), n});
  std::sort(by_size.begin(), by_size.end());
  std::vector<std::string> v;
  for (auto& [size, n] : by_size) v.push_back(n);
  return v;
}

GPTConfig gpt_config(const Graph& g) {
  const size_t n = g.layers.size();
  size_t i = 0;
  auto fail = [&](size_t at, const std::string& what) {
    std::string where = at < n ? "layer " + std::to_string(at) + " '" + g.layers[at].name + "' (" +
                                     op_name(g.layers[at].op) + ") "
                               : "the last layer ";
    throw std::invalid_argument(g.name + ": " + where + what +
                                "; a token model is a GPT: token and position embeddings, pre-norm blocks, ln_f and "
                                "a head tied to the token embedding (docs/models.md)");
  };
  // The next layer: op `op` reading exactly `from` (in any order), named `name` where its
  // parameters' names depend on it.
  auto expect = [&](Op op, const std::string& name, std::vector<int> from, const std::string& role) -> size_t {
    if (i >= n) fail(n, "ends the graph where " + role + " should follow");
    const GraphLayer& L = g.layers[i];
    if (L.op != op) fail(i, "is where " + role + " (" + op_name(op) + ") should be");
    if (!name.empty() && L.name != name)
      fail(i, "is " + role + "; name it '" + name + "', its parameters' state-dict prefix in meshtrain's transformer");
    std::vector<int> got = L.from;
    std::sort(got.begin(), got.end());
    std::sort(from.begin(), from.end());
    if (got != from) {
      std::string want;
      for (int k : from) want += (want.empty() ? "'" : ", '") + (k < 0 ? std::string("input") : g.layers[static_cast<size_t>(k)].name) + "'";
      fail(i, "is " + role + " and must read " + want);
    }
    return i++;
  };
  auto eps = [&](size_t k) {
    if (g.layers[k].eps != 1e-5) fail(k, "has eps " + nlohmann::json(g.layers[k].eps).dump() + "; meshtrain's layernorm uses 1e-5");
  };
  for (size_t k = 0; k < n; ++k)
    if (!g.layers[k].unit.empty()) fail(k, "has a \"unit\"; a token model's pipeline units are its blocks: drop it");
  GPTConfig c;
  c.name = g.name;
  c.vocab_size = g.vocab;
  const size_t wte = expect(Op::embedding, "wte", {-1}, "the token embedding");
  const size_t wpe = expect(Op::position_embedding, "wpe", {-1}, "the position embedding");
  c.n_embd = g.layers[wte].out_channels;
  c.block_size = g.layers[wpe].num_embeddings;
  int x = static_cast<int>(expect(Op::add, "", {static_cast<int>(wte), static_cast<int>(wpe)}, "the sum of the embeddings"));
  std::vector<int> block_out;
  while (i < n && g.layers[i].name != "ln_f") {
    const int64_t b = static_cast<int64_t>(block_out.size());
    const std::string h = "h." + std::to_string(b);
    if (g.layers[i].op == Op::add) {  // a long skip into this block's input
      const GraphLayer& s = g.layers[i];
      const int other = s.from.size() == 2 && (s.from[0] == x || s.from[1] == x) ? s.from[s.from[0] == x] : -2;
      const auto from = std::find(block_out.begin(), block_out.end(), other);
      if (from == block_out.end() || c.has_skip())
        fail(i, c.has_skip() ? "is a second skip; a transformer may have one long skip"
                             : "is a sum before block " + h + "; a long skip adds an earlier block's output to the "
                               "previous block's output");
      c.skip_from = from - block_out.begin(), c.skip_to = b;
      if (c.skip_from + 1 >= c.skip_to) fail(i, "skips no block; a long skip jumps over at least one block");
      x = static_cast<int>(i++);
    }
    const size_t ln1 = expect(Op::layernorm, h + ".ln_1", {x}, "block " + h + "'s first layernorm");
    eps(ln1);
    const size_t attn = expect(Op::causal_self_attention, h + ".attn", {static_cast<int>(ln1)}, "block " + h + "'s attention");
    if (b == 0) c.n_head = g.layers[attn].heads;
    if (g.layers[attn].heads != c.n_head)
      fail(attn, "has " + std::to_string(g.layers[attn].heads) + " heads, block h.0 " + std::to_string(c.n_head) +
                     "; every block has the same heads");
    if (!g.layers[attn].bias) fail(attn, "has no bias; meshtrain's attention projections have biases");
    const int r1 = static_cast<int>(expect(Op::add, "", {x, static_cast<int>(attn)}, "block " + h + "'s first residual sum"));
    const size_t ln2 = expect(Op::layernorm, h + ".ln_2", {r1}, "block " + h + "'s second layernorm");
    eps(ln2);
    const size_t fc = expect(Op::linear, h + ".mlp.c_fc", {static_cast<int>(ln2)}, "block " + h + "'s MLP input layer");
    if (b == 0) c.n_inner = g.layers[fc].out_channels == 4 * c.n_embd ? 0 : g.layers[fc].out_channels;
    if (g.layers[fc].out_channels != c.mlp_width())
      fail(fc, "has out_features " + std::to_string(g.layers[fc].out_channels) + ", block h.0's MLP " +
                   std::to_string(c.mlp_width()) + "; every block's MLP has one width");
    const size_t act = expect(Op::gelu, "", {static_cast<int>(fc)}, "block " + h + "'s GELU");
    if (b == 0) c.gelu_exact = !g.layers[act].tanh;
    if (g.layers[act].tanh == c.gelu_exact)
      fail(act, std::string("is the ") + (c.gelu_exact ? "tanh" : "exact") + " GELU, block h.0's the " +
                    (c.gelu_exact ? "exact" : "tanh") + " one; every block's MLP has one GELU");
    const size_t proj = expect(Op::linear, h + ".mlp.c_proj", {static_cast<int>(act)}, "block " + h + "'s MLP output layer");
    for (size_t k : {fc, proj})
      if (!g.layers[k].bias || g.layers[k].tied >= 0) fail(k, "must have its own weight and a bias");
    x = static_cast<int>(expect(Op::add, "", {r1, static_cast<int>(proj)}, "block " + h + "'s second residual sum"));
    block_out.push_back(x);
  }
  if (block_out.empty()) fail(i, "comes before any block; give at least one block h.0");
  c.n_layer = static_cast<int64_t>(block_out.size());
  const size_t lnf = expect(Op::layernorm, "ln_f", {x}, "the final layernorm");
  eps(lnf);
  const size_t head = expect(Op::linear, "", {static_cast<int>(lnf)}, "the head");
  if (g.layers[head].tied != static_cast<int>(wte) || g.layers[head].bias)
    fail(head, "is the head: give it \"tied_to\": \"wte\" and \"bias\": false (it shares the token embedding)");
  if (i != n) fail(i, "follows the head; the head's output is the logits");
  c.batch = g.batch;
  c.seq = g.seq;
  c.validate();
  return c;
}

GPTConfig gpt_config_from_file(const std::string& path) {
  const std::string source = "model config file " + path;
  // One strict reading for every JSON file (io/json.h): a key given twice, an overflowing
  // number or bad syntax is refused naming the file.
  const std::string text = io::read_text_file(path, source, "give --config a JSON file");
  const nlohmann::json j =
      io::parse_json_strict(text, source, "it must be an object such as {\"n_layer\": 4, \"n_embd\": 128, ...}");
  try {
    return GPTConfig::from_json(j, source);
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(source + " could not be read as a model config; check its fields");
  }
}

}  // namespace meshtrain::model
