// Checkpoints of the rank loop: every rank saves the pieces it holds (checkpoint/checkpoint.h) and
// restores what it needs from the pieces that overlap it; choosing what --resume continues.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <zlib.h>

#include "meshtrain/io/file.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/rank_trainer.h"

namespace meshtrain::train::detail {

namespace {
// What identifies the data file a run trains on, for the note of a resume with another file:
// its name, its size and the CRC32 of its first and last MiB (cheap for any size).
nlohmann::json data_identity(const std::string& path) {
  std::error_code ec;
  const int64_t size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec) return {{"path", path}};
  std::ifstream f(path, std::ios::binary);
  uLong crc = crc32(0L, Z_NULL, 0);
  const int64_t window = 1 << 20;
  std::vector<char> buf(static_cast<size_t>(std::min(size, window)));
  for (int64_t at : {int64_t{0}, std::max<int64_t>(0, size - window)}) {
    f.seekg(at);
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(f.gcount()));
  }
  return {{"path", path}, {"bytes", size}, {"crc32_ends", static_cast<uint64_t>(crc)}};
}
}  // namespace

nlohmann::json run_config(const model::ModelSpec& spec, const TrainOptions& o) {
  return {{"model", spec.to_json()}, {"batch", o.batch},  {"seq", o.seq},
          {"seed", o.seed},         {"data_order", to_string(o.data_order)},
          {"steps", o.steps},       {"layout", {{"dp", o.dp}, {"tp", o.tp}, {"pp", o.pp}, {"zero", o.zero}}},
          {"data", data_identity(o.data)},
          {"optimizer", {{"name", to_string(o.optim.kind)}, {"state", state_prefixes(o.optim)}}}};
}

// ---- saving: each rank its pieces ----

// What this rank writes: of every parameter it holds, its value and the optimizer's state
// tensors (exp_avg and exp_avg_sq, or momentum_buffer: Optimizer::state()) over the same flat
// range of the tp-local tensor, as views (nothing is copied). Every logical element is written by exactly one rank: under ZeRO 1-3 each dp rank its segments; without
// ZeRO each dp rank the dp_rank-th of dp near-equal ranges of every parameter (the copies are
// equal); a tp-replicated parameter by tp rank 0 only, one owned by a tp rank (an Inception
// branch under --branch-parallel) by its owner; the last stage's copy of the tied wte not at all.
RankPieces RankTrainer::my_pieces() {
  RankPieces out;
  const std::vector<nn::Param*> opt = ddp_ ? ddp_->optimizer_params() : stage_params();
  const bool sliced = ddp_ && o_.zero >= 1;
  const std::vector<Optimizer::StateSlot>& state = optimizer_->state();
  const int64_t d = mesh_.coord().dp, P = o_.dp;
  for (size_t k = 0; k < opt.size(); ++k) {
    nn::Param* q = opt[k];
    const nn::Param* p = ddp_ ? ddp_->origin(q) : q;
    if (p == wte_copy() || !p->shard.counted_on(mesh_.coord().tp)) continue;
    int64_t begin = 0, end = 0;
    if (sliced) {
      begin = ddp_->segment_offset(q), end = begin + q->value.numel();
    } else {
      const int64_t n = p->local_numel();
      begin = d * (n / P) + std::min(d, n % P), end = begin + n / P + (d < n % P ? 1 : 0);
    }
    if (begin == end) continue;
    const int64_t at = sliced ? 0 : begin;  // where the range starts in q's tensors
    auto piece = [&](const std::string& name, const Tensor& t) {
      return SavePiece{{name, p->global_shape, p->shard, begin, end}, Tensor::view(t, at, {end - begin})};
    };
    out.model.push_back(piece(p->name, q->value));
    for (const Optimizer::StateSlot& slot : state)
      out.optimizer.push_back(piece(slot.prefix + "." + p->name, slot.tensors[k]));
  }
  // Buffers (batch norm's running statistics): the same on every dp rank (their statistics are
  // synchronised), so dp rank 0 writes each, with the model: tp rank 0 a replicated one, every
  // tp rank its part of one split over channels, the owner an owned one.
  if (d == 0)
    for (auto& stage : stages_)
      for (nn::Param* b : stage->buffers())
        if (b->shard.counted_on(mesh_.coord().tp))
          out.model.push_back(SavePiece{{b->name, b->global_shape, b->shard, 0, b->value.numel()}, b->value});
  return out;
}

