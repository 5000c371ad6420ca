// `meshtrain generate`: sample text from a checkpoint with a byte-level vocabulary (or print
// token ids for larger vocabularies, which need a tokenizer meshtrain does not ship).
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/tensor/rng.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::cli {

// The model of a checkpoint: its index config, checked against the saved tensors (every name
// and shape, nothing missing or extra) before anything is built from them, so a checkpoint whose
// contents disagree with its index is refused naming the tensor instead of sampling from
// random or scrambled weights, and a config far larger than what was saved allocates nothing.
// Only the index and the files' CRCs are read here; the tensors are read by the caller, one
// at a time (train::PieceReader).
CheckedCheckpoint checked_model_checkpoint(const std::string& path) {
  train::CheckpointIndex ck = train::open_checkpoint(path, /*model_only=*/true);
  if (!ck.config.contains("model") || !ck.config["model"].is_object())
    throw train::CheckpointError("checkpoint " + path + " has no model config in its index; it was not written by "
                                 "meshtrain train");
  model::GPTConfig cfg;
  try {
    cfg = model::GPTConfig::from_json(ck.config["model"], "the index of checkpoint " + path);
  } catch (const nlohmann::json::exception& e) {
    throw train::CheckpointError("checkpoint " + path + ": the model config in its index is malformed (" + e.what() +
                                 ")");
  } catch (const std::invalid_argument& e) {
    throw train::CheckpointError("checkpoint " + path + ": the model config in its index is impossible (" +
                                 e.what() + ")");
  }
  const auto& saved = ck.model;
  // First what is cheap to check, so that a config far larger than what was saved (n_embd or
  // n_layer in the millions) is refused before its tensor list is even built.
  const Shape wte{cfg.vocab_size, cfg.n_embd};
  auto wte_it = saved.find("wte.weight");
  if (wte_it == saved.end())
    throw train::CheckpointError("checkpoint " + path + " lacks tensor wte.weight; the checkpoint does not match its index");
  if (wte_it->second.shape != wte)
    throw train::CheckpointError("checkpoint " + path + ": tensor wte.weight has shape " +
                                 shape_str(wte_it->second.shape) + " but its index config needs " + shape_str(wte) +
                                 "; the checkpoint does not match its index");
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    if (!saved.count("h." + std::to_string(i) + ".ln_1.weight"))
      throw train::CheckpointError("checkpoint " + path + " lacks tensor h." + std::to_string(i) +
                                   ".ln_1.weight, which its index config (n_layer " + std::to_string(cfg.n_layer) +
                                   ") needs; the checkpoint does not match its index");
  train::check_tensor_set("checkpoint " + path, model::gpt_param_shapes(cfg), ck.shapes(ck.model));
  return {cfg, std::move(ck)};
}

namespace {

struct GenerateOptions {
  std::string checkpoint;
  std::string prompt = "\n";
  int64_t tokens = 200;
  float temperature = 0.8f;
  uint64_t seed = 1;
  int threads = 2;
};

int32_t sample(const float* probs, int64_t V, float u) {
  float c = 0;
  for (int64_t i = 0; i < V; ++i)
    if ((c += probs[i]) > u) return static_cast<int32_t>(i);
  return static_cast<int32_t>(V - 1);
}

// The flags alone, before the checkpoint is read (train/validate.h for the thread cap).
void check_options(const GenerateOptions& o) {
  if (o.tokens < 1) throw std::invalid_argument("--tokens must be at least 1, got " + std::to_string(o.tokens));
  train::check_threads("--threads", o.threads, train::Machine::probe(), /*zero_means_auto=*/false);
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    throw std::invalid_argument("--temperature must be a finite number above 0, got " + std::to_string(o.temperature));
  if (o.prompt.empty()) throw std::invalid_argument("--prompt must not be empty");
}

std::unique_ptr<model::GPT> load_model(const std::string& path) {
  CheckedCheckpoint c = checked_model_checkpoint(path);
  auto gpt = std::make_unique<model::GPT>(c.config, 0);
  train::PieceReader rd(c.index);  // each tensor straight from its pieces into the parameter
  for (nn::Param* p : gpt->params()) rd.read(p->name, p->global_shape, {}, 0, p->value.numel(), p->value.data());
  return gpt;
}

void generate(const GenerateOptions& o) {
  std::unique_ptr<model::GPT> model;
  try {
    model = load_model(o.checkpoint);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("not enough memory to load the model of checkpoint " + o.checkpoint +
                             "; use a machine with more memory");
  }
  model::GPT& gpt = *model;
  const model::GPTConfig& cfg = gpt.config();
  std::vector<int32_t> ctx_tokens(o.prompt.begin(), o.prompt.end());
  for (auto& t : ctx_tokens) t = static_cast<unsigned char>(t);
  const bool bytes = cfg.vocab_size <= 256;
  std::fputs(o.prompt.c_str(), stdout);
  uint64_t key = stream_key(o.seed, "generate");
  std::vector<float> probs(cfg.vocab_size);
  for (int64_t i = 0; i < o.tokens; ++i) {
    int64_t T = std::min<int64_t>(static_cast<int64_t>(ctx_tokens.size()), cfg.block_size);
    const int32_t* window = ctx_tokens.data() + ctx_tokens.size() - T;
    nn::Context ctx(o.threads, false);
    Tensor logits = gpt.logits(ctx, window, 1, T);  // (1, T, V)
    kernels::softmax_forward(probs.data(), logits.data() + (T - 1) * cfg.vocab_size, 1,
                             cfg.vocab_size, o.temperature, 1);
    int32_t next = sample(probs.data(), cfg.vocab_size, philox_uniform(key, i));
    ctx_tokens.push_back(next);
    if (bytes) std::fputc(next, stdout);
    else std::printf("%d ", next);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  CLI::App* c = app.add_subcommand("generate", "Sample text from a checkpoint");
  c->add_option("--checkpoint", opt->checkpoint, "Checkpoint directory (or one step folder)")->required();
  c->add_option("--prompt", opt->prompt, "Text to continue");
  c->add_option("--tokens", opt->tokens, "Tokens to sample")->check(integer<int64_t>(1))->capture_default_str();
  c->add_option("--temperature", opt->temperature, "Softmax temperature")->capture_default_str();
  c->add_option("--seed", opt->seed, "Sampling seed")->check(integer<uint64_t>())->capture_default_str();
  c->add_option("--threads", opt->threads, "Kernel threads")->check(integer<int>(1))->capture_default_str();
  c->callback([opt] {
    try {
      check_options(*opt);
      generate(*opt);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    } catch (const train::CheckpointError& e) {
      throw UsageError(e.what());
    }
  });
}

}  // namespace meshtrain::cli
