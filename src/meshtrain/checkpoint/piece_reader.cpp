// Reading a checkpoint's pieces (checkpoint.h): PieceReader copies out of the mapped rank files
// only the elements asked for, and the full-tensor loaders assemble one logical tensor at a time;
// the checks of an index's tensor set.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>

#include "meshtrain/checkpoint/checkpoint.h"

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {

// A run of elements that is contiguous in the logical tensor: from `global`, `n` of them,
// at `at` in the buffer they come from or go to.
struct Run {
  int64_t global, n, at;
};

std::vector<Run> runs_of(const nn::ShardSpec& tp, const Shape& shape, int64_t begin, int64_t end) {
  std::vector<Run> out;
  tp.for_each_run(shape, begin, end, [&](int64_t l, int64_t g, int64_t n) { out.push_back({g, n, l - begin}); });
  return out;
}

// Whether all n floats are finite: no exponent field of all ones (integer work, vectorised).
bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

bool same_cut(const nn::ShardSpec& a, const nn::ShardSpec& b) {
  if (!a.is_split() || !b.is_split()) return a.is_split() == b.is_split();
  return a.dim == b.dim && a.groups == b.groups && a.rank == b.rank && a.size == b.size && a.padded == b.padded;
}

}  // namespace

const StoredTensor* CheckpointIndex::find(const std::string& name) const {
  for (const auto* part : {&model, &optimizer}) {
    auto it = part->find(name);
    if (it != part->end()) return &it->second;
  }
  return nullptr;
}

std::vector<std::pair<std::string, Shape>> CheckpointIndex::shapes(const std::map<std::string, StoredTensor>& part) const {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [n, t] : part) out.emplace_back(n, t.shape);
  return out;
}

const SafetensorsFile& PieceReader::file(const std::string& name) {
  auto& f = files_[name];
  if (!f) f = std::make_unique<SafetensorsFile>((fs::path(index_.folder) / name).string());
  return *f;
}

void PieceReader::read(const std::string& name, const Shape& shape, const nn::ShardSpec& tp, int64_t begin,
                       int64_t end, float* dst) {
  const StoredTensor* t = index_.find(name);
  if (!t) throw CheckpointError("checkpoint " + index_.folder + " lacks tensor " + name);
  if (t->shape != shape)
    throw CheckpointError("checkpoint tensor " + name + " has shape " + shape_str(t->shape) + ", the model expects " +
                          shape_str(shape));
  if (end > begin) std::memset(dst, 0, static_cast<size_t>(end - begin) * sizeof(float));  // padding stays 0
  const std::vector<Run> want = runs_of(tp, shape, begin, end);
  int64_t needed = 0, copied = 0;
  for (const Run& r : want) needed += r.n;
  for (const StoredPiece& p : t->pieces) {
    const SafetensorsFile* f = nullptr;
    const SafetensorsEntry* e = nullptr;
    auto copy = [&](int64_t from, int64_t n, float* to) {  // elements [from, from + n) of the piece
      if (!f) {
        f = &file(p.file);
        e = f->find(p.key);
        if (!e || shape_numel(e->shape) != p.spec.numel())
          throw CheckpointError("checkpoint " + index_.folder + " is corrupt: " + p.file + " lacks piece " + p.key +
                                " of " + std::to_string(p.spec.numel()) + " elements; resume from an earlier step");
      }
      f->copy(*e, from, n, to);
      // The trainer never saves a diverged step, so NaN or infinity here means an altered file
      // (its CRCs rewritten) or a writer other than meshtrain: refused, never sampled from.
      if (!all_finite(to, n))
        throw CheckpointError("checkpoint " + index_.folder + ": " + p.file +
                              " holds non-finite values (NaN or infinity) in tensor " + name +
                              (p.key == name ? "" : " (piece " + p.key + ")") +
                              "; it was not saved so by meshtrain train: use another step or checkpoint");
      bytes_read_ += (e->end - e->begin) / std::max<int64_t>(1, shape_numel(e->shape)) * n;
      copied += n;
    };
    if (same_cut(p.spec.tp, tp)) {  // the same tp-local tensor: one range
      const int64_t s = std::max(begin, p.spec.begin), x = std::min(end, p.spec.end);
      if (s >= x) continue;
      // Padding elements count as copied here but not in `needed`: count the real ones.
      int64_t real = 0;
      tp.for_each_run(shape, s, x, [&](int64_t, int64_t, int64_t n) { real += n; });
      copy(s - p.spec.begin, x - s, dst + (s - begin));
      copied += real - (x - s);
      continue;
    }
    // Another cut (saved at another tp): intersect the runs of both in the logical tensor.
    const std::vector<Run> have = runs_of(p.spec.tp, shape, p.spec.begin, p.spec.end);
    size_t i = 0, k = 0;
    while (i < want.size() && k < have.size()) {
      const Run &w = want[i], &h = have[k];
      const int64_t lo = std::max(w.global, h.global), hi = std::min(w.global + w.n, h.global + h.n);
      if (lo < hi) copy(h.at + (lo - h.global), hi - lo, dst + w.at + (lo - w.global));
      (w.global + w.n <= h.global + h.n) ? ++i : ++k;
    }
  }
  if (copied != needed)
    throw CheckpointError("checkpoint " + index_.folder + " is incomplete: its pieces give " + std::to_string(copied) +
                          " of the " + std::to_string(needed) + " elements of " + name +
                          " asked for; resume from an earlier step");
}

