#include "meshtrain/model/config.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "meshtrain/io/json.h"

namespace meshtrain::model {

int64_t GPTConfig::num_params() const {
  const int64_t C = n_embd;
  int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) +
                      (4 * C * C + C);
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
  const double C = static_cast<double>(n_embd);
  double per_token = static_cast<double>(n_layer) * (16 * C + static_cast<double>(n_head) + 4) +
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
  static const char* optional[] = {"name", "batch", "seq", "skip_from", "skip_to", "family"};
  const std::string fields =
      "n_layer, n_embd, n_head, vocab_size, block_size (required) and name, batch, seq, skip_from, skip_to";
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
  GPTConfig c;
  c.name = name;
  if (name == "gpt-tiny") {
    c.n_layer = 4, c.n_embd = 128, c.n_head = 4, c.vocab_size = 256, c.block_size = 64;
    c.batch = 12, c.seq = 64;
  } else if (name == "gpt-small") {
    c.n_layer = 6, c.n_embd = 384, c.n_head = 6, c.vocab_size = 256, c.block_size = 256;
    c.batch = 8, c.seq = 256;
  } else if (name == "gpt2-124m") {
    c.n_layer = 12, c.n_embd = 768, c.n_head = 12, c.vocab_size = 50257, c.block_size = 1024;
    c.batch = 4, c.seq = 64;
  } else {
    std::string names;
    for (auto& n : gpt_config_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model '" + name + "'; choose one of " + names +
                                ", or give --config FILE.json");
  }
  return c;
}

std::vector<std::string> gpt_config_names() { return {"gpt-tiny", "gpt-small", "gpt2-124m"}; }

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
