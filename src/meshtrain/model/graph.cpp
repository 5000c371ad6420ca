#include "meshtrain/model/graph.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "meshtrain/io/json.h"

namespace meshtrain::model {

// The named models' files, built into the program (cmake/embed_models.cmake writes it).
const std::vector<std::pair<const char*, const char*>>& named_model_texts();

namespace {

constexpr int64_t kMaxLayers = 10'000;
constexpr int64_t kMaxDim = 65'536;       // channels, features, image sides
constexpr int64_t kMaxWindow = 255;       // kernel, stride, padding
constexpr double kMaxLayerParams = 1u << 31;

// Which input an op takes: image models, token models, or both.
enum Takes { kImages = 1, kTokens = 2, kBoth = 3 };

struct OpInfo {
  Op op;
  const char* name;
  std::vector<const char*> fields;  // beyond name, op, from, unit
  const char* what;                 // for the list of ops
  int takes = kImages;
};

const std::vector<OpInfo>& ops() {
  static const std::vector<OpInfo> v = {
      {Op::conv2d, "conv2d", {"out_channels", "kernel_size", "stride", "padding", "bias"}, "a 2-D convolution"},
      {Op::batchnorm2d, "batchnorm2d", {"eps", "momentum"}, "batch normalisation over (N, H, W)"},
      {Op::relu, "relu", {}, "max(x, 0)"},
      {Op::maxpool2d, "maxpool2d", {"kernel_size", "stride", "padding"}, "max pooling"},
      {Op::avgpool2d, "avgpool2d", {"kernel_size", "stride", "padding"}, "average pooling (padding counted)"},
      {Op::global_avgpool2d, "global_avgpool2d", {}, "the mean of each channel's map"},
      {Op::flatten, "flatten", {}, "(C, H, W) to features"},
      {Op::linear, "linear", {"out_features", "bias", "tied_to"}, "a fully connected layer", kBoth},
      {Op::add, "add", {}, "the sum of two or more tensors of one shape", kBoth},
      {Op::concat, "concat", {}, "tensors joined along channels"},
      {Op::embedding, "embedding", {"num_embeddings", "embedding_dim"}, "a token's row of a table", kTokens},
      {Op::position_embedding, "position_embedding", {"num_embeddings", "embedding_dim"},
       "a position's row of a table", kTokens},
      {Op::layernorm, "layernorm", {"eps"}, "layer normalisation over features", kBoth},
      {Op::causal_self_attention, "causal_self_attention", {"heads", "bias"},
       "multi-head self-attention, each token over those before it", kTokens},
      {Op::gelu, "gelu", {"approximate"}, "the Gaussian error linear unit", kBoth},
      {Op::dropout, "dropout", {"p"}, "elements zeroed with probability p in training"},
  };
  return v;
}

std::string op_list(int takes = kBoth) {
  std::string s;
  for (const OpInfo& o : ops())
    if (o.takes & takes) s += (s.empty() ? "" : ", ") + std::string(o.name);
  return s;
}

std::string shape_text(const Shape& s) {
  std::string t = "(N";
  for (int64_t d : s) t += ", " + std::to_string(d);
  return t + ")";
}

// The refusals of one file: "<source>: layer 'x' (conv2d): <what>".
class Refuse {
 public:
  explicit Refuse(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void file(const std::string& what) const {
    throw std::invalid_argument(source_ + ": " + what + " (docs/models.md lists the format)");
  }
  [[noreturn]] void layer(size_t i, const std::string& name, const std::string& what) const {
    throw std::invalid_argument(source_ + ": layer " + std::to_string(i) +
                                (name.empty() ? std::string() : " '" + name + "'") + " " + what);
  }

 private:
  std::string source_;
};

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 200 || n.front() == '.' || n.back() == '.') return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

// An integer field from lo to hi; the refusal names the layer and the field.
int64_t integer(const nlohmann::json& v, const std::string& field, int64_t lo, int64_t hi,
                const std::function<void(const std::string&)>& fail) {
  const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  if (!v.is_number_integer()) fail("\"" + field + "\" is " + v.dump() + ", not " + range);
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : v.get<int64_t>() > hi)
    fail("\"" + field + "\" is " + v.dump() + ", more than " + std::to_string(hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo) fail("\"" + field + "\" is " + v.dump() + ", less than " + std::to_string(lo));
  return x;
}

double number(const nlohmann::json& v, const std::string& field, double lo, double hi, bool lo_open,
              const std::function<void(const std::string&)>& fail) {
  if (!v.is_number()) fail("\"" + field + "\" is " + v.dump() + ", not a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo))
    fail("\"" + field + "\" is " + v.dump() + ", not a number " + (lo_open ? "above " : "from ") +
         nlohmann::json(lo).dump() + (lo_open ? " and at most " : " to ") + nlohmann::json(hi).dump());
  return x;
}

}  // namespace

const char* op_name(Op op) {
  for (const OpInfo& o : ops())
    if (o.op == op) return o.name;
  return "?";
}

bool is_graph_json(const nlohmann::json& j) { return j.is_object() && j.contains("layers"); }

Graph parse_graph(const nlohmann::json& j, const std::string& source) {
  const Refuse refuse(source);
  if (!j.is_object()) refuse.file("a model file must be a JSON object with \"name\", \"input\" and \"layers\"");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "name" && it.key() != "input" && it.key() != "layers" && it.key() != "batch" &&
        it.key() != "imported_from")
      refuse.file("\"" + it.key() + "\" is not a field of a model file (its fields: name, input, layers, batch, "
                  "imported_from)");
  // "imported_from": the ONNX file `meshtrain import` read (a note for the reader; the weights
  // stay there, and --init-from FILE takes them).
  if (j.contains("imported_from") && !j["imported_from"].is_string())
    refuse.file("\"imported_from\" must be the path of the ONNX file the graph was imported from (a string)");
  Graph g;
  g.source = j;
  if (!j.contains("name") || !j["name"].is_string() || !valid_name(j["name"].get<std::string>()))
    refuse.file("\"name\" must be the model's name (letters, digits, '_', '-', '.')");
  g.name = j["name"].get<std::string>();
  auto top_fail = [&](const std::string& what) { refuse.file(what); };
  if (j.contains("batch")) g.batch = integer(j["batch"], "batch", 1, 1 << 20, top_fail);