// `root`'s `text` on every rank (at most 1 KiB of it): a collective over `world`.
static std::string shared_message(comm::Communicator& world, int root, const std::string& text) {
  std::array<int64_t, 128> buf{};
  if (world.rank() == root) std::memcpy(buf.data(), text.data(), std::min(text.size(), sizeof buf - 1));
  world.broadcast(buf, {.root = root});
  const char* c = reinterpret_cast<const char*>(buf.data());
  return std::string(c, strnlen(c, sizeof buf));
}

// Every rank writes its two files into the step's tmp folder at the same time; rank 0 commits.
// Three collectives over the world: rank 0's folder is ready (broadcast), every rank's files are
// written (all-gather of their digests and figures), rank 0 has committed (broadcast). A rank
// that fails makes every rank throw; rank 0 then removes the tmp folder (a full disk gets its
// space back) and the message says which checkpoint stays `latest`. `metrics_line` (rank 0: the
// step's metrics line, without the save's timings) goes into the checkpoint's state, so a
// resume can write it back when a kill came between the commit and the metrics file
// (train/metrics.h, trim_metrics_for_resume).
void RankTrainer::save(int64_t step, const nlohmann::json* metrics_line) {
  flush_pipeline();  // asynchronous pipelines: a checkpoint holds no step in flight
  comm::Communicator& world = mesh_.world();
  const std::string& dir = o_.checkpoint_dir;
  const std::string folder = dir + "/" + step_folder_name(step);
  const auto t0 = Clock::now();
  reset_tensor_bytes_peak_thread();
  const int64_t resident = tensor_bytes_live_thread();
  // A failed save: the tmp folder goes (rank 0, once every rank is past writing into it).
  auto failed_save = [&](const std::string& what) {
    if (lead_) {
      std::error_code ec;
      std::filesystem::remove_all(folder + ".tmp", ec);
    }
    std::string msg = what;
    if (saved_step_)
      msg += "; the latest checkpoint stays " + step_folder_name(*saved_step_) + " in " + dir;
    else
      msg += "; no checkpoint of this run had been saved yet";
    return CheckpointWriteError(msg);
  };
  std::string error;
  std::array<int64_t, 1> ready{1};
  if (lead_) try {
      begin_save(dir, step);
    } catch (const CheckpointWriteError& e) {
      ready[0] = 0, error = e.what();
    }
  world.broadcast(ready, {.root = 0});
  if (!ready[0]) throw failed_save(shared_message(world, 0, error));

  const auto t1 = Clock::now();
  const RankPieces pieces = my_pieces();
  int64_t elements = 0;
  for (const SavePiece& p : pieces.model) elements += p.spec.numel();
  RankFiles files;
  int64_t ok = 1;
  try {
    files = write_rank_pieces(folder + ".tmp", world.rank(), pieces);
  } catch (const CheckpointWriteError& e) {
    ok = 0, error = e.what();
  }
  const double write_s = std::chrono::duration<double>(Clock::now() - t1).count();
  constexpr size_t kFields = 9;
  const std::array<int64_t, kFields> mine{ok, files.model.size, files.model.crc32, files.optimizer.size,
                                          files.optimizer.crc32, elements, resident, tensor_bytes_peak_thread(),
                                          static_cast<int64_t>(write_s * 1e9)};
  std::vector<int64_t> all(kFields * world.size());
  world.all_gather(mine, all);
  std::vector<int> failed;
  std::vector<RankFiles> digests;
  std::vector<RankSave> ranks;
  for (int r = 0; r < world.size(); ++r) {
    const int64_t* f = &all[kFields * r];
    if (!f[0]) failed.push_back(r);
    digests.push_back({{f[1], static_cast<uint32_t>(f[2])}, {f[3], static_cast<uint32_t>(f[4])}});
    ranks.push_back({static_cast<double>(f[8]) * 1e-9, f[1] + f[3], f[5], f[6], f[7]});
  }
  if (!failed.empty()) {
    // Every rank throws the first failing rank's error (its file and cause), so the run reports
    // it whichever rank's exception arrives first.
    std::string what = shared_message(world, failed[0], error);
    if (world.size() > 1) {
      what += " (rank(s) ";
      for (size_t i = 0; i < failed.size(); ++i) what += (i ? ", " : "") + std::to_string(failed[i]);
      what += " could not write their files)";
    }
    throw failed_save(what);
  }
  // Rank 0 commits; no rank leaves the save before it has (a rank that failed in its next step
  // would otherwise end the run while `latest` still named the checkpoint before: seen under
  // load, where rank 0 was still in the all-gather when the fabric was aborted).
  std::array<int64_t, 1> committed{1};
  if (lead_) {
    nlohmann::json state = {{"updates", optimizer_->updates()}, {"data_position", step}};
    if (metrics_line) state["metrics"] = *metrics_line;
    try {
      commit_save(dir, step, run_config(sh_.spec, o_), state, digests, o_.keep_checkpoints);
    } catch (const CheckpointWriteError& e) {
      // When only `latest` (or pruning) failed, the installed folder is complete and --resume takes it.
      std::error_code ec;
      committed[0] = 0;
      if (std::filesystem::exists(folder + "/index.json", ec) && !std::filesystem::exists(folder + ".tmp", ec))
        error = std::string(e.what()) + "; " + step_folder_name(step) + " is complete in " + dir +
                " and --resume continues from it";
      else
        error = failed_save(e.what()).what();
    }
  }
  world.broadcast(committed, {.root = 0});
  if (!committed[0]) throw CheckpointWriteError(shared_message(world, 0, error));
  if (lead_) report_save(step, std::chrono::duration<double>(Clock::now() - t0).count(), std::move(ranks));
  saved_step_ = step;
}

