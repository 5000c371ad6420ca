// `meshtrain generate`: sample text from a checkpoint with a byte-level vocabulary (or print
// token ids for larger vocabularies, which need a tokenizer meshtrain does not ship).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/model/gpt.h"
#include "meshtrain/tensor/rng.h"
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
  if (ck.config["model"].value("family", "gpt") != "gpt")
    throw train::CheckpointError("checkpoint " + path + " holds " + ck.config["model"].value("name", "a model") +
                                 ", an image classifier (family " + ck.config["model"].value("family", "") +
                                 "); generate samples text from GPT checkpoints only");
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

std::string tool_step_folder(const std::string& path, const std::string& purpose) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw train::CheckpointError("checkpoint " + path +
                                 " does not exist; give a checkpoint directory or one of its step folders");
  if (!fs::is_directory(path, ec))
    throw train::CheckpointError("checkpoint " + path +
                                 " is not a directory; give a checkpoint directory or one of its step folders");
  if (fs::exists(fs::path(path) / "index.json", ec)) return path;
  const train::ResumePoint rp = train::find_resume_point(path);
  // No step folder: train's note ("starting from step 0") means nothing to a tool that reads.
  if (!rp.folder)
    throw train::CheckpointError("checkpoint directory " + path + " holds no step folder; " + purpose);
  for (const std::string& note : rp.notes) std::fprintf(stderr, "meshtrain: note: %s\n", note.c_str());
  return *rp.folder;
}

namespace {

struct GenerateOptions {
  std::string checkpoint;
  std::string prompt = "\n";
  int64_t tokens = 200;
  double temperature = 0.8;
  uint64_t seed = 1;
  int threads = 2;
};

// Draws the next token from the last position's logits at `temperature`, in double: the
// largest logit is subtracted before exp(), so no weight overflows however small the
// temperature (a tiny one makes every other token's weight 0: greedy decoding) and the draw
// walks a normalised sum. `u` is uniform in [0, 1).
int32_t sample(const float* logits, int64_t V, double temperature, double u, std::vector<double>& weight) {
  const float top = *std::max_element(logits, logits + V);
  if (!std::isfinite(top)) throw std::runtime_error("the model's logits are not finite; the checkpoint cannot be sampled");
  double total = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double z = (static_cast<double>(logits[i]) - top) / temperature;  // <= 0, or -inf
    weight[i] = std::isnan(z) ? 0.0 : std::exp(z);                           // the top logit: exp(0) = 1
    total += weight[i];
  }
  const double target = u * total;
  double c = 0;
  for (int64_t i = 0; i < V; ++i)
    if (weight[i] > 0 && (c += weight[i]) > target) return static_cast<int32_t>(i);
  for (int64_t i = V - 1; i >= 0; --i)  // rounding left the target above the sum: the last drawable token
    if (weight[i] > 0) return static_cast<int32_t>(i);
  return 0;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The flags alone, before the checkpoint is read (train/validate.h for the thread cap).
void check_options(const GenerateOptions& o) {
  if (o.tokens < 1) throw std::invalid_argument("--tokens must be at least 1, got " + std::to_string(o.tokens));
  train::check_threads("--threads", o.threads, train::Machine::probe(), /*zero_means_auto=*/false);
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    throw std::invalid_argument("--temperature must be a finite number above 0 (e.g. 0.8; a tiny one samples "
                                "greedily), got " + num(o.temperature));
  if (o.prompt.empty()) throw std::invalid_argument("--prompt must not be empty");
}

std::unique_ptr<model::GPT> load_model(const std::string& path) {
  CheckedCheckpoint c = checked_model_checkpoint(tool_step_folder(path, "nothing to sample from"));
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
  std::vector<double> weight(cfg.vocab_size);
  for (int64_t i = 0; i < o.tokens; ++i) {
    int64_t T = std::min<int64_t>(static_cast<int64_t>(ctx_tokens.size()), cfg.block_size);
    const int32_t* window = ctx_tokens.data() + ctx_tokens.size() - T;
    nn::Context ctx(o.threads, false);
    Tensor logits = gpt.logits(ctx, window, 1, T);  // (1, T, V)
    const int32_t next = sample(logits.data() + (T - 1) * cfg.vocab_size, cfg.vocab_size, o.temperature,
                                philox_uniform(key, i), weight);
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
  c->add_option("--checkpoint", opt->checkpoint, "Checkpoint directory (or one step folder)")->required()->check(non_empty_path());
  c->add_option("--prompt", opt->prompt, "Text to continue");
  c->add_option("--tokens", opt->tokens, "Tokens to sample")->check(integer<int64_t>(1))->capture_default_str();
  c->add_option("--temperature", opt->temperature, "Softmax temperature, above 0 (tiny: greedy)")
      ->capture_default_str();
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