  // ---- the input: images with classes, or tokens of a vocabulary ----
  if (!j.contains("input") || !j["input"].is_object())
    refuse.file("\"input\" must be an object such as {\"image\": [1, 28, 28], \"classes\": 10} or "
                "{\"tokens\": 64, \"vocab\": 256}");
  const nlohmann::json& in = j["input"];
  const bool tokens = in.contains("tokens") || in.contains("vocab");
  for (auto it = in.begin(); it != in.end(); ++it)
    if (tokens ? it.key() != "tokens" && it.key() != "vocab" : it.key() != "image" && it.key() != "classes")
      refuse.file("input.\"" + it.key() + "\" is not a field of the input (images: image and classes; tokens: tokens "
                  "and vocab)");
  if (tokens) {
    if (!in.contains("tokens")) refuse.file("input.\"tokens\" is missing: give a sample's length in tokens");
    if (!in.contains("vocab")) refuse.file("input.\"vocab\" is missing: give the size of the vocabulary");
    g.seq = integer(in["tokens"], "input.tokens", 1, kMaxDim, top_fail);
    g.vocab = integer(in["vocab"], "input.vocab", 2, 1 << 24, top_fail);
  } else {
    if (!in.contains("image") || !in["image"].is_array() || in["image"].size() != 3)
      refuse.file("input.\"image\" must be [channels, height, width]");
    for (size_t d = 0; d < 3; ++d)
      g.image.push_back(integer(in["image"][d], "input.image[" + std::to_string(d) + "]", 1, kMaxDim, top_fail));
    if (!in.contains("classes")) refuse.file("input.\"classes\" is missing: give the number of classes");
    g.classes = integer(in["classes"], "input.classes", 2, 1 << 20, top_fail);
  }
  const int takes = tokens ? kTokens : kImages;

