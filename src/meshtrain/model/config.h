// Named model configurations (DESIGN "Interfaces") and JSON config files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::model {

struct Graph;

struct GPTConfig {
  // Largest value of any integer field (2^31 - 1).
  static constexpr int64_t kMaxField = 2147483647;

  std::string name = "custom";
  int64_t n_layer = 4;
  int64_t n_embd = 128;   // C
  int64_t n_head = 4;
  int64_t vocab_size = 256;
  int64_t block_size = 64;  // longest sequence (rows of wpe)
  // The MLP's hidden width (Hugging Face's GPT2Config.n_inner; 0: 4 x n_embd, GPT-2's) and its
  // GELU: the tanh approximation (GPT-2's "gelu_new", the default) or the exact erf form
  // ("gelu").
  int64_t n_inner = 0;
  bool gelu_exact = false;
  int64_t mlp_width() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  // A long skip connection (-1: none): block skip_from's output is added to block skip_to's
  // input (skip_from < skip_to - 1), a residual that bypasses the blocks between. Across
  // pipeline stages it travels straight from the one stage to the other (a portal).
  int64_t skip_from = -1, skip_to = -1;
  bool has_skip() const { return skip_from >= 0; }
  // Recommended training shape for this model (the CLI's defaults).
  int64_t batch = 12;
  int64_t seq = 64;

  // Parameter count of the full model (tied lm_head counted once).
  int64_t num_params() const;
  // Forward+backward FLOPs per token at sequence length T (6N + attention), for MFU.
  double flops_per_token(int64_t T) const;
  // Bytes of the activations one (B, T) micro-batch saves for backward (float32): per layer and
  // token 16C + n_head + 4 floats (ln_1 input and statistics, qkv input, qkv, attention output,
  // log-sum-exp, ln_2 input and statistics, MLP input, GELU input and output), plus the final
  // layernorm, its output and the (V) logits with their log-sum-exp.
  double activation_bytes(int64_t B, int64_t T) const;
  // Throws std::invalid_argument with a sentence when the shape is impossible (every shape
  // field 1..kMaxField, vocab_size at least 2, n_head dividing n_embd). batch and seq are only
  // the recommended training shape: from_json checks them, the trainer checks what it runs.
  void validate() const;

  nlohmann::json to_json() const;
  // Strict: an object with the required fields n_layer, n_embd, n_head, vocab_size, block_size
  // and the optional name, batch (default 12), seq (default min(64, block_size)), n_inner,
  // activation_function ("gelu_new" or "gelu") and skip_from,
  // skip_to (both or neither, 0-based blocks, skip_from < skip_to - 1); unknown
  // keys, non-integers (2.7, "four") and values outside 1..kMaxField are refused with a
  // std::invalid_argument that starts with `source` and names the field as the JSON spells it.
  static GPTConfig from_json(const nlohmann::json& j, const std::string& source = "model config");
};

// gpt-tiny, gpt-small, gpt2-124m; throws std::invalid_argument listing the names otherwise.
// A named token model (models/*.json), compiled by gpt_config(const Graph&).
GPTConfig gpt_config(const std::string& name);
std::vector<std::string> gpt_config_names();
// A token model's layer graph (model/graph.h) as the transformer it describes: token and
// position embeddings and their sum, pre-norm blocks named h.<i> (ln_1, causal self-attention
// attn, the residual sum, ln_2, mlp.c_fc, a GELU, mlp.c_proj, the residual
// sum), at most one long skip (a sum of an earlier block's output into a later block's input),
// ln_f, and a head tied to the token embedding. The MLP's width (n_inner) and its GELU (tanh or
// exact) are the graph's. Anything else is refused with a sentence naming
// the layer and what was expected there.
GPTConfig gpt_config(const Graph& g);
// Reads a JSON file with the fields of GPTConfig (from_json's rules); every problem, including
// malformed JSON, is a std::invalid_argument naming the file (and the field).
GPTConfig gpt_config_from_file(const std::string& path);

}  // namespace meshtrain::model
