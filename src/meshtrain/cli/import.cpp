// `meshtrain import net.onnx -o net.json`: the layer graph an ONNX file maps onto
// (onnx/onnx_import.h), written as the description file a user reads and edits
// (docs/models.md). The weights stay in the ONNX file: `train --model net.json --init-from
// net.onnx` starts from them. The output is checked by the output policy (train/outputs.h)
// before the ONNX file is read: never the input itself, never a file meshtrain did not write
// unless --overwrite.
#include <cstdio>
#include <memory>
#include <string>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/io/file.h"
#include "meshtrain/model/graph.h"
#include "meshtrain/onnx/onnx_import.h"
#include "meshtrain/train/outputs.h"

namespace meshtrain::cli {

void add_import_command(CLI::App& app) {
  struct Options {
    std::string in, out;
    bool overwrite = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* c = app.add_subcommand("import", "Write the layer graph of an ONNX file (torch.onnx.export) as a model file");
  c->add_option("onnx", o->in, "The ONNX file")->required();
  c->add_option("-o,--out", o->out, "The model file (JSON) to write")->required()->check(non_empty_path());
  c->add_flag("--overwrite", o->overwrite, "Replace --out even if meshtrain did not write it");
  c->callback([o]() {
    try {
      train::PathPlan plan(o->overwrite);
      plan.input_file("the ONNX file", o->in);
      plan.output_file("--out", o->out, train::OutputKind::model);
      plan.check();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    onnx_import::Imported im;
    try {
      im = onnx_import::import_onnx(o->in);
      (void)model::parse_graph(im.graph, "ONNX file " + o->in);  // the graph's own checks, before writing
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    nlohmann::json j = im.graph;
    j["imported_from"] = o->in;
    io::write_file_atomic(o->out, j.dump(1) + "\n", "model file");
    int64_t params = 0;
    for (const auto& [name, t] : im.weights) params += t.numel();
    std::printf("wrote %s: %zu layers from %s, %zu tensors (%lld values) of weights left in the ONNX file "
                "(train --model %s --init-from %s starts from them)\n",
                o->out.c_str(), im.graph["layers"].size(), o->in.c_str(), im.weights.size(),
                static_cast<long long>(params), o->out.c_str(), o->in.c_str());
  });
}

}  // namespace meshtrain::cli