  // ---- the layers ----
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty())
    refuse.file("\"layers\" must be a non-empty array of layers");
  if (static_cast<int64_t>(j["layers"].size()) > kMaxLayers)
    refuse.file("\"layers\" has " + std::to_string(j["layers"].size()) + " layers, more than the " +
                std::to_string(kMaxLayers) + " a graph may have");
  std::map<std::string, int> index;
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const nlohmann::json& l = j["layers"][i];
    if (!l.is_object()) refuse.layer(i, "", "is " + l.dump() + ", not an object such as {\"name\": ..., \"op\": ...}");
    const std::string name = l.contains("name") && l["name"].is_string() ? l["name"].get<std::string>() : "";
    auto fail = [&](const std::string& what) { refuse.layer(i, name, what); };
    if (!l.contains("name")) fail("has no \"name\"; give each layer a unique name (its parameters' prefix)");
    if (!valid_name(name))
      fail("has the name " + l["name"].dump() + "; a name is 1 to 200 letters, digits, '_', '-' or '.', not starting "
           "or ending with '.'");
    if (name == "input") fail("is named 'input', which \"from\" uses for the model's input; rename it");
    if (index.count(name)) fail("has the name of layer " + std::to_string(index[name]) + "; names must be unique");
    if (!l.contains("op") || !l["op"].is_string()) fail("has no \"op\"; give one of " + op_list(takes));
    const std::string op = l["op"].get<std::string>();
    const OpInfo* info = nullptr;
    for (const OpInfo& o : ops())
      if (op == o.name) info = &o;
    if (!info) fail("has the unknown op '" + op + "'; the ops are " + op_list(takes));
    if (!(info->takes & takes))
      fail("has the op '" + op + "', which " + (tokens ? "image" : "token") + " models take; a model of " +
           (tokens ? "tokens" : "images") + " takes " + op_list(takes));
    GraphLayer L;
    L.name = name, L.op = info->op;
    for (auto it = l.begin(); it != l.end(); ++it) {
      const std::string& k = it.key();
      if (k == "name" || k == "op" || k == "from" || k == "unit") continue;
      if (std::find_if(info->fields.begin(), info->fields.end(), [&](const char* f) { return k == f; }) ==
          info->fields.end()) {
        std::string fields;
        for (const char* f : info->fields) fields += std::string(fields.empty() ? "" : ", ") + f;
        fail("(" + op + ") has the unknown field \"" + k + "\"; " + op + " takes " +
             (fields.empty() ? std::string("no fields") : fields) + " besides name, op, from and unit");
      }
    }
    auto req = [&](const char* f) -> const nlohmann::json& {
      if (!l.contains(f)) fail("(" + op + ") needs \"" + f + "\"");
      return l[f];
    };
    auto field_fail = [&](const std::string& what) { fail("(" + op + "): " + what); };
    switch (L.op) {
      case Op::conv2d:
        L.out_channels = integer(req("out_channels"), "out_channels", 1, kMaxDim, field_fail);
        L.kernel = integer(req("kernel_size"), "kernel_size", 1, kMaxWindow, field_fail);
        if (l.contains("stride")) L.stride = integer(l["stride"], "stride", 1, kMaxWindow, field_fail);
        if (l.contains("padding")) L.padding = integer(l["padding"], "padding", 0, L.kernel / 2, field_fail);
        break;
      case Op::maxpool2d:
      case Op::avgpool2d:
        L.kernel = integer(req("kernel_size"), "kernel_size", 1, kMaxWindow, field_fail);
        L.stride = l.contains("stride") ? integer(l["stride"], "stride", 1, kMaxWindow, field_fail) : L.kernel;
        if (l.contains("padding")) L.padding = integer(l["padding"], "padding", 0, L.kernel / 2, field_fail);
        break;
      case Op::linear:
        L.out_channels = integer(req("out_features"), "out_features", 1, 1 << 24, field_fail);
        if (l.contains("tied_to")) {
          const nlohmann::json& t = l["tied_to"];
          auto it = t.is_string() ? index.find(t.get<std::string>()) : index.end();
          if (it == index.end() || g.layers[static_cast<size_t>(it->second)].op != Op::embedding)
            field_fail("\"tied_to\" is " + t.dump() + "; give the name of an earlier embedding whose weight it shares");
          L.tied = it->second;
        }
        break;
      case Op::embedding:
      case Op::position_embedding:
        L.num_embeddings = integer(req("num_embeddings"), "num_embeddings", 1, 1 << 24, field_fail);
        L.out_channels = integer(req("embedding_dim"), "embedding_dim", 1, kMaxDim, field_fail);
        break;
      case Op::causal_self_attention: L.heads = integer(req("heads"), "heads", 1, 4096, field_fail); break;
      case Op::layernorm:
        if (l.contains("eps")) L.eps = number(l["eps"], "eps", 0, 1, true, field_fail);
        break;
      case Op::dropout:
        if (l.contains("p")) {
          L.p = number(l["p"], "p", 0, 1, false, field_fail);
          if (L.p == 1) field_fail("\"p\" is 1, which drops everything; give a probability below 1");
        }
        break;
      case Op::gelu:
        if (l.contains("approximate")) {
          if (l["approximate"] != "none" && l["approximate"] != "tanh")
            field_fail("\"approximate\" is " + l["approximate"].dump() + "; give \"none\" (the exact erf) or \"tanh\"");
          L.tanh = l["approximate"] == "tanh";
        }
        break;
      case Op::batchnorm2d:
        if (l.contains("eps")) L.eps = number(l["eps"], "eps", 0, 1, true, field_fail);
        if (l.contains("momentum")) L.momentum = number(l["momentum"], "momentum", 0, 1, false, field_fail);
        break;
      default: break;
    }
    if (l.contains("bias")) {
      if (!l["bias"].is_boolean()) field_fail("\"bias\" is " + l["bias"].dump() + ", not true or false");
      L.bias = l["bias"].get<bool>();
    }
    if (l.contains("unit")) {
      if (!l["unit"].is_string() || !valid_name(l["unit"].get<std::string>()))
        fail("has \"unit\": " + l["unit"].dump() + "; a unit is named as a layer is");
      L.unit = l["unit"].get<std::string>();
    }
    // What it reads: the previous layer (the input for the first), or "from".
    std::vector<std::string> from;
    if (l.contains("from")) {
      const nlohmann::json& f = l["from"];
      if (f.is_string()) from.push_back(f.get<std::string>());
      else if (f.is_array() && !f.empty() && f.size() <= 64 && std::all_of(f.begin(), f.end(), [](const auto& x) { return x.is_string(); }))
        for (const auto& x : f) from.push_back(x.get<std::string>());
      else fail("has \"from\": " + f.dump() + "; give a layer's name, or a list of 1 to 64 names");
      for (const std::string& s : from) {
        if (s == "input") L.from.push_back(-1);
        else if (auto it = index.find(s); it != index.end()) L.from.push_back(it->second);
        else {
          bool later = s == name;
          for (size_t k = i + 1; k < j["layers"].size() && !later; ++k)
            later = j["layers"][k].is_object() && j["layers"][k].value("name", nlohmann::json()) == s;
          fail(later ? "reads '" + s + "', " + (s == name ? "itself" : "a later layer") +
                           ": a layer reads only the model's input and earlier layers (list them in the order they run)"
                     : "reads '" + s + "', which names no layer (nor 'input', the model's input)");
        }
      }
    } else {
      L.from.push_back(static_cast<int>(i) - 1);
    }
    const bool many = L.op == Op::add || L.op == Op::concat;
    if (many && L.from.size() < 2) fail("(" + op + ") needs \"from\" with two or more layers");
    if (!many && L.from.size() != 1) fail("(" + op + ") reads one tensor; give \"from\" one name");
    index[name] = static_cast<int>(i);
    g.layers.push_back(std::move(L));
  }
  // Every layer but the last is read: an output nothing reads would be computed for nothing.
  std::vector<bool> read(g.layers.size(), false);
  for (const GraphLayer& l : g.layers)
    for (int k : l.from)
      if (k >= 0) read[static_cast<size_t>(k)] = true;
  for (size_t i = 0; i + 1 < g.layers.size(); ++i)
    if (!read[i])
      refuse.layer(i, g.layers[i].name, "is read by no layer: only the last layer's output may go unread (the logits); "
                                        "name it in a later layer's \"from\", or remove it");
  if (g.tokens()) {
    if (!j.contains("batch")) g.batch = 12;
    infer_shapes(g, {g.seq});  // every shape meets, the last gives the logits
    return g;
  }
  infer_shapes(g, g.image);  // every shape meets, the last gives the logits
  unit_starts(g);            // the units given are whole
  return g;
}

