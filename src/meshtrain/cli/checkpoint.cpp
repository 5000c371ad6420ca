// `meshtrain checkpoint convert --to-single DIR OUT`: the model of a checkpoint as one GPT-2
// safetensors file — the tensor names, (in, out) layouts and float32 dtype of the GPT-2
// checkpoints on the Hugging Face hub (model/gpt.h), metadata {"format": "pt", "writer":
// "meshtrain"} (the second lets a later convert replace it without --overwrite), no optimizer
// state. DIR is a checkpoint directory (its newest step folder that verifies, as --resume picks)
// or one step folder; the model is checked against the config of its index first, then written
// one tensor at a time, each assembled from the pieces the ranks saved (a non-finite element is
// refused). OUT is checked by the output policy (train/outputs.h) before anything is read: never
// inside the checkpoint being read, never a file meshtrain did not write unless --overwrite.
// The tensors, names and layouts come from single_file_model (commands.h), which the Python
// module's Run.state_dict() reads too, so the two give the same numbers under the same names.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/io/npy.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/train/outputs.h"

namespace meshtrain::cli {

namespace {

struct ConvertOptions {
  bool to_single = false;
  bool overwrite = false;  // OUT may replace a file meshtrain did not write
  std::string from, out;
};

// A .npz output: a NumPy archive of PyTorch's state dict (integer counters included), else
// a safetensors file.
bool npz_path(const std::string& out) { return out.size() > 4 && out.ends_with(".npz"); }

// OUT against what is read: `from` and, once known, the step folder (which may lie elsewhere
// through a symbolic link). Throws UsageError with the policy's sentence.
void check_paths(const ConvertOptions& o, const std::string& folder) {
  namespace fs = std::filesystem;
  // The file is replaced by a rename: a device or pipe there would be swapped for a file.
  std::error_code ec;
  const auto st = fs::status(o.out, ec);
  if (fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st))
    throw UsageError("the output " + o.out + " is not a regular file (a device, pipe or socket); give the path of a "
                     "file to write");
  try {
    train::PathPlan plan(o.overwrite);
    plan.input_tree("the checkpoint", o.from);
    if (!folder.empty()) plan.input_tree("its step folder", folder);
    plan.output_file("the output", o.out, npz_path(o.out) ? train::OutputKind::npz : train::OutputKind::safetensors);
    plan.check();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// A piece of the checkpoint that cannot be read while the output is written (exit 2), told
// apart from a failure to write the output (exit 1).
struct ReadRefused {
  std::string what;
};

// OUT as a .npz of every tensor module.state_dict() holds: the float32 tensors, and for an image
// classifier each batch norm's num_batches_tracked (a 0-d int64, the steps trained) after its
// running_var, so load_state_dict(strict=True) takes it (docs/from_pytorch.md). The archive is
// built in memory and written atomically.
void write_state_npz(const ConvertOptions& o, const std::string& folder, const SingleFileModel& m) {
  std::vector<Tensor> tensors;
  std::vector<io::NpyWrite> arrays;
  const int64_t steps = m.step;
  int counters = 0;
  try {
    for (const auto& [name, shape] : m.tensors) tensors.push_back(m.read(name));
  } catch (const train::CheckpointError& e) {
    throw UsageError(e.what());
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = m.tensors[i].first;
    arrays.push_back({name, io::NpyType::f32, tensors[i].shape(), tensors[i].data()});
    if (m.cnn && name.ends_with(".running_var")) {
      arrays.push_back({name.substr(0, name.size() - 12) + ".num_batches_tracked", io::NpyType::i64, {}, &steps});
      ++counters;
    }
  }
  io::write_npz(o.out, arrays, "converted checkpoint");
  std::printf("wrote %s: %zu arrays (%s), %lld values, model %s at step %lld of %s\n", o.out.c_str(), arrays.size(),
              m.cnn ? (std::to_string(counters) + " of them num_batches_tracked; PyTorch state-dict names and layouts").c_str()
                    : "GPT-2 names, float32",
              static_cast<long long>(m.params), m.model.c_str(), static_cast<long long>(m.step), folder.c_str());
}

void convert(const ConvertOptions& o) {
  namespace fs = std::filesystem;
  if (!o.to_single)
    throw UsageError("checkpoint convert writes one file for now: add --to-single (checkpoint convert --to-single DIR OUT)");
  if (!fs::exists(o.from))
    throw UsageError("checkpoint " + o.from + " does not exist; give a checkpoint directory or one of its step folders");
  check_paths(o, "");  // before anything is read
  const std::string folder = tool_step_folder(o.from, "nothing to convert");
  check_paths(o, folder);
  const SingleFileModel m = single_file_model(folder);
  if (npz_path(o.out)) return write_state_npz(o, folder, m);
  // One tensor at a time, assembled from its pieces, written and dropped. A failure leaves OUT
  // as it was (the writer renames a finished file over it, and removes its temporary file).
  try {
    train::write_safetensors(
        o.out, m.tensors,
        [&](const std::string& name) {
          try {
            return m.read(name);
          } catch (const train::CheckpointError& e) {
            throw ReadRefused{e.what()};
          }
        },
        {{"format", "pt"}, {train::kSafetensorsWriterKey, train::kSafetensorsWriter}});
  } catch (const ReadRefused& e) {
    throw UsageError(e.what);
  } catch (const train::CheckpointError& e) {
    throw std::runtime_error("cannot write the converted checkpoint " + o.out + ": " + e.what());
  }
  if (m.cnn)
    std::printf("wrote %s: %zu tensors (parameters and batch-norm statistics), %lld values (float32; PyTorch "
                "state-dict names and layouts), model %s at step %lld of %s\n",
                o.out.c_str(), m.tensors.size(), static_cast<long long>(m.params), m.model.c_str(),
                static_cast<long long>(m.step), folder.c_str());
  else
    std::printf("wrote %s: %zu tensors, %lld parameters (float32), model %s at step %lld of %s\n", o.out.c_str(),
                m.tensors.size(), static_cast<long long>(m.params), m.model.c_str(), static_cast<long long>(m.step),
                folder.c_str());
}

// A CNN's checkpoint as one PyTorch state dict: its parameters and buffers under their
// state-dict names; a linear layer's weight, kept (in, out) by nn::Linear, written (out, in) as
// torch.nn.Linear holds it, so load_state_dict takes the file as it is.
SingleFileModel cnn_single(const std::string& folder, std::shared_ptr<const train::CheckpointIndex> index) {
  const auto spec = checked_cnn_checkpoint(folder, *index);
  auto expected = spec->param_shapes();
  for (const auto& b : spec->buffer_shapes()) expected.push_back(b);
  auto linear = [](const std::string& name, const Shape& s) {
    return s.size() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
  };
  SingleFileModel m;
  m.cnn = true, m.model = spec->name(), m.step = index->step;
  for (const auto& [name, shape] : expected) {
    m.tensors.emplace_back(name, linear(name, shape) ? Shape{shape[1], shape[0]} : shape);
    m.params += shape_numel(shape);
  }
  auto rd = std::make_shared<train::PieceReader>(*index);
  m.read = [index, rd, linear](const std::string& name) {
    Tensor t = rd->full(name);
    if (!linear(name, t.shape())) return t;
    const int64_t in = t.dim(0), out = t.dim(1);
    Tensor tr = Tensor::empty({out, in});
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < out; ++j) tr.data()[j * in + i] = t.data()[i * out + j];
    return tr;
  };
  return m;
}

}  // namespace

SingleFileModel single_file_model(const std::string& folder) {
  {
    auto index = std::make_shared<const train::CheckpointIndex>(train::open_checkpoint(folder, /*model_only=*/true));
    const nlohmann::json m = index->config.value("model", nlohmann::json::object());
    if (m.is_object() && m.value("family", "gpt") == "cnn") return cnn_single(folder, index);
  }
  auto c = std::make_shared<CheckedCheckpoint>(checked_model_checkpoint(folder));
  SingleFileModel m;
  m.model = c->config.name, m.step = c->index.step;
  m.tensors = c->index.shapes(c->index.model);
  for (const auto& [name, shape] : m.tensors) m.params += shape_numel(shape);
  auto rd = std::make_shared<train::PieceReader>(c->index);
  m.read = [c, rd](const std::string& name) { return rd->full(name); };
  return m;
}

std::shared_ptr<const model::ModelSpec> checked_cnn_checkpoint(const std::string& folder,
                                                               const train::CheckpointIndex& index) {
  std::shared_ptr<const model::ModelSpec> spec;
  try {
    const nlohmann::json m = index.config.value("model", nlohmann::json::object());
    // A user's graph is recorded whole; a named model by its name.
    model::CNNConfig cfg = m.contains("graph")
                               ? model::cnn_config(std::make_shared<const model::Graph>(
                                     model::parse_graph(m["graph"], "the graph in its index")))
                               : model::cnn_config(m.value("name", std::string()));
    // A model trained on upsampled images (a config's "scale") takes them so here too.
    const int64_t scale = m.value("scale", int64_t{1});
    if (scale < 1 || scale > 16) throw std::invalid_argument("its scale " + std::to_string(scale) + " is not 1..16");
    cfg.scale = scale, cfg.height *= scale, cfg.width *= scale;
    spec = model::cnn_spec(cfg);
  } catch (const std::exception& e) {
    throw UsageError("checkpoint " + folder + ": its index names no CNN this meshtrain knows (" + e.what() + ")");
  }
  auto expected = spec->param_shapes();
  for (const auto& b : spec->buffer_shapes()) expected.push_back(b);
  train::check_tensor_set("checkpoint " + folder + " (model)", expected, index.shapes(index.model));
  return spec;
}

void add_checkpoint_command(CLI::App& app) {
  CLI::App* ck = app.add_subcommand("checkpoint", "Work with checkpoints (train --checkpoint-dir)");
  ck->callback([ck] {
    if (ck->get_subcommands().empty())
      throw UsageError("checkpoint needs what to do: convert --to-single DIR OUT");
  });
  auto opt = std::make_shared<ConvertOptions>();
  CLI::App* c = ck->add_subcommand("convert", "Write a checkpoint's model as one GPT-2 safetensors file");
  c->add_flag("--to-single", opt->to_single,
              "One file with every tensor whole (PyTorch's state-dict names for image models, GPT-2's for GPTs)");
  c->add_option("from", opt->from, "Checkpoint directory (its newest valid step) or one step folder")
      ->required()
      ->check(non_empty_path());
  c->add_option("out", opt->out,
                "The file to write: FILE.npz (a NumPy archive of the whole state dict, num_batches_tracked "
                "included: module.load_state_dict takes it strictly) or a safetensors file (float32 tensors)")->required()->check(non_empty_path());
  c->add_flag("--overwrite", opt->overwrite, "Let OUT replace an existing file meshtrain did not write");
  c->callback([opt] {
    try {
      convert(*opt);
    } catch (const train::CheckpointError& e) {
      throw UsageError(e.what());
    }
  });
}

}  // namespace meshtrain::cli
