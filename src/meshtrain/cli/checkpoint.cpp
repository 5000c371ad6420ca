// `meshtrain checkpoint convert --to-single DIR OUT`: the model of a checkpoint as one GPT-2
// safetensors file — the tensor names, (in, out) layouts and float32 dtype of the GPT-2
// checkpoints on the Hugging Face hub (model/gpt.h), metadata {"format": "pt"}, no optimizer
// state. DIR is a checkpoint directory (its newest step folder that verifies, as --resume picks)
// or one step folder; the model is checked against the config of its index first, then written
// one tensor at a time, each assembled from the pieces the ranks saved.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "meshtrain/cli/commands.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/safetensors.h"

namespace meshtrain::cli {

namespace {

struct ConvertOptions {
  bool to_single = false;
  std::string from, out;
};

void convert(const ConvertOptions& o) {
  namespace fs = std::filesystem;
  if (!o.to_single)
    throw UsageError("checkpoint convert writes one file for now: add --to-single (checkpoint convert --to-single DIR OUT)");
  if (!fs::exists(o.from))
    throw UsageError("checkpoint " + o.from + " does not exist; give a checkpoint directory or one of its step folders");
  const fs::path out(o.out);
  if (!out.parent_path().empty() && !fs::is_directory(out.parent_path()))
    throw UsageError(o.out + ": the directory " + out.parent_path().string() + " does not exist; create it first");
  if (fs::is_directory(out)) throw UsageError(o.out + " is a directory; give the path of the file to write");
  std::string folder = o.from;
  if (!fs::exists(fs::path(o.from) / "index.json")) {  // a checkpoint directory: the newest valid step
    const train::ResumePoint rp = train::find_resume_point(o.from);
    for (const std::string& note : rp.notes) std::fprintf(stderr, "meshtrain: note: %s\n", note.c_str());
    if (!rp.folder) throw UsageError("checkpoint directory " + o.from + " holds no step folder; nothing to convert");
    folder = *rp.folder;
  }
  CheckedCheckpoint c = checked_model_checkpoint(folder);
  const auto tensors = c.index.shapes(c.index.model);
  int64_t params = 0;
  for (const auto& [name, shape] : tensors) params += shape_numel(shape);
  // One tensor at a time, assembled from its pieces, written and dropped.
  train::PieceReader rd(c.index);
  train::write_safetensors(o.out, tensors, [&](const std::string& name) { return rd.full(name); }, {{"format", "pt"}});
  std::printf("wrote %s: %zu tensors, %lld parameters (float32), model %s at step %lld of %s\n", o.out.c_str(),
              tensors.size(), static_cast<long long>(params), c.config.name.c_str(),
              static_cast<long long>(c.index.step), folder.c_str());
}

}  // namespace

void add_checkpoint_command(CLI::App& app) {
  CLI::App* ck = app.add_subcommand("checkpoint", "Work with checkpoints (train --checkpoint-dir)");
  ck->callback([ck] {
    if (ck->get_subcommands().empty())
      throw UsageError("checkpoint needs what to do: convert --to-single DIR OUT");
  });
  auto opt = std::make_shared<ConvertOptions>();
  CLI::App* c = ck->add_subcommand("convert", "Write a checkpoint's model as one GPT-2 safetensors file");
  c->add_flag("--to-single", opt->to_single, "One file with every tensor whole (GPT-2 names, float32)");
  c->add_option("from", opt->from, "Checkpoint directory (its newest valid step) or one step folder")->required();
  c->add_option("out", opt->out, "The safetensors file to write")->required();
  c->callback([opt] {
    try {
      convert(*opt);
    } catch (const train::CheckpointError& e) {
      throw UsageError(e.what());
    }
  });
}

}  // namespace meshtrain::cli