// Rank 0: the save's figures into the result and the step's metrics line, and one line printed.
void RankTrainer::report_save(int64_t step, double seconds, std::vector<RankSave> ranks) {
  TrainResult& res = sh_.res;
  res.last_save_s = seconds;
  res.saves = std::move(ranks);
  int64_t total = 0, most = 0, rise = 0;
  double slowest = 0;
  for (const RankSave& r : res.saves) {
    total += r.bytes_written, most = std::max(most, r.bytes_written), slowest = std::max(slowest, r.seconds);
    rise = std::max(rise, r.peak_bytes - r.resident_bytes);
  }
  pending_save_ = step;
  if (o_.quiet) return;
  const double mib = 1024.0 * 1024.0;
  std::printf("checkpoint %s saved in %.2f s: %d rank(s) wrote %.1f MiB in parallel (at most %.1f MiB and %.2f s a "
              "rank), tensor memory at most %+.1f MiB over what a rank held\n",
              step_folder_name(step).c_str(), seconds, static_cast<int>(res.saves.size()), static_cast<double>(total) / mib,
              static_cast<double>(most) / mib, slowest, static_cast<double>(rise) / mib);
  std::fflush(stdout);
}

// ---- restoring: each rank what it holds, from the pieces that overlap it ----

// Sets this rank's part of the model and optimizer from the checkpoint train() chose and
// checked (configuration and tensor set) before the ranks started. Values and moments are
// read straight into the tensors the rank holds: under ZeRO-3 its value segments, otherwise
// its stages' tp-local values; the moments of its optimizer parameters (segments under ZeRO).
int64_t RankTrainer::restore() {
  const CheckpointIndex& ck = *sh_.resume;
  PieceReader rd(ck);
  const std::vector<nn::Param*> opt = ddp_ ? ddp_->optimizer_params() : stage_params();
  auto read = [&](const std::string& name, const nn::Param* q, Tensor t) {  // t: q's range of origin(q)
    const nn::Param* p = ddp_ ? ddp_->origin(q) : q;
    const int64_t begin = ddp_ ? ddp_->segment_offset(q) : 0;
    rd.read(name, p->global_shape, p->shard, begin, begin + t.numel(), t.data());
  };
  if (ddp_ && o_.zero == 3) {
    for (nn::Param* q : opt) read(ddp_->origin(q)->name, q, q->value);
  } else {
    for (nn::Param* p : stage_params()) rd.read(p->name, p->global_shape, p->shard, 0, p->value.numel(), p->value.data());
  }
  for (size_t k = 0; k < opt.size(); ++k) {
    const std::string& name = (ddp_ ? ddp_->origin(opt[k]) : opt[k])->name;
    for (Optimizer::StateSlot& slot : optimizer_->state()) read(slot.prefix + "." + name, opt[k], slot.tensors[k]);
  }
  for (auto& stage : stages_)
    for (nn::Param* b : stage->buffers()) rd.read(b->name, b->global_shape, b->shard, 0, b->value.numel(), b->value.data());
  optimizer_->set_updates(ck.state.value("updates", ck.step));
  saved_step_ = ck.step;
  restore_bytes_read_ = rd.bytes_read();
  return ck.step;
}