Graph read_graph_file(const std::string& path) {
  const std::string source = "model file " + path;
  return parse_graph(io::read_json_file_strict(path, source, "give a JSON layer graph (docs/models.md)"), source);
}

void load_initial(nn::Module& m, const std::vector<std::pair<std::string, Tensor>>& weights,
                  const std::string& source) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : weights) by_name[name] = &t;
  std::vector<nn::Param*> all = m.params();
  for (nn::Param* b : m.buffers()) all.push_back(b);
  for (nn::Param* p : all) {
    auto it = by_name.find(p->name);
    if (it == by_name.end())
      throw std::invalid_argument(source + " has no tensor '" + p->name + "', which the model needs; give weights of "
                                  "the same network (or --init-from seed)");
    const Tensor& w = *it->second;
    if (w.shape() != p->global_shape)
      throw std::invalid_argument(source + " holds '" + p->name + "' as " + shape_str(w.shape()) + ", and the model's " +
                                  "is " + shape_str(p->global_shape));
    float* v = p->value.data();
    const int64_t n = p->value.numel();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = p->shard.global_index(p->global_shape, i);
      v[i] = g < 0 ? 0.f : w.data()[g];
    }
  }
}

namespace {

// A token model's shapes: (T, C) a sample.
std::vector<Shape> infer_token_shapes(const Graph& g, int64_t T) {
  const Refuse refuse(g.name);
  std::vector<Shape> out;
  auto name_of = [&](int k) { return k < 0 ? std::string("input") : g.layers[static_cast<size_t>(k)].name; };
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const GraphLayer& L = g.layers[i];
    const std::string op = op_name(L.op);
    auto fail = [&](const std::string& what) { refuse.layer(i, L.name, "(" + op + ") " + what); };
    const int src = L.from[0];
    const bool embeds = L.op == Op::embedding || L.op == Op::position_embedding;
    if (embeds != (src < 0))
      fail(embeds ? "reads '" + name_of(src) + "'; an embedding reads the tokens: give \"from\": \"input\""
                  : "reads the tokens; only an embedding takes them (put an embedding first)");
    const Shape x = src < 0 ? Shape{T} : out[static_cast<size_t>(src)];
    Shape y = x;
    switch (L.op) {
      case Op::embedding:
        if (L.num_embeddings != g.vocab)
          fail("has num_embeddings " + std::to_string(L.num_embeddings) + " for a vocabulary of " +
               std::to_string(g.vocab) + "; a token embedding has a row for every token (num_embeddings " +
               std::to_string(g.vocab) + ")");
        y = {T, L.out_channels};
        break;
      case Op::position_embedding:
        if (L.num_embeddings < T)
          fail("has " + std::to_string(L.num_embeddings) + " positions, fewer than the " + std::to_string(T) +
               " tokens of a sample; raise num_embeddings or lower input.tokens");
        y = {T, L.out_channels};
        break;
      case Op::causal_self_attention:
        if (x[1] % L.heads != 0)
          fail("has " + std::to_string(L.heads) + " heads over " + std::to_string(x[1]) +
               " features, which they do not divide; pick heads that divide " + std::to_string(x[1]));
        break;
      case Op::linear:
        if (L.tied >= 0) {
          const GraphLayer& e = g.layers[static_cast<size_t>(L.tied)];
          if (L.out_channels != e.num_embeddings || x[1] != e.out_channels)
            fail("is tied to '" + e.name + "', a " + std::to_string(e.num_embeddings) + " x " +
                 std::to_string(e.out_channels) + " table, but maps " + std::to_string(x[1]) + " features to " +
                 std::to_string(L.out_channels) + "; a tied layer maps embedding_dim to num_embeddings");
        }
        y = {T, L.out_channels};
        break;
      case Op::add:
        for (int k : L.from) {
          if (k < 0) fail("reads the tokens; only an embedding takes them");
          if (out[static_cast<size_t>(k)] != x)
            fail("adds '" + name_of(L.from[0]) + "' " + shape_text(x) + " and '" + name_of(k) + "' " +
                 shape_text(out[static_cast<size_t>(k)]) + ": the tensors of a sum must have one shape");
        }
        break;
      default: break;  // layernorm, gelu: the shape they take
    }
    out.push_back(y);
  }
  if (out.back() != Shape{T, g.vocab})
    refuse.layer(g.layers.size() - 1, g.layers.back().name,
                 "is the last layer and gives " + shape_text(out.back()) + "; the logits must be (N, " +
                     std::to_string(T) + ", " + std::to_string(g.vocab) + "), a score for every token of the " +
                     std::to_string(g.vocab) + ": end with a linear of out_features " + std::to_string(g.vocab));
  return out;
}

}  // namespace

