// Checkpoints of the rank loop: full logical tensors gathered over dp, tp and the pipeline
// stages and written by rank 0; restoring this rank's part; choosing what --resume continues.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <span>

#include "meshtrain/parallel/tensor_parallel.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/rank_trainer.h"

namespace meshtrain::train::detail {

// ---- checkpoints: full logical tensors, gathered over dp, written by rank 0 ----

nlohmann::json run_config(const model::GPTConfig& cfg, const TrainOptions& o) {
  return {{"model", cfg.to_json()}, {"batch", o.batch},  {"seq", o.seq},
          {"seed", o.seed},         {"data_order", to_string(o.data_order)},
          {"steps", o.steps},       {"layout", {{"dp", o.dp}, {"tp", o.tp}, {"pp", o.pp}, {"zero", o.zero}}}};
}

void RankTrainer::save(int64_t step) {
  std::vector<nn::Param*> params = model_params();
  std::vector<Tensor> values;
  auto copy_values = [&] {
    for (nn::Param* p : params) values.push_back(p->value.clone());
  };
  if (ddp_) ddp_->with_full_params(copy_values);
  else copy_values();
  std::vector<Tensor> m = adam_->exp_avg(), v = adam_->exp_avg_sq();
  if (ddp_) m = ddp_->gather_segments(m), v = ddp_->gather_segments(v);
  if (o_.tp > 1) {
    // Tensor-parallel shards into full logical tensors (collective over tp).
    for (size_t i = 0; i < params.size(); ++i) {
      values[i] = parallel::full_tensor(*params[i], values[i], mesh_.tp_group());
      m[i] = parallel::full_tensor(*params[i], m[i], mesh_.tp_group());
      v[i] = parallel::full_tensor(*params[i], v[i], mesh_.tp_group());
    }
  }
  if (o_.pp > 1) gather_stages(params, values, m, v);
  if (!lead_) {
    saved_step_ = step;
    return;
  }
  CheckpointRefs refs;
  refs.step = step;
  refs.config = run_config(sh_.cfg, o_);
  refs.state = {{"updates", adam_->updates()}, {"data_position", step}};
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& name = i < params.size() ? params[i]->name : gathered_names_[i - params.size()];
    refs.model.emplace_back(name, &values[i]);
    refs.optimizer.emplace_back("exp_avg." + name, &m[i]);
    refs.optimizer.emplace_back("exp_avg_sq." + name, &v[i]);
  }
  save_checkpoint(o_.checkpoint_dir, refs, o_.keep_checkpoints);
  saved_step_ = step;
}

// Pipeline: the full tensors of the other stages travel to rank 0 (pp rank 0 of the dp 0 / tp 0
// position; the other positions hold copies). Each pp rank sends value, exp_avg and exp_avg_sq
// of its parameters in params() order, leaving out the last stage's copy of the tied wte; rank
// 0 knows every rank's names and shapes from the partition and appends them after its own.
void RankTrainer::gather_stages(const std::vector<nn::Param*>& params, std::vector<Tensor>& values,
                                std::vector<Tensor>& m, std::vector<Tensor>& v) {
  if (mesh_.coord().dp != 0 || mesh_.coord().tp != 0) return;
  comm::Communicator& pp = mesh_.pp_group();
  const int tag = 1 << 22;  // below the pipeline executor's range
  auto span = [](Tensor& t) { return std::span<float>(t.data(), static_cast<size_t>(t.numel())); };
  const pipeline::ScheduleShape shape{o_.pp, o_.microbatches, o_.chunks};
  const auto& spans = spans_;
  if (pp.rank() != 0) {
    // In the order rank 0 expects: per chunk, stage_param_shapes' order (params() may list
    // them otherwise: under ZeRO the data-parallel units put a stage's ends first).
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < params.size(); ++i) index[params[i]->name] = i;
    for (int c = 0; c < shape.chunks; ++c) {
      const int st = shape.stage_of(pp.rank(), c);
      const bool last = st == shape.stages() - 1;
      model::StageSpec spec{spans[st].first, spans[st].end, st == 0, last};
      for (auto& [name, shape_of] : model::stage_param_shapes(sh_.cfg, spec)) {
        if (last && name == "wte.weight") continue;
        const size_t i = index.at(name);
        for (Tensor* t : {&values[i], &m[i], &v[i]}) pp.send(span(*t), 0, {.tag = tag});
      }
    }
    return;
  }
  gathered_names_.clear();
  for (int r = 1; r < o_.pp; ++r)
    for (int c = 0; c < shape.chunks; ++c) {
      const int st = shape.stage_of(r, c);
      const bool last = st == shape.stages() - 1;
      model::StageSpec spec{spans[st].first, spans[st].end, st == 0, last};
      for (auto& [name, shape_of] : model::stage_param_shapes(sh_.cfg, spec)) {
        if (last && name == "wte.weight") continue;
        for (std::vector<Tensor>* list : {&values, &m, &v}) {
          list->push_back(Tensor::empty(shape_of));
          pp.recv(span(list->back()), r, {.tag = tag});
        }
        gathered_names_.push_back(name);
      }
    }
}