// --resume: restore(), then every rank's bytes read, time and tensor memory gathered into the
// result and the resume line (each rank reads only its pieces). Returns the resumed step.
int64_t RankTrainer::resume() {
  TrainResult& res = sh_.res;
  const auto t0 = Clock::now();
  reset_tensor_bytes_peak_thread();
  const int64_t live = tensor_bytes_live_thread();
  const int64_t start = restore();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  const int world = mesh_.world().size();
  std::vector<int64_t> read(3 * static_cast<size_t>(world));
  mesh_.world().all_gather(
      std::array<int64_t, 3>{restore_bytes_read_, static_cast<int64_t>(ns), tensor_bytes_peak_thread() - live}, read);
  int64_t most = 0, slowest = 0;
  for (int r = 0; r < world; ++r) {
    if (lead_) res.restore_bytes_read.push_back(read[3 * r]), res.restore_tensor_bytes.push_back(read[3 * r + 2]);
    most = std::max(most, read[3 * r]), slowest = std::max(slowest, read[3 * r + 1]);
  }
  if (lead_ && !o_.quiet)
    std::printf("resumed from %s at step %lld (each rank read only its pieces: at most %.1f MiB, in %.2f s)\n",
                (o_.checkpoint_dir + "/" + step_folder_name(start)).c_str(), static_cast<long long>(start),
                static_cast<double>(most) / (1024.0 * 1024.0), static_cast<double>(slowest) * 1e-9);
  return start;
}

// The optimizer a checkpoint was saved by and the state it keeps (checkpoints from before
// --optimizer existed: AdamW's).
struct SavedOptimizer {
  std::string name = "adamw";
  std::vector<std::string> state = {"exp_avg", "exp_avg_sq"};
};

static SavedOptimizer saved_optimizer(const CheckpointIndex& ck, const std::string& folder) {
  SavedOptimizer s;
  const auto it = ck.config.find("optimizer");
  if (it == ck.config.end()) return s;
  try {
    s.name = it->at("name").get<std::string>();
    s.state = it->at("state").get<std::vector<std::string>>();
    parse_optimizer(s.name);
  } catch (const std::exception&) {
    throw CheckpointError("checkpoint " + folder + ": its index's config names no optimizer meshtrain knows (" +
                          it->dump() + "); the checkpoint does not match its index");
  }
  return s;
}