std::vector<Shape> infer_shapes(const Graph& g, const Shape& chw) {
  if (g.tokens()) return infer_token_shapes(g, chw.at(0));
  const Refuse refuse(g.name);
  std::vector<Shape> out;
  auto in_of = [&](int k) -> const Shape& { return k < 0 ? chw : out[static_cast<size_t>(k)]; };
  auto name_of = [&](int k) { return k < 0 ? std::string("input") : g.layers[static_cast<size_t>(k)].name; };
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const GraphLayer& L = g.layers[i];
    const std::string op = op_name(L.op);
    auto fail = [&](const std::string& what) { refuse.layer(i, L.name, "(" + op + ") " + what); };
    const Shape& x = in_of(L.from[0]);
    auto needs_map = [&] {
      if (x.size() != 3)
        fail("takes a feature map (N, C, H, W); its input '" + name_of(L.from[0]) + "' is " + shape_text(x) +
             (L.op == Op::flatten ? "" : ": put it before the flatten"));
    };
    auto window = [&](const char* what) {
      needs_map();
      Shape s{0, 0, 0};
      for (int d = 1; d <= 2; ++d) {
        const int64_t span = x[d] + 2 * L.padding - L.kernel;
        if (span < 0)
          fail("has a " + std::to_string(L.kernel) + "x" + std::to_string(L.kernel) + " " + what + " over a " +
               std::to_string(x[1]) + "x" + std::to_string(x[2]) + " map (padding " + std::to_string(L.padding) +
               "): the map would shrink below 1; use a smaller kernel_size or more padding, or fewer layers that "
               "shrink it before");
        s[d] = span / L.stride + 1;
      }
      return s;
    };
    Shape y;
    switch (L.op) {
      case Op::conv2d: {
        y = window("convolution");
        y[0] = L.out_channels;
        const double params = static_cast<double>(L.out_channels) * static_cast<double>(x[0]) *
                              static_cast<double>(L.kernel * L.kernel);
        if (params > kMaxLayerParams) fail("would hold " + nlohmann::json(params).dump() + " weights, more than 2^31");
        break;
      }
      case Op::maxpool2d:
      case Op::avgpool2d: y = window("pooling window"), y[0] = x[0]; break;
      case Op::batchnorm2d: needs_map(), y = x; break;
      case Op::relu:
      case Op::gelu:
      case Op::dropout: y = x; break;
      case Op::layernorm:
        if (x.size() != 1)
          fail("normalises features (N, F); its input '" + name_of(L.from[0]) + "' is " + shape_text(x) +
               ": put a flatten (or a global_avgpool2d and a flatten) before it, or use batchnorm2d on a feature map");
        y = x;
        break;
      case Op::global_avgpool2d: needs_map(), y = {x[0], 1, 1}; break;
      case Op::flatten:
        if (x.size() != 3) fail("flattens a feature map; its input '" + name_of(L.from[0]) + "' is " + shape_text(x) + " already");
        y = {x[0] * x[1] * x[2]};
        break;
      case Op::linear:
        if (x.size() != 1)
          fail("takes features (N, F); its input '" + name_of(L.from[0]) + "' is " + shape_text(x) +
               ": put a flatten (or a global_avgpool2d and a flatten) before it");
        if (static_cast<double>(x[0]) * static_cast<double>(L.out_channels) > kMaxLayerParams)
          fail("would hold " + std::to_string(x[0]) + " x " + std::to_string(L.out_channels) + " weights, more than 2^31");
        y = {L.out_channels};
        break;
      case Op::add:
        for (int k : L.from)
          if (in_of(k) != x)
            fail("adds '" + name_of(L.from[0]) + "' " + shape_text(x) + " and '" + name_of(k) + "' " +
                 shape_text(in_of(k)) + ": the tensors of a sum must have one shape");
        y = x;
        break;
      case Op::concat:
        y = {0, 0, 0};
        for (int k : L.from) {
          const Shape& s = in_of(k);
          if (s.size() != 3 || s[1] != x[1] || s[2] != x[2] || x.size() != 3)
            fail("joins '" + name_of(L.from[0]) + "' " + shape_text(x) + " and '" + name_of(k) + "' " + shape_text(s) +
                 " along channels: they must be feature maps of one height and width");
          y[0] += s[0];
        }
        y[1] = x[1], y[2] = x[2];
        break;
      default: fail("is an op of token models");  // parse_graph refuses it first
    }
    out.push_back(y);
  }
  if (out.back() != Shape{g.classes})
    refuse.layer(g.layers.size() - 1, g.layers.back().name,
                 "is the last layer and gives " + shape_text(out.back()) + "; the logits must be (N, " +
                     std::to_string(g.classes) + ") for the " + std::to_string(g.classes) +
                     " classes: end with a linear of out_features " + std::to_string(g.classes));
  return out;
}

