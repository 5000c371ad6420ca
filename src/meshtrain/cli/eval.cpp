// `meshtrain eval --checkpoint DIR`: a classifier's test accuracy and confusion matrix. The
// checkpoint's model (its index names the family and the model) is built as one stage, its
// parameters and batch-norm running statistics read from the pieces the ranks saved (any
// layout), and the test split of --data (default: the data set the model trains on) is run
// through it in evaluation mode, in order, every image once.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/data/images.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::cli {

namespace {

struct EvalOptions {
  std::string checkpoint;
  std::string data = train::ImageDataset::kFashionMnist;
  std::string data_layout;  // empty: from the shape
  int64_t batch = 256;
  int threads = 2;
};

// --batch: at most the test images (a larger batch is only padding), and its images and
// activations within the memory available (an upper bound: the largest activation between
// units, three times over for a unit's input, output and temporaries).
void check_eval_batch(const EvalOptions& o, const model::ModelSpec& spec, const train::ImageDataset& data) {
  const int64_t images = data.num_images(train::Split::val);
  if (o.batch > images)
    throw UsageError("--batch " + std::to_string(o.batch) + " is more than the " + std::to_string(images) +
                     " test images of " + data.path() + "; give at most " + std::to_string(images));
  double largest = 0;
  for (int64_t u = 0; u <= spec.num_units(); ++u) largest = std::max(largest, spec.boundary_bytes(u, o.batch, 1, 1));
  const double need = static_cast<double>(o.batch) * data.channels() * data.height() * data.width() * 4 + 3 * largest;
  const train::Machine m = train::Machine::probe();
  if (m.memory_bytes > 0 && need > static_cast<double>(m.memory_bytes)) {
    const int64_t fits = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(o.batch) *
                                                                   static_cast<double>(m.memory_bytes) / need / 2));
    char buf[200];
    std::snprintf(buf, sizeof buf, "--batch %lld needs about %.1f GiB for its images and activations, more than the %.1f GiB "
                  "available (%s); give a smaller --batch, e.g. %lld", static_cast<long long>(o.batch), need / (1 << 30),
                  static_cast<double>(m.memory_bytes) / (1 << 30), m.memory_source.c_str(), static_cast<long long>(fits));
    throw UsageError(buf);
  }
}

void evaluate(const EvalOptions& o) {
  train::check_threads("--threads", o.threads, train::Machine::probe(), /*zero_means_auto=*/false);
  if (o.batch < 1) throw UsageError("--batch must be at least 1");
  const std::string folder = tool_step_folder(o.checkpoint, "nothing to evaluate");
  const train::CheckpointIndex index = train::open_checkpoint(folder, /*model_only=*/true);
  const nlohmann::json m = index.config.value("model", nlohmann::json::object());
  if (!m.is_object() || m.value("family", "gpt") != "cnn")
    throw UsageError("checkpoint " + folder + " holds " + (m.is_object() ? m.value("name", "a model") : "a model") +
                     ", not a classifier; eval reports the accuracy of image models (a GPT's validation loss is "
                     "in train's output and metrics)");
  const std::shared_ptr<const model::ModelSpec> spec = checked_cnn_checkpoint(folder, index);
  train::ImageDataset data = [&] {
    try {
      const train::ImageLayout layout =
          o.data_layout.empty() ? train::ImageLayout::automatic : train::parse_image_layout(o.data_layout);
      train::ImageDataset d = train::ImageDataset::open(o.data, layout);
      d.fit_to(*spec, "--data");
      return d;
    } catch (const train::DataError& e) {
      throw UsageError(e.what());
    }
  }();
  check_eval_batch(o, *spec, data);
  auto stage = spec->make_stage({0, -1, true, true}, 0, {});
  train::PieceReader rd(index);
  std::vector<nn::Param*> all = stage->params();
  for (nn::Param* b : stage->buffers()) all.push_back(b);
  for (nn::Param* p : all) rd.read(p->name, p->global_shape, {}, 0, p->value.numel(), p->value.data());

  const int64_t classes = spec->classes(), per = data.channels() * data.height() * data.width();
  std::vector<int64_t> confusion(classes * classes, 0);
  std::vector<float> img(o.batch * per);
  std::vector<int32_t> lab(o.batch);
  double loss = 0;
  int64_t counted = 0, correct = 0;
  const int64_t batches = data.num_eval_batches(train::Split::val, o.batch);
  for (int64_t j = 0; j < batches; ++j) {
    const int64_t real = data.eval_batch(train::Split::val, j, o.batch, 0, o.batch, img.data(), lab.data());
    nn::Context ctx(o.threads, /*training=*/false);
    // The logits: the stage's units without its loss, to count each class.
    model::StageResult r;
    model::MicroBatch mb{.images = img.data(), .targets = lab.data(), .rows = o.batch};
    stage->forward(ctx, Tensor(), mb, &r, nullptr);
    loss += static_cast<double>(r.loss) * static_cast<double>(r.counted);
    counted += r.counted, correct += r.correct;
    const std::vector<int32_t> predicted = stage->predictions();
    for (int64_t i = 0; i < real; ++i) ++confusion[lab[i] * classes + predicted[i]];
  }
  std::printf("%s at step %lld of %s on the %lld test images of %s: accuracy %.2f%% | loss %.4f\n",
              spec->name().c_str(), static_cast<long long>(index.step), folder.c_str(), static_cast<long long>(counted),
              data.path().c_str(), 100.0 * static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, counted)),
              loss / static_cast<double>(std::max<int64_t>(1, counted)));
  std::printf("confusion matrix (rows: true class, columns: predicted)\n      ");
  for (int64_t c = 0; c < classes; ++c) std::printf("%6lld", static_cast<long long>(c));
  std::printf("\n");
  for (int64_t t = 0; t < classes; ++t) {
    std::printf("%6lld", static_cast<long long>(t));
    for (int64_t p = 0; p < classes; ++p) std::printf("%6lld", static_cast<long long>(confusion[t * classes + p]));
    std::printf("\n");
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto opt = std::make_shared<EvalOptions>();
  CLI::App* c = app.add_subcommand("eval", "A classifier checkpoint's test accuracy and confusion matrix");
  c->add_option("--checkpoint", opt->checkpoint, "Checkpoint directory (its newest valid step) or one step folder")
      ->required()
      ->check(non_empty_path());
  c->add_option("--data", opt->data,
                "The data set: fashion-mnist, a directory of the four IDX files, or an .npz holding x_train, y_train, "
                "x_test, y_test (normalised by x_train's statistics, as train does)")
      ->check(non_empty_path())
      ->capture_default_str();
  c->add_option("--data-layout", opt->data_layout,
                "An .npz's 4-d images: nhwc (N x H x W x C) or nchw (N x C x H x W), where the shape does not say");
  c->add_option("--batch", opt->batch, "Images per forward pass")->check(integer<int64_t>(1))->capture_default_str();
  c->add_option("--threads", opt->threads, "Kernel threads")->check(integer<int>(1))->capture_default_str();
  c->callback([opt] {
    try {
      evaluate(*opt);
    } catch (const train::CheckpointError& e) {
      throw UsageError(e.what());
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  });
}

}  // namespace meshtrain::cli
