#include "meshtrain/model/spec.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace meshtrain::model {

namespace {

class GPTSpec : public ModelSpec {
 public:
  explicit GPTSpec(GPTConfig c) : cfg_(std::move(c)) {}
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "gpt"; }
  InputKind input() const override { return InputKind::tokens; }
  nlohmann::json to_json() const override { return cfg_.to_json(); }
  int64_t num_units() const override { return cfg_.n_layer; }
  std::unique_ptr<Stage> make_stage(const StageSpec& spec, uint64_t seed, const StageFactories& f) const override {
    return std::make_unique<GPTStage>(cfg_, seed, spec, f.transformer ? f.transformer : plain_layout());
  }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override { return gpt_param_shapes(cfg_); }
  double flops_per_sample(int64_t T) const override { return cfg_.flops_per_token(T) * static_cast<double>(T); }
  int64_t default_batch() const override { return cfg_.batch; }
  int64_t default_seq() const override { return cfg_.seq; }
  const GPTConfig* gpt() const override { return &cfg_; }

 private:
  GPTConfig cfg_;
};

class CNNSpec : public ModelSpec {
 public:
  explicit CNNSpec(CNNConfig c) : cfg_(std::move(c)), units_(cnn_num_units(cfg_)) {}
  std::string name() const override { return cfg_.name; }
  std::string family() const override { return "cnn"; }
  InputKind input() const override { return InputKind::images; }
  nlohmann::json to_json() const override { return cfg_.to_json(); }
  int64_t num_units() const override { return units_; }
  std::unique_ptr<Stage> make_stage(const StageSpec& spec, uint64_t seed, const StageFactories& f) const override {
    return std::make_unique<CNNStage>(cfg_, seed, spec.first_layer, spec.end_layer, spec.embedding, spec.head, f.conv);
  }
  std::vector<std::pair<std::string, Shape>> param_shapes() const override { return cnn_param_shapes(cfg_); }
  std::vector<std::pair<std::string, Shape>> buffer_shapes() const override { return cnn_buffer_shapes(cfg_); }
  double flops_per_sample(int64_t) const override { return cnn_flops_per_image(cfg_); }
  int64_t default_batch() const override { return cfg_.batch; }
  Shape sample_shape() const override { return {cfg_.channels, cfg_.height, cfg_.width}; }
  int64_t classes() const override { return cfg_.classes; }
  const CNNConfig* cnn() const override { return &cfg_; }

 private:
  CNNConfig cfg_;
  int64_t units_;
};

}  // namespace

std::shared_ptr<const ModelSpec> gpt_spec(const GPTConfig& cfg) { return std::make_shared<GPTSpec>(cfg); }
std::shared_ptr<const ModelSpec> cnn_spec(const CNNConfig& cfg) { return std::make_shared<CNNSpec>(cfg); }

bool is_cnn_name(const std::string& name) {
  for (const std::string& n : cnn_config_names())
    if (n == name) return true;
  return false;
}

std::shared_ptr<const ModelSpec> model_spec(const std::string& name) {
  if (is_cnn_name(name)) return cnn_spec(cnn_config(name));
  try {
    return gpt_spec(gpt_config(name));
  } catch (const std::invalid_argument&) {
    std::string names;
    for (const std::string& n : gpt_config_names()) names += n + ", ";
    for (const std::string& n : cnn_config_names()) names += n + ", ";
    names.resize(names.size() - 2);
    throw std::invalid_argument("unknown model '" + name + "'; the named models are " + names +
                                " (or --config FILE.json)");
  }
}

std::shared_ptr<const ModelSpec> model_spec_from_file(const std::string& path) {
  std::error_code ec;
  // Anything but a readable regular file: gpt_config_from_file says what is wrong with it.
  if (!std::filesystem::is_regular_file(path, ec)) return gpt_spec(gpt_config_from_file(path));
  std::ifstream f(path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("family") && j["family"] != "gpt") {
    const std::string source = "model config file " + path;
    if (j["family"] != "cnn")
      throw std::invalid_argument(source + ": \"family\" must be \"gpt\" or \"cnn\", not " + j["family"].dump());
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "family" && it.key() != "name" && it.key() != "scale")
        throw std::invalid_argument(source + ": unknown field \"" + it.key() +
                                    "\" for a CNN; give \"family\": \"cnn\", \"name\": one of cnn-small, "
                                    "resnet-small, inception-small, and optionally \"scale\"");
    if (!j.contains("name") || !j["name"].is_string())
      throw std::invalid_argument(source + ": a CNN config needs \"name\": cnn-small, resnet-small or inception-small");
    CNNConfig cfg;
    try {
      cfg = cnn_config(j["name"].get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(source + ": " + e.what());
    }
    // "scale": k takes images k times larger each way (the data set's upsampled, nearest
    // neighbour), e.g. 4 for 112 x 112 from Fashion-MNIST's 28 x 28.
    if (j.contains("scale")) {
      const auto& k = j["scale"];
      if (!k.is_number_integer() || k.get<int64_t>() < 1 || k.get<int64_t>() > 16)
        throw std::invalid_argument(source + ": \"scale\" must be an integer 1..16 (the input's size over the data "
                                    "set's), not " + k.dump());
      cfg.height *= k.get<int64_t>();
      cfg.width *= k.get<int64_t>();
    }
    return cnn_spec(cfg);
  }
  return gpt_spec(gpt_config_from_file(path));  // every check of a GPT config (and of bad JSON)
}

}  // namespace meshtrain::model