double forward_flops(const Graph& g, const std::vector<Shape>& shapes, const Shape& chw, size_t i) {
  const GraphLayer& l = g.layers[i];
  const Shape& in = l.from[0] < 0 ? chw : shapes[static_cast<size_t>(l.from[0])];
  if (l.op == Op::conv2d)
    return 2.0 * static_cast<double>(shape_numel(shapes[i])) * static_cast<double>(in[0] * l.kernel * l.kernel);
  if (g.tokens()) {  // (T, C) a sample
    const double T = static_cast<double>(shapes[i][0]);
    if (l.op == Op::linear) return 2.0 * T * static_cast<double>(in[1] * l.out_channels);
    if (l.op == Op::causal_self_attention) {
      const double C = static_cast<double>(in[1]);
      // q.k and p.v over the causal triangle (T (T + 1) / 2 pairs), 2 C FLOPs a pair each.
      return 2.0 * T * C * 3 * C + 2.0 * T * C * C + 2 * 2.0 * C * T * (T + 1) / 2;
    }
    return 0;
  }
  if (l.op == Op::linear) return 2.0 * static_cast<double>(in[0]) * static_cast<double>(l.out_channels);
  return 0;
}

namespace {

// The tensors live across each place a pipeline could cut: before layer i (i = 1 .. n - 1),
// besides layer i - 1's output, count[i] earlier tensors (the input, layers [0, i - 1)) are read
// at i or later; one[i] is that tensor when count[i] is 1 (-1: the input).
struct Crossing {
  std::vector<int> count, one;
};

Crossing crossing(const Graph& g) {
  const int n = static_cast<int>(g.layers.size());
  // last_read[k + 1]: the last layer that reads layer k (k = -1: the input).
  std::vector<int> last_read(static_cast<size_t>(n) + 1, -1);
  for (int i = 0; i < n; ++i)
    for (int k : g.layers[static_cast<size_t>(i)].from) last_read[static_cast<size_t>(k + 1)] = i;
  // Tensor k crosses the cuts before layers k + 2 .. last_read: difference arrays of the count
  // and of the sum of (k + 1), which names the one tensor where the count is 1.
  std::vector<int64_t> dc(static_cast<size_t>(n) + 2, 0), ds(static_cast<size_t>(n) + 2, 0);
  for (int k = -1; k < n; ++k) {
    const int lo = k + 2, hi = last_read[static_cast<size_t>(k + 1)];
    if (hi < lo) continue;
    dc[static_cast<size_t>(lo)] += 1, dc[static_cast<size_t>(hi) + 1] -= 1;
    ds[static_cast<size_t>(lo)] += k + 1, ds[static_cast<size_t>(hi) + 1] -= k + 1;
  }
  Crossing c{std::vector<int>(static_cast<size_t>(n), 0), std::vector<int>(static_cast<size_t>(n), kNoSkip)};
  int64_t count = 0, sum = 0;
  for (int i = 0; i < n; ++i) {
    count += dc[static_cast<size_t>(i)], sum += ds[static_cast<size_t>(i)];
    c.count[static_cast<size_t>(i)] = static_cast<int>(count);
    if (count == 1) c.one[static_cast<size_t>(i)] = static_cast<int>(sum) - 1;
  }
  return c;
}

// Per place a cut could fall (before layer i): inside a block of parallel branches (a concat of
// chains of single-input layers, each read only by the next, from one source: model/cnn.cpp
// builds it as one node that --branch-parallel places by branch), which a cut must not split.
std::vector<bool> inside_branch_blocks(const Graph& g) {
  const size_t n = g.layers.size();
  std::vector<int> readers(n, 0);
  for (const GraphLayer& l : g.layers)
    for (int k : l.from)
      if (k >= 0) ++readers[static_cast<size_t>(k)];
  std::vector<bool> inside(n, false);
  for (size_t c = 0; c < n; ++c) {
    if (g.layers[c].op != Op::concat) continue;
    int source = kNoSkip, lo = static_cast<int>(c);
    bool block = true;
    for (int k : g.layers[c].from) {
      int p = k;
      while (p >= 0 && readers[static_cast<size_t>(p)] == 1 && g.layers[static_cast<size_t>(p)].from.size() == 1) {
        lo = std::min(lo, p);
        p = g.layers[static_cast<size_t>(p)].from[0];
      }
      if (source != kNoSkip && p != source) block = false;
      source = p;
    }
    if (block)
      for (int i = lo + 1; i <= static_cast<int>(c); ++i) inside[static_cast<size_t>(i)] = true;
  }
  return inside;
}

// Whether a unit may start at layer i (0 < i < n) when the file gives no unit that spans it:
// no other tensor, or one skip outside a block of parallel branches.
bool may_start(const Crossing& c, const std::vector<bool>& inside, int i) {
  const int k = c.count[static_cast<size_t>(i)];
  return k == 0 || (k == 1 && !inside[static_cast<size_t>(i)]);
}

}  // namespace

