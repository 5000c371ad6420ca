// Named model configurations (DESIGN "Interfaces") and JSON config files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::model {

struct GPTConfig {
  std::string name = "custom";
  int64_t n_layer = 4;
  int64_t n_embd = 128;   // C
  int64_t n_head = 4;
  int64_t vocab_size = 256;
  int64_t block_size = 64;  // longest sequence (rows of wpe)
  // Recommended training shape for this model (the CLI's defaults).
  int64_t batch = 12;
  int64_t seq = 64;

  int64_t head_size() const { return n_embd / n_head; }
  // Parameter count of the full model (tied lm_head counted once).
  int64_t num_params() const;
  // Forward+backward FLOPs per token at sequence length T (6N + attention), for MFU.
  double flops_per_token(int64_t T) const;
  // Bytes of the activations one (B, T) micro-batch saves for backward (float32): per layer and
  // token 16C + n_head + 4 floats (ln_1 input and statistics, qkv input, qkv, attention output,
  // log-sum-exp, ln_2 input and statistics, MLP input, GELU input and output), plus the final
  // layernorm, its output and the (V) logits with their log-sum-exp.
  double activation_bytes(int64_t B, int64_t T) const;
  // Throws std::invalid_argument with a sentence when the shape is impossible.
  void validate() const;

  nlohmann::json to_json() const;
  static GPTConfig from_json(const nlohmann::json& j);
};

// gpt-tiny, gpt-small, gpt2-124m; throws std::invalid_argument listing the names otherwise.
GPTConfig gpt_config(const std::string& name);
std::vector<std::string> gpt_config_names();
// Reads a JSON file with the fields of GPTConfig (missing fields keep gpt-tiny's values).
GPTConfig gpt_config_from_file(const std::string& path);

}  // namespace meshtrain::model