// A resume continues the optimizer's state as it was, so it must be the same optimizer keeping
// the same state: another optimizer's state does not carry over (refused, rather than restarted
// silently from zero moments).
static void check_same_optimizer(const SavedOptimizer& saved, const OptimizerConfig& now, const std::string& folder) {
  const std::string name = to_string(now.kind);
  if (saved.name != name)
    throw bad("cannot resume from " + folder + ": it was trained with --optimizer " + saved.name +
              " and this run has --optimizer " + name + "; one optimizer's state does not carry over to another, so "
              "resume with --optimizer " + saved.name + ", or start the new run in another --checkpoint-dir");
  if (saved.state != state_prefixes(now)) {
    auto list = [](const std::vector<std::string>& v) {
      std::string out;
      for (const std::string& p : v) out += (out.empty() ? "" : ", ") + p;
      return out.empty() ? std::string("none") : out;
    };
    throw bad("cannot resume from " + folder + ": its " + name + " state is [" + list(saved.state) +
              "] and this run's is [" + list(state_prefixes(now)) + "]" +
              (now.kind == OptimizerKind::sgd ? " (--momentum 0 keeps no momentum buffer)" : "") +
              "; resume with the settings it was saved with, or start the new run in another --checkpoint-dir");
  }
}

// --resume: chooses and loads the checkpoint (checkpoint/checkpoint.h: the newest valid step folder),
// checks it belongs to this run, and trims the metrics file to its step. Without --resume, a
// run that will save refuses a directory holding step folders. `lead` prints the notes.
std::optional<CheckpointIndex> prepare_checkpoints(const TrainOptions& o, const model::ModelSpec& spec, bool lead) {
  const std::string& dir = o.checkpoint_dir;
  if (!o.resume) {
    if (dir.empty()) return std::nullopt;
    const auto folders = step_folders(dir);
    const std::filesystem::path latest = std::filesystem::path(dir) / "latest";
    std::error_code ec;
    if (folders.empty() && std::filesystem::exists(std::filesystem::symlink_status(latest, ec)) && !o.overwrite)
      throw CheckpointError("--checkpoint-dir " + dir + " holds a file `latest` but no step folder: it is not a "
                            "checkpoint of a run (a save would replace it); move it away, choose another "
                            "directory, or add --overwrite to let the first save replace it");
    if (!folders.empty())
      throw CheckpointError("--checkpoint-dir " + dir + " already holds checkpoints (" +
                            std::to_string(folders.size()) + " step folder(s), the newest " +
                            std::filesystem::path(folders.back().second).filename().string() +
                            ") and a new run never overwrites them; use --resume to continue that run, or "
                            "another directory");
    // Made now, so a directory that cannot be made is found before step 1 (not at the first save).
    if (lead) {
      std::filesystem::create_directories(dir, ec);
      if (ec)
        throw CheckpointError("cannot create --checkpoint-dir " + dir + ": " + ec.message() +
                              "; choose another path");
    }
    return std::nullopt;
  }
  ResumePoint rp = find_resume_point(dir);
  if (lead)
    for (const std::string& n : rp.notes) note(n);
  std::optional<CheckpointIndex> ck;
  if (rp.folder) {
    ck = open_checkpoint(*rp.folder);
    const nlohmann::json want = run_config(spec, o);
    for (const char* key : {"model", "batch", "seq", "seed", "data_order"})
      if (ck->config.value(key, nlohmann::json()) != want[key])
        throw bad("cannot resume from " + *rp.folder + ": it was saved with " + key + " = " +
                  ck->config.value(key, nlohmann::json()).dump() + ", this run has " + want[key].dump() +
                  "; use the same value or another --checkpoint-dir");
    const nlohmann::json saved_data = ck->config.value("data", nlohmann::json::object());
    if (lead && saved_data.contains("bytes") && saved_data != want["data"]) {
      const nlohmann::json& now = want["data"];
      note("--data " + o.data + " is not the file " + *rp.folder + " was trained on (" +
           saved_data.value("path", std::string("?")) + ", " + std::to_string(saved_data.value("bytes", int64_t{0})) +
           " bytes; this one has " + std::to_string(now.value("bytes", int64_t{0})) + " bytes" +
           (saved_data.value("bytes", int64_t{-1}) == now.value("bytes", int64_t{-2}) ? " and other contents" : "") +
           "): training continues on it, so the loss curve will not be the uninterrupted run's");
    }
    const auto shapes = spec.param_shapes();
    auto model_shapes = shapes;  // and the buffers (batch norm's running statistics), saved with the model
    for (const auto& b : spec.buffer_shapes()) model_shapes.push_back(b);
    const SavedOptimizer saved = saved_optimizer(*ck, *rp.folder);
    std::vector<std::pair<std::string, Shape>> state;
    for (const std::string& prefix : saved.state)
      for (const auto& [name, shape] : shapes) state.emplace_back(prefix + "." + name, shape);
    check_tensor_set("checkpoint " + *rp.folder + " (model)", model_shapes, ck->shapes(ck->model));
    check_tensor_set("checkpoint " + *rp.folder + " (optimizer state)", state, ck->shapes(ck->optimizer));
    check_same_optimizer(saved, o.optim, *rp.folder);
  }
  if (lead && !o.metrics.empty()) {
    const int64_t step = ck ? ck->step : 0;
    // The line a step folder's checkpoint recorded (RankTrainer::save), for a step the file lacks.
    std::map<int64_t, std::string> folders;
    if (ck)
      for (const auto& [s, path] : step_folders(dir)) folders[s] = path;
    const MetricsLineSource source = [&](int64_t s) -> std::optional<std::string> {
      const auto it = folders.find(s);
      if (it == folders.end()) return std::nullopt;
      try {
        const nlohmann::json state = read_checkpoint_state(it->second);
        const auto m = state.find("metrics");
        if (m != state.end() && m->is_object() && m->value("step", int64_t{-1}) == s) return m->dump();
      } catch (const CheckpointError&) {  // a damaged index: the line stays missing
      }
      return std::nullopt;
    };
    MetricsTrim t;
    try {
      t = trim_metrics_for_resume(o.metrics, step, source);
    } catch (const io::WriteError& e) {
      throw io::WriteError(std::string(e.what()) + " (rewriting it with one line per step up to step " +
                           std::to_string(step) + " before continuing; nothing was trained, the file is as it was)");
    }
    std::vector<std::string> said;
    const int64_t later = t.dropped - t.duplicates;  // of later steps, or cut short
    if (step == 0 && t.dropped > 0) {
      said.push_back("this run starts from step 0, so its " + std::to_string(t.dropped) + " line(s) were removed");
    } else {
      if (later > 0)
        said.push_back("kept its lines of steps 1-" + std::to_string(step) + " and removed " + std::to_string(later) +
                       " line(s) of later steps (this run writes them again) or cut short");
      if (t.duplicates > 0)
        said.push_back("collapsed " + std::to_string(t.duplicates) +
                       " duplicate line(s) of steps it keeps to the last one written");
    }
    if (!t.rebuilt.empty())
      said.push_back("rebuilt the line(s) of step(s) " + format_steps(t.rebuilt) +
                     ", which it lacked, from the line their checkpoints recorded (without the save's \"checkpoint\" "
                     "timings)");
    if (!t.missing.empty())
      said.push_back(std::string(t.existed ? "it" : "it did not exist and") + " lacks the line(s) of step(s) " +
                     format_steps(t.missing) +
                     ", which could not be rebuilt: no checkpoint of theirs records one (the run that trained them "
                     "had no --metrics or an older meshtrain, or their step folders were removed)");
    if (!t.backup.empty()) said.push_back("the file as it was is kept as " + t.backup);
    if (!said.empty()) {
      std::string text = "metrics file " + o.metrics + ": ";
      for (size_t i = 0; i < said.size(); ++i) text += (i ? "; " : "") + said[i];
      note(text);
    }
  }
  return ck;
}

}  // namespace meshtrain::train::detail