std::vector<int> unit_starts(const Graph& g) {
  const Refuse refuse(g.name);
  const int n = static_cast<int>(g.layers.size());
  const Crossing cross = crossing(g);
  const std::vector<bool> inside = inside_branch_blocks(g);
  std::set<std::string> closed;  // units already ended
  std::vector<int> starts{0};
  for (int i = 0; i + 1 < n; ++i) {
    const GraphLayer &a = g.layers[static_cast<size_t>(i)], &b = g.layers[static_cast<size_t>(i + 1)];
    const bool same = !a.unit.empty() && a.unit == b.unit;
    if (same) continue;
    if (!a.unit.empty()) closed.insert(a.unit);
    if (!b.unit.empty() && closed.count(b.unit))
      refuse.layer(static_cast<size_t>(i + 1), b.name,
                   "is in unit '" + b.unit + "', which ended before it; a unit's layers must be consecutive");
    if (!a.unit.empty() && !b.unit.empty()) {
      // Units the file gives are kept as given: each ends where nothing but its output is live.
      if (cross.count[static_cast<size_t>(i + 1)] == 0) {
        starts.push_back(i + 1);
      } else {
        refuse.layer(static_cast<size_t>(i + 1), b.name,
                     "starts unit '" + b.unit + "', but a layer after it reads one before it: a pipeline cannot cut "
                     "there; put both in one unit");
      }
    } else if (may_start(cross, inside, i + 1)) {
      starts.push_back(i + 1);
    }
  }
  starts.push_back(n);
  return starts;
}

std::vector<int> unit_skips(const Graph& g) {
  const std::vector<int> starts = unit_starts(g);
  const Crossing cross = crossing(g);
  std::vector<int> skips(starts.size(), kNoSkip);
  for (size_t u = 1; u + 1 < starts.size(); ++u) skips[u] = cross.one[static_cast<size_t>(starts[u])];
  return skips;
}

SkipPortals skip_portals(const Graph& g, const std::vector<Shape>& shapes, const std::vector<int64_t>& first_unit) {
  const std::vector<int> starts = unit_starts(g), skips = unit_skips(g);
  const ChannelSplits splits = channel_splits(g);
  const int stages = static_cast<int>(first_unit.size());
  const int64_t units = static_cast<int64_t>(starts.size()) - 1;
  auto first_layer = [&](int s) { return starts[static_cast<size_t>(first_unit[static_cast<size_t>(s)])]; };
  auto end_layer = [&](int s) {
    return s + 1 < stages ? starts[static_cast<size_t>(first_unit[static_cast<size_t>(s) + 1])]
                          : starts[static_cast<size_t>(units)];
  };
  auto stage_of_layer = [&](int i) {
    for (int s = stages - 1; s >= 0; --s)
      if (i >= first_layer(s)) return s;
    return 0;
  };
  auto name_of = [&](int k) { return k < 0 ? std::string("input") : g.layers[static_cast<size_t>(k)].name; };
  SkipPortals p{std::vector<int>(static_cast<size_t>(stages), -1), std::vector<int>(static_cast<size_t>(stages), -1),
                std::vector<int>(static_cast<size_t>(stages), kNoSkip),
                std::vector<int>(static_cast<size_t>(stages), kNoSkip)};
  const std::string advice = ": the pipeline carries one skip out of a stage and one into it, to one stage; "
                             "cut elsewhere with --pp-cuts (model show lists the layers and the skips)";
  for (int s = 0; s + 1 < stages; ++s) {
    const int k = skips[static_cast<size_t>(first_unit[static_cast<size_t>(s) + 1])];
    if (k == kNoSkip) continue;
    // A skip crossing the cut before too was sent from an earlier stage, past this one. Else
    // this stage has it: it makes it, or it is the stage's input (the main tensor of the cut before).
    if (s > 0 && skips[static_cast<size_t>(first_unit[static_cast<size_t>(s)])] == k) continue;
    const int maker = s;
    std::set<int> readers;
    for (size_t i = static_cast<size_t>(end_layer(s)); i < g.layers.size(); ++i)
      for (int f : g.layers[i].from)
        if (f == k) readers.insert(stage_of_layer(static_cast<int>(i)));
    if (readers.size() > 1) {
      std::string where;
      for (size_t i = static_cast<size_t>(end_layer(s)); i < g.layers.size(); ++i)
        for (int f : g.layers[i].from)
          if (f == k) {
            if (!where.empty()) where += ", ";
            where += "'";
            where += g.layers[i].name;
            where += "'";
          }
      throw std::invalid_argument(g.name + ": the skip from '" + name_of(k) + "' crosses the pipeline cut before '" +
                                  name_of(end_layer(s)) + "' and is read by " + where + " on " +
                                  std::to_string(readers.size()) + " later stages" + advice);
    }
    const int to = *readers.begin();
    if (p.sent[static_cast<size_t>(maker)] != kNoSkip || p.taken[static_cast<size_t>(to)] != kNoSkip)
      throw std::invalid_argument(g.name + ": the pipeline cut before '" + name_of(end_layer(s)) + "' would need a "
                                  "second skip portal (the skip from '" + name_of(k) + "')" + advice);
    p.to[static_cast<size_t>(maker)] = to, p.sent[static_cast<size_t>(maker)] = k;
    p.from[static_cast<size_t>(to)] = maker, p.taken[static_cast<size_t>(to)] = k;
  }
  // One shape a stage's portal: a stage that takes one skip and sends another needs both alike.
  auto shape_of = [&](int k) { return k < 0 ? Shape{} : shapes[static_cast<size_t>(k)]; };
  for (int s = 0; s < stages; ++s) {
    const int in = p.taken[static_cast<size_t>(s)], out = p.sent[static_cast<size_t>(s)];
    if (in == kNoSkip || out == kNoSkip) continue;
    const bool split_in = in >= 0 && splits.out_split[static_cast<size_t>(in)];
    const bool split_out = out >= 0 && splits.out_split[static_cast<size_t>(out)];
    if (in < 0 || out < 0 || shape_of(in) != shape_of(out) || split_in != split_out)
      throw std::invalid_argument(g.name + ": pipeline stage " + std::to_string(s) + " (from '" +
                                  name_of(first_layer(s)) + "') would take the skip from '" + name_of(in) +
                                  "' and send the skip from '" + name_of(out) + "', of another shape" + advice);
  }
  return p;
}