Tensor PieceReader::full(const std::string& name) {
  const StoredTensor* t = index_.find(name);
  if (!t) throw CheckpointError("checkpoint " + index_.folder + " lacks tensor " + name);
  Tensor out = Tensor::empty(t->shape);
  read(name, t->shape, {}, 0, out.numel(), out.data());
  return out;
}

// ---- full tensors ----

namespace {

std::vector<std::pair<std::string, Tensor>> all_full(PieceReader& rd, const std::map<std::string, StoredTensor>& part) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : part) out.emplace_back(name, rd.full(name));  // by name, as read_safetensors
  return out;
}

CheckpointData load(const std::string& path, bool model_only) {
  const CheckpointIndex index = open_checkpoint(path, model_only);
  PieceReader rd(index);
  CheckpointData out;
  out.step = index.step;
  out.config = index.config;
  out.state = index.state;
  out.model = all_full(rd, index.model);
  if (!model_only) out.optimizer = all_full(rd, index.optimizer);
  return out;
}

}  // namespace

CheckpointData load_checkpoint(const std::string& path) { return load(path, false); }
CheckpointData load_checkpoint_model(const std::string& path) { return load(path, true); }

std::vector<std::pair<std::string, Tensor>> load_model_weights(const std::string& path) try {
  if (fs::is_regular_file(path)) return read_safetensors(path);
  if (!fs::is_directory(path))
    throw CheckpointError("weights " + path +
                          " do not exist; pass a checkpoint directory, a step folder or a "
                          ".safetensors file");
  const fs::path p(path);
  if (!fs::exists(p / "index.json") && !fs::exists(p / "latest")) {
    if (fs::is_regular_file(p / "model.safetensors")) return read_safetensors((p / "model.safetensors").string());
    throw CheckpointError("no weights in " + path +
                          ": it holds neither a checkpoint (index.json or latest) nor model.safetensors");
  }
  return load_checkpoint_model(path).model;
} catch (const fs::filesystem_error& e) {
  throw CheckpointError("cannot load weights from " + path + ": " + e.what());
}

// ---- tensor sets ----

void check_tensor_set(const std::string& source, const std::vector<std::pair<std::string, Shape>>& expected,
                      const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::pair<std::string, Shape>> saved;
  for (const auto& [n, t] : tensors) saved.emplace_back(n, t.shape());
  check_tensor_set(source, expected, saved);
}

void check_tensor_set(const std::string& source, const std::vector<std::pair<std::string, Shape>>& expected,
                      const std::vector<std::pair<std::string, Shape>>& saved) {
  std::map<std::string, const Shape*> got;
  for (const auto& [n, s] : saved) got[n] = &s;
  for (const auto& [name, shape] : expected) {
    auto it = got.find(name);
    if (it == got.end())
      throw CheckpointError(source + " lacks tensor " + name + " " + shape_str(shape) +
                            ", which its index config needs; the checkpoint does not match its index");
    if (*it->second != shape)
      throw CheckpointError(source + ": tensor " + name + " has shape " + shape_str(*it->second) +
                            " but its index config needs " + shape_str(shape) +
                            "; the checkpoint does not match its index");
    got.erase(it);
  }
  if (!got.empty())
    throw CheckpointError(source + " holds tensor " + got.begin()->first +
                          ", which its index config has no place for; the checkpoint does not match its index");
}

}  // namespace meshtrain::train