// Sets this rank's part of the model and optimizer from the checkpoint train() chose and
// checked (configuration and tensor set) before the ranks started.
int64_t RankTrainer::restore() {
  const std::string& dir = o_.checkpoint_dir;
  const CheckpointData& ck = *sh_.resume;
  std::map<std::string, const Tensor*> model, opt;
  for (auto& [n, t] : ck.model) model[n] = &t;
  for (auto& [n, t] : ck.optimizer) opt[n] = &t;
  auto find = [&](std::map<std::string, const Tensor*>& in, const std::string& name, const Shape& shape) {
    auto it = in.find(name);
    if (it == in.end()) throw bad("checkpoint in " + dir + " lacks tensor " + name);
    if (it->second->shape() != shape)
      throw bad("checkpoint tensor " + name + " has shape " + shape_str(it->second->shape()) +
                ", the model expects " + shape_str(shape));
    return *it->second;
  };
  std::vector<nn::Param*> params = model_params();
  std::vector<Tensor> values, m, v;
  for (nn::Param* p : params) {
    values.push_back(find(model, p->name, p->global_shape));
    m.push_back(find(opt, "exp_avg." + p->name, p->global_shape));
    v.push_back(find(opt, "exp_avg_sq." + p->name, p->global_shape));
    if (o_.tp > 1) {
      values.back() = parallel::local_shard(*p, values.back());
      m.back() = parallel::local_shard(*p, m.back());
      v.back() = parallel::local_shard(*p, v.back());
    }
  }
  if (ddp_) {
    ddp_->load_full_params(values);
    m = ddp_->slice_segments(m), v = ddp_->slice_segments(v);
  } else {
    for (size_t i = 0; i < params.size(); ++i) params[i]->value.copy_from(values[i]);
  }
  adam_->load_moments(m, v);
  adam_->set_updates(ck.state.value("updates", ck.step));
  saved_step_ = ck.step;
  return ck.step;
}

// --resume: chooses and loads the checkpoint (train/checkpoint.h: the newest valid step folder),
// checks it belongs to this run, and trims the metrics file to its step. Without --resume, a
// run that will save refuses a directory holding step folders. `lead` prints the notes.
std::optional<CheckpointData> prepare_checkpoints(const TrainOptions& o, const model::GPTConfig& cfg, bool lead) {
  const std::string& dir = o.checkpoint_dir;
  if (!o.resume) {
    if (o.checkpoint_every == 0 && !o.save_initial) return std::nullopt;
    const auto folders = step_folders(dir);
    if (!folders.empty())
      throw CheckpointError("--checkpoint-dir " + dir + " already holds checkpoints (" +
                            std::to_string(folders.size()) + " step folder(s), the newest " +
                            std::filesystem::path(folders.back().second).filename().string() +
                            ") and a new run never overwrites them; use --resume to continue that run, or "
                            "another directory");
    return std::nullopt;
  }
  ResumePoint rp = find_resume_point(dir);
  if (lead)
    for (const std::string& n : rp.notes) note(n);
  std::optional<CheckpointData> ck;
  if (rp.folder) {
    ck = load_checkpoint(*rp.folder);
    const nlohmann::json want = run_config(cfg, o);
    for (const char* key : {"model", "batch", "seq", "seed", "data_order"})
      if (ck->config.value(key, nlohmann::json()) != want[key])
        throw bad("cannot resume from " + *rp.folder + ": it was saved with " + key + " = " +
                  ck->config.value(key, nlohmann::json()).dump() + ", this run has " + want[key].dump() +
                  "; use the same value or another --checkpoint-dir");
    const auto shapes = model::gpt_param_shapes(cfg);
    std::vector<std::pair<std::string, Shape>> moments;
    for (const auto& [name, shape] : shapes) moments.emplace_back("exp_avg." + name, shape);
    for (const auto& [name, shape] : shapes) moments.emplace_back("exp_avg_sq." + name, shape);
    check_tensor_set("checkpoint " + *rp.folder + " (model.safetensors)", shapes, ck->model);
    check_tensor_set("checkpoint " + *rp.folder + " (optimizer.safetensors)", moments, ck->optimizer);
  }
  if (lead && !o.metrics.empty()) {
    const int64_t step = ck ? ck->step : 0;
    const MetricsTrim t = trim_metrics_for_resume(o.metrics, step);
    if (t.dropped > 0)
      note("metrics file " + o.metrics + ": " +
           (step == 0 ? std::string("this run starts from step 0, so its ") + std::to_string(t.dropped) +
                            " line(s) were removed"
                      : "kept its lines of steps 1-" + std::to_string(step) + " and removed " +
                            std::to_string(t.dropped) + " line(s) of later steps (this run writes them again) or cut short") +
           "; the file as it was is kept as " + t.backup);
  }
  return ck;
}

}  // namespace meshtrain::train::detail