ChannelSplits channel_splits(const Graph& g) {
  const size_t n = g.layers.size();
  std::vector<std::vector<int>> readers(n);
  for (size_t i = 0; i < n; ++i)
    for (int k : g.layers[i].from)
      if (k >= 0) readers[static_cast<size_t>(k)].push_back(static_cast<int>(i));
  ChannelSplits s{std::vector<bool>(n, false), std::vector<bool>(n, false)};
  for (size_t a = 0; a < n; ++a) {
    const Op kind = g.layers[a].op;
    if ((kind != Op::conv2d && kind != Op::linear) || s.in_split[a]) continue;
    std::vector<size_t> between;
    size_t cur = a;
    while (readers[cur].size() == 1) {
      const size_t r = static_cast<size_t>(readers[cur][0]);
      const Op op = g.layers[r].op;
      const bool per_channel = op == Op::batchnorm2d || op == Op::maxpool2d || op == Op::avgpool2d;
      if (op == Op::relu || op == Op::gelu || (kind == Op::conv2d && per_channel)) {
        between.push_back(r);
        cur = r;
        continue;
      }
      if (op == kind && !s.in_split[r]) {
        s.out_split[a] = s.in_split[r] = true;
        for (size_t m : between) s.in_split[m] = s.out_split[m] = true;
      }
      break;
    }
  }
  return s;
}

bool graph_takes_blocked(const Graph& g) {
  const std::vector<Shape> shapes = infer_shapes(g, g.image);
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const GraphLayer& L = g.layers[i];
    // Dropout draws by an element's place in NCHW order; a blocked map's order differs.
    if (L.op == Op::dropout && shapes[i].size() == 3) return false;
    if (L.op == Op::maxpool2d || L.op == Op::avgpool2d || L.op == Op::concat) return false;
    if (L.op == Op::flatten && (L.from[0] < 0 || g.layers[static_cast<size_t>(L.from[0])].op != Op::global_avgpool2d))
      return false;
    for (int k : L.from)
      if (k < 0 && L.op != Op::conv2d) return false;  // the images are NCHW
  }
  return true;
}

std::shared_ptr<const Graph> named_graph(const std::string& name) {
  static const std::map<std::string, std::shared_ptr<const Graph>> graphs = [] {
    std::map<std::string, std::shared_ptr<const Graph>> m;
    for (const auto& [n, text] : named_model_texts()) {
      const std::string source = std::string("models/") + n + ".json";
      m[n] = std::make_shared<const Graph>(parse_graph(io::parse_json_strict(text, source, ""), source));
    }
    return m;
  }();
  auto it = graphs.find(name);
  return it == graphs.end() ? nullptr : it->second;
}

std::vector<std::string> named_graph_names() {
  std::vector<std::string> v;
  for (const auto& [n, text] : named_model_texts()) v.push_back(n);
  return v;
}

}  // namespace meshtrain::model
