// `meshtrain generate`: sample text from a checkpoint with a byte-level vocabulary (or print
// token ids for larger vocabularies, which need a tokenizer meshtrain does not ship).
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/kernels/crossentropy.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/tensor/rng.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::cli {

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

void generate(const GenerateOptions& o) {
  train::CheckpointData ck = train::load_checkpoint(o.checkpoint);
  if (!ck.config.contains("model"))
    throw std::invalid_argument("checkpoint " + o.checkpoint + " has no model config");
  model::GPTConfig cfg = model::GPTConfig::from_json(ck.config["model"]);
  model::GPT gpt(cfg, 0);
  std::map<std::string, Tensor*> by_name;
  for (nn::Param* p : gpt.params()) by_name[p->name] = &p->value;
  for (auto& [name, t] : ck.model)
    if (auto it = by_name.find(name); it != by_name.end()) it->second->copy_from(t);
  if (o.prompt.empty()) throw std::invalid_argument("--prompt must not be empty");
  if (!(o.temperature > 0)) throw std::invalid_argument("--temperature must be positive");

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
