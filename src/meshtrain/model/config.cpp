#include "meshtrain/model/config.h"

#include <fstream>
#include <stdexcept>

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
  if (n_layer < 1) bad("n_layer must be at least 1");
  if (n_embd < 1 || n_head < 1) bad("n_embd and n_head must be positive");
  if (n_embd % n_head != 0)
    bad("n_embd " + std::to_string(n_embd) + " is not divisible by n_head " +
        std::to_string(n_head) + "; pick n_head dividing it");
  if (vocab_size < 2) bad("vocab_size must be at least 2");
  if (block_size < 1) bad("block_size must be at least 1");
}

nlohmann::json GPTConfig::to_json() const {
  return {{"name", name},           {"n_layer", n_layer},       {"n_embd", n_embd},
          {"n_head", n_head},       {"vocab_size", vocab_size}, {"block_size", block_size},
          {"batch", batch},         {"seq", seq}};
}

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  GPTConfig c;
  c.name = j.value("name", c.name);
  c.n_layer = j.value("n_layer", c.n_layer);
  c.n_embd = j.value("n_embd", c.n_embd);
  c.n_head = j.value("n_head", c.n_head);
  c.vocab_size = j.value("vocab_size", c.vocab_size);
  c.block_size = j.value("block_size", c.block_size);
  c.batch = j.value("batch", c.batch);
  c.seq = j.value("seq", std::min(c.block_size, c.seq));
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
  std::ifstream f(path);
  if (!f) throw std::invalid_argument("cannot open model config file '" + path + "'");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw std::invalid_argument("model config file '" + path + "' is not valid JSON: " + e.what());
  }
  return GPTConfig::from_json(j);
}

}  // namespace meshtrain::model
