// The validation pass of train/validate.h: option ranges, cross-option rules, threads and
// memory against the machine, output paths.
#include "meshtrain/train/validate.h"
#include "meshtrain/train/layout.h"
#include "meshtrain/train/outputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "meshtrain/comm/world.h"
#include "meshtrain/parallel/mesh.h"
#include "meshtrain/plan/cost.h"

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// 0 when a file can be created in `dir`, else the errno that refuses it. access() says yes to
// root everywhere but on read-only mounts, so this tries: an unnamed file (O_TMPFILE), which
// vanishes on close and leaves nothing behind; where the file system has no O_TMPFILE, a named
// probe created and removed at once.
int cannot_create_in(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return 0;
  }
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return errno;
  const fs::path probe = dir / (".meshtrain-probe-" + std::to_string(::getpid()));
  fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno == EEXIST ? 0 : errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return 0;
}

// ---- the machine ----

// A byte count from a /proc or /sys file ("max" or a missing file: none).
int64_t read_limit(const char* path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text == "max") return 0;
  try {
    size_t used = 0;
    unsigned long long v = std::stoull(text, &used);
    // cgroup v1 writes a huge page-aligned number for "no limit".
    if (used != text.size() || v >= (1ull << 60)) return 0;
    return static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return 0;
  }
}

int64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  long long kib = 0;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return static_cast<int64_t>(kib) * 1024;
  }
  return 0;
}

// ---- option ranges ----

void at_least(const char* flag, int64_t v, int64_t lo, const std::string& meaning = "") {
  if (v < lo)
    bad(std::string(flag) + " must be at least " + std::to_string(lo) + meaning + ", got " + std::to_string(v));
}

void finite(const char* flag, double v, const std::string& rule) {
  if (!std::isfinite(v)) bad(std::string(flag) + " must be a finite number " + rule + ", got " + num(v));
}

// The optimizer's flags and its schedule's. Flags that mean nothing for the chosen optimizer
// are refused by the CLI, which knows which were given; here every value is checked that the
// chosen optimizer and schedule read.
void check_optimizer(const OptimizerConfig& a) {
  finite("--lr", a.lr, "above 0");
  if (!(a.lr > 0)) bad("--lr must be a finite number above 0, got " + num(a.lr));
  finite("--min-lr", a.min_lr, "of at least 0");
  if (a.min_lr < 0) bad("--min-lr must be at least 0, got " + num(a.min_lr));
  if (a.schedule == LrSchedule::cosine && a.min_lr > a.lr)
    bad("--min-lr " + num(a.min_lr) + " is above --lr " + num(a.lr) +
        "; the cosine decay goes down from --lr to --min-lr, so give a --min-lr of at most --lr");
  at_least("--warmup", a.warmup_steps, 0, " (steps of linear warm-up)");
  if (a.schedule == LrSchedule::step) {
    if (a.step_every < 1)
      bad("--lr-schedule step needs --lr-step-every K, a number of steps of at least 1 (the learning rate is "
          "multiplied by --lr-step-gamma every K steps)" +
          (a.step_every == 0 ? std::string() : ", got " + std::to_string(a.step_every)));
    finite("--lr-step-gamma", a.step_gamma, "above 0 and at most 1");
    if (!(a.step_gamma > 0 && a.step_gamma <= 1))
      bad("--lr-step-gamma must be above 0 and at most 1 (the factor of each decay, e.g. 0.1), got " +
          num(a.step_gamma));
  }
  if (a.weight_decay) {
    finite("--weight-decay", *a.weight_decay, "of at least 0");
    if (*a.weight_decay < 0) bad("--weight-decay must be at least 0 (0: no decay), got " + num(*a.weight_decay));
  }
  finite("--grad-clip", a.grad_clip, "of at least 0");
  if (a.grad_clip < 0) bad("--grad-clip must be at least 0 (0: no clipping), got " + num(a.grad_clip));
  const std::string name = a.kind == OptimizerKind::lamb ? "LAMB" : "AdamW";
  if (a.kind == OptimizerKind::sgd) {
    if (!(a.momentum >= 0 && a.momentum < 1))
      bad("--momentum must be at least 0 and below 1 (SGD's momentum, e.g. 0.9; 0: none), got " + num(a.momentum));
    if (a.nesterov && a.momentum == 0)
      bad("--nesterov needs a momentum above 0 (Nesterov's look-ahead is along the momentum); drop --nesterov or "
          "give --momentum");
    return;
  }
  if (!(a.beta2 >= 0 && a.beta2 < 1))
    bad("--beta2 must be at least 0 and below 1 (" + name + "'s second-moment decay, e.g. 0.99), got " + num(a.beta2));
  if (!(a.beta1 >= 0 && a.beta1 < 1)) bad(name + " beta1 must be at least 0 and below 1, got " + num(a.beta1));
  if (!(a.eps > 0) || !std::isfinite(a.eps)) bad(name + " eps must be a finite number above 0, got " + num(a.eps));
}

void check_ranges(const TrainOptions& o, const model::GPTConfig& cfg) {
  if (o.data.empty()) bad("--data is required: a text file or a uint16 token file (.bin)");
  at_least("--steps", o.steps, 1);
  at_least("--batch", o.batch, 1);
  if (o.seq < 1 || o.seq > cfg.block_size)
    bad("--seq must be between 1 and the model's " + std::to_string(cfg.block_size) +
        " positions (block_size), got " + std::to_string(o.seq));
  check_optimizer(o.optim);
  if (!(o.val_fraction > 0 && o.val_fraction < 1))
    bad("--val-fraction must be above 0 and below 1 (the validation loss needs held-out tokens), got " +
        num(o.val_fraction));
  at_least("--eval-every", o.eval_every, 0, " (0: only at the end)");
  at_least("--eval-batches", o.eval_batches, 1);
  at_least("--checkpoint-every", o.checkpoint_every, 0, " (0: only at the end of the run)");
  at_least("--keep-checkpoints", o.keep_checkpoints, 0, " (0: keep all)");
  at_least("--log-every", o.log_every, 0, " (0: no progress lines)");
  at_least("--threads", o.threads, 0, " (0: cores / ranks)");
}

// The layout flags and the rules between them.
void check_layout(const TrainOptions& o) {
  if (o.dp < 1 || o.tp < 1 || o.pp < 1) bad("--dp, --tp and --pp must each be at least 1");
  if (o.microbatches < 1) bad("--microbatches must be at least 1");
  static const char* schedules[] = {"naive", "gpipe", "1f1b", "interleaved", "zb", "zb-h1", "pipedream-2bw", "pipedream", "chimera"};
  if (std::find_if(std::begin(schedules), std::end(schedules),
                   [&](const char* s) { return o.schedule == s; }) == std::end(schedules))
    bad("--schedule must be naive, gpipe, 1f1b, interleaved, zb, pipedream-2bw, pipedream or chimera, not '" + o.schedule +
        "'");
  if (o.schedule == "pipedream-2bw") {  // train/weight_versions.h
    if (o.ps_servers > 0)
      bad("--schedule pipedream-2bw is a pipeline's own asynchrony; the parameter server has its own (--staleness): "
          "drop one of them");
    if (o.zero > 1)
      bad("--schedule pipedream-2bw keeps the previous step's whole gradient and weights beside the current ones, "
          "which --zero " + std::to_string(o.zero) + " would shard away; use --zero 0 or 1");
    if (o.recompute)
      bad("--schedule pipedream-2bw runs a step's last backwards during the next step, whose batch has replaced the "
          "inputs --recompute would run the forward on again; drop --recompute");
  }
  if (o.schedule == "pipedream") {  // train/weight_stash.h
    if (o.ps_servers > 0)
      bad("--schedule pipedream is a pipeline's own asynchrony; the parameter server has its own (--staleness): "
          "drop one of them");
    if (o.zero > 0)
      bad("--schedule pipedream updates every stage after each micro-batch, and --zero " + std::to_string(o.zero) +
          " would gather the weights after each of those updates; use --zero 0 (or --schedule pipedream-2bw, "
          "which runs with --zero 1)");
    if (o.recompute)
      bad("--schedule pipedream runs a step's last backwards during the next step, whose batch has replaced the "
          "inputs --recompute would run the forward on again; drop --recompute");
    if (o.pp > 1 && o.chunks > 1)
      bad("--schedule pipedream runs one model chunk per pipeline rank; drop --chunks");
    if (o.pp == 1 && o.chunks > 1 && (o.dp > 1 || o.tp > 1))
      bad("--schedule pipedream at --pp 1 --chunks " + std::to_string(o.chunks) + " is the single-rank reference of a "
          "pp " + std::to_string(o.chunks) + " pipeline; it runs on one rank: drop --dp and --tp");
    if (!o.checkpoint_dir.empty())
      bad("--schedule pipedream does not save checkpoints yet (a stage's stashed weight versions are not in one); "
          "drop --checkpoint-dir, or use --schedule pipedream-2bw");
  }
  if (o.schedule == "chimera" && o.pp > 1) {  // pipeline/generators.cpp, chimera_schedule
    if (o.pp % 2 != 0)
      bad("--schedule chimera pairs pipeline rank r with rank pp-1-r, each holding the other's stage of the opposite "
          "pipeline; use an even --pp (got " + std::to_string(o.pp) + ")");
    if (o.microbatches % 2 != 0)
      bad("--schedule chimera gives each of its two pipelines half the micro-batches; use an even --microbatches (got " +
          std::to_string(o.microbatches) + ")");
    if (o.dp > 1 || o.zero > 0 || o.ps_servers > 0)
      bad("--schedule chimera runs without data parallelism yet (each rank's two model copies would need their own "
          "buckets); drop --dp, --zero and --ps-servers");
    if (o.recompute) bad("--schedule chimera runs without --recompute yet; drop --recompute");
    if (o.chunks > 1) bad("--schedule chimera places two model chunks on each rank itself; drop --chunks");
    if (!o.checkpoint_dir.empty())
      bad("--schedule chimera does not save checkpoints yet (each rank holds two copies of model stages); drop "
          "--checkpoint-dir");
  }
  if (o.chunks < 1) bad("--chunks must be at least 1 (model chunks per pipeline rank)");
  if (o.zero < 0 || o.zero > 3) bad("--zero must be 0, 1, 2 or 3");
  if (o.ps_servers < 0) bad("--ps-servers must be 0 (no parameter server) or a positive number of server ranks");
  if (o.exact_sums < 0) bad("--exact-sums must be 0 (off) or a positive number of slices per micro-batch");
  if (o.staleness < -1)
    bad("--staleness must be 0 (synchronous), a positive bound, or inf (unbounded, asynchronous; also -1)");
  if (!(o.slow_worker_factor >= 1) || !std::isfinite(o.slow_worker_factor))
    bad("--slow-worker must be a finite factor of at least 1 (the factor worker 0's step is slowed by)");
  if (o.slow_worker_factor != 1 && o.ps_servers == 0)
    bad("--slow-worker slows a parameter-server worker; add --ps-servers N or drop --slow-worker");
  if (o.ps_servers > 0 && o.zero > 0)
    bad("ZeRO and the parameter server are two ways to shard; choose one (drop --zero or --ps-servers)");
  if (o.comm_dtype == kernels::Precision::bf16 && ((o.dp < 2 && o.tp < 2) || o.ps_servers > 0))
    bad("--comm-dtype bf16 sends the data-parallel gradient buckets and the tensor-parallel activations as "
        "bf16; it needs --dp 2 or --tp 2 or more, and no --ps-servers (drop it, or add data- or "
        "tensor-parallel ranks)");
  if (o.ps_servers > 0 && (o.tp > 1 || o.pp > 1))
    bad(o.tp > 1 && o.intra != IntraSplit::tensor
            ? std::string("the parameter server runs whole-model workers; drop --") + intra_flag(o.intra) +
                  " (and use --pp 1) with --ps-servers"
            : std::string("the parameter server runs whole-model workers; use --tp 1 --pp 1 with --ps-servers"));
  if (o.ps_servers > 0 && (!o.checkpoint_dir.empty() || o.checkpoint_every > 0 || o.resume || o.save_initial))
    bad("the parameter server does not write or read checkpoints yet; drop --checkpoint-dir, --checkpoint-every, "
        "--resume and --save-initial, or run without --ps-servers");
  if (o.ps_servers > 0 && !o.trace.empty())
    bad("the parameter server does not record a trace yet; drop --trace, or run without --ps-servers");
  if (o.backend != "threads" && o.backend != "mpi") bad("--backend must be threads or mpi, not '" + o.backend + "'");
  if (o.backend == "mpi" && !comm::have_mpi())
    bad("this build has no mpi backend (OpenMPI was not found when it was configured); use --backend threads");
  if (o.backend == "mpi" && !comm::launched_by_mpirun())
    bad("--backend mpi needs the program to be started by mpirun (mpirun -np N meshtrain train ...)");
  // The drivers of these land with their issues; until then say so instead of pretending.
  if (o.sequence_parallel && o.tp == 1) bad("--sequence-parallel needs --tp 2 or more");
  if (o.pp > 1 && o.schedule == "interleaved" && o.chunks < 2)
    bad("--schedule interleaved runs several model chunks per pipeline rank; add --chunks 2 (or more)");
  if (o.chunks > 1 && (o.pp == 1 || o.schedule != "interleaved") && !(o.pp == 1 && o.schedule == "pipedream"))
    bad("--chunks " + std::to_string(o.chunks) + " needs --schedule interleaved and --pp 2 or more; drop --chunks");
  if (!o.pp_balance.empty() && o.pp == 1) bad("--pp-balance gives blocks per pipeline stage; it needs --pp 2 or more");
  if (o.batch % o.dp != 0)
    bad("--batch " + std::to_string(o.batch) + " is not divisible by --dp " + std::to_string(o.dp) +
        "; every data-parallel rank takes an equal slice of the batch");
  if ((o.batch / o.dp) % o.microbatches != 0)
    bad("each data-parallel rank's " + std::to_string(o.batch / o.dp) +
        " rows are not divisible by --microbatches " + std::to_string(o.microbatches));
  if (o.bucket_bytes < 0) bad("--bucket-mb must be a positive number of MiB");
  if ((o.checkpoint_every > 0 || o.resume || o.save_initial) && o.checkpoint_dir.empty())
    bad("--checkpoint-every, --resume and --save-initial need --checkpoint-dir DIR");
  if (!(o.checkpoint_every_s >= 0) || !std::isfinite(o.checkpoint_every_s))
    bad("--checkpoint-every-s must be a finite number of seconds above 0 (0: off), got " + num(o.checkpoint_every_s));
  if (o.checkpoint_every_s > 0 && o.checkpoint_dir.empty())
    bad("--checkpoint-every-s needs --checkpoint-dir DIR");
  if (o.checkpoint_every_s > 0 && o.ps_servers > 0)
    bad("the parameter server does not write checkpoints yet; drop --checkpoint-every-s");
  check_hosts(o);
}

// Ranks of the run that live in this process (threads backend: all of them).
int64_t local_ranks(const TrainOptions& o) {
  if (o.backend == "mpi") return 1;
  return static_cast<int64_t>(o.dp) * o.tp * o.pp + o.ps_servers;
}

void check_memory(const TrainOptions& o, const model::ModelSpec& spec, const Machine& m) {
  if (m.memory_bytes <= 0) return;
  MemoryEstimate e = estimate_memory(o, spec);
  if (e.total() <= static_cast<double>(m.memory_bytes)) return;
  bad("this run needs at least " + format_bytes(e.total()) + " of memory in this process (" +
      std::to_string(e.ranks) + " rank(s): parameters " + format_bytes(e.params) + ", gradients " +
      format_bytes(e.grads) + ", optimizer state " + format_bytes(e.optimizer) + ", activations " +
      format_bytes(e.activations) + (spec.input() == model::InputKind::images ? ", images " : ", tokens ") +
      format_bytes(e.data) +
      (e.eval > 0.01 * e.total() ? ", validation batches " + format_bytes(e.eval) : std::string()) +
      ") but the machine has " +
      format_bytes(static_cast<double>(m.memory_bytes)) + " available (" + m.memory_source +
      "); use a smaller model, --batch or --seq, more --microbatches, fewer --eval-batches, or --zero to shard "
      "the state");
}

}  // namespace

// ---- the machine ----

Machine Machine::probe() {
  Machine m;
  m.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  m.memory_bytes = mem_available();
  m.memory_source = "MemAvailable in /proc/meminfo";
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    int64_t limit = read_limit(path);
    if (limit > 0 && (m.memory_bytes == 0 || limit < m.memory_bytes)) {
      m.memory_bytes = limit;
      m.memory_source = std::string("the cgroup memory limit in ") + path;
    }
  }
  // A test setting: the memory a test says this machine has (the launcher's choice of a layout
  // that fits is tested with it).
  if (const char* test = std::getenv("MESHTRAIN_TEST_MEMORY_BYTES")) {
    try {
      m.memory_bytes = std::stoll(test);
      m.memory_source = "MESHTRAIN_TEST_MEMORY_BYTES, a test setting";
    } catch (const std::exception&) {
    }
  }
  return m;
}

// ---- memory ----

// The parameter server's workers and servers, which the planner's layouts do not cover: the
// analytic sum of what they hold (a GPT).
MemoryEstimate estimate_ps_memory(const TrainOptions& o, const model::GPTConfig& cfg) {
  const double n = static_cast<double>(cfg.num_params());
  const double per_token = cfg.activation_bytes(1, 1);  // GPTConfig's count of what backward keeps
  const double dp = std::max(1, o.dp);
  const double B = static_cast<double>(std::max<int64_t>(o.batch, 1)), T = static_cast<double>(std::max<int64_t>(o.seq, 1));
  const double state = 4.0 * static_cast<double>(state_prefixes(o.optim).size());  // bytes a parameter
  MemoryEstimate e;
  e.ranks = static_cast<int>(std::min<int64_t>(local_ranks(o), std::numeric_limits<int>::max()));
  // Workers hold the whole model's values and gradients; servers hold the values, gradients
  // and optimizer state of their shards (all of the model over all servers).
  const double workers = o.backend == "mpi" ? 1 : dp;
  e.params = 4 * n * workers + (o.backend == "mpi" ? 0 : 4 * n);
  e.grads = 4 * n * workers + (o.backend == "mpi" ? 0 : 4 * n);
  e.optimizer = o.backend == "mpi" ? 0 : state * n;
  e.activations = per_token * (B / dp) * T * workers;
  e.eval = 8.0 * static_cast<double>(std::max<int64_t>(o.eval_batches, 1)) * (B / dp) * T * workers;
  return e;
}

// More units than any real model has (GPT-3: 96 blocks; a 1T-parameter GPT: 128).
constexpr int64_t kMaxWalkedUnits = 100000;

// The parameter server's workers and servers for an image model (any layer graph): a worker is
// one data-parallel rank of the planner's memory model without its optimizer state (the whole
// model's values and gradients, the activations of its micro-batches of B / (W M) rows); the
// servers together hold the model's values, gradients and optimizer state once. Under mpi the
// process is one worker or one server: the larger of the two (server 0's shard, the largest).
MemoryEstimate estimate_ps_image_memory(const TrainOptions& o, const model::ModelSpec& spec) {
  plan::Layout l = plan_layout(o, {});
  l.tp = 1, l.pp = 1, l.zero = 0, l.chunks = 1, l.recompute = false;
  const plan::RankMemory w = plan::predict_memory(spec, l).front();
  const double n = spec.stage_param_elements({0, spec.num_units(), true, true}, 1);
  const double state = 4.0 * static_cast<double>(state_prefixes(o.optim).size());  // bytes a parameter
  MemoryEstimate e;
  e.ranks = static_cast<int>(std::min<int64_t>(local_ranks(o), std::numeric_limits<int>::max()));
  const double rows = static_cast<double>(std::max<int64_t>(o.batch, 1)) / std::max(1, o.dp);
  double per_row = 4.0;  // validation: worker 0 holds one slice of its rows at a time
  for (int64_t d : spec.sample_shape()) per_row *= static_cast<double>(d);
  if (o.backend == "mpi") {
    const double shard = std::ceil(n / std::max(1, o.ps_servers));
    const double worker = w.params + w.grads + w.activations + w.temp + w.buffers;
    if (worker >= (8 + state) * shard) {
      e.params = w.params, e.grads = w.grads, e.activations = w.activations + w.temp + w.buffers;
      e.eval = rows * per_row;
    } else {
      e.params = 4 * shard, e.grads = 4 * shard, e.optimizer = state * shard;
    }
    return e;
  }
  const double workers = std::max(1, o.dp);
  e.params = workers * w.params + 4 * n;
  e.grads = workers * w.grads + 4 * n;
  e.optimizer = state * n;
  e.activations = workers * (w.activations + w.temp + w.buffers);
  e.eval = rows * per_row;
  return e;
}

MemoryEstimate estimate_memory(const TrainOptions& o, const model::ModelSpec& spec) {
  MemoryEstimate e;
  if (o.ps_servers > 0 && spec.gpt()) {
    e = estimate_ps_memory(o, *spec.gpt());
  } else if (o.ps_servers > 0) {
    e = estimate_ps_image_memory(o, spec);
  } else {
    e.ranks = static_cast<int>(std::min<int64_t>(local_ranks(o), std::numeric_limits<int>::max()));
    // The planner's memory model (plan/cost.h), per pipeline rank; the process holds every
    // rank (threads: dp x tp of each pp position) or one (mpi: the largest). It walks every
    // layer; a model of more units than any real one (a hostile config of a million blocks)
    // is bounded from below instead by its first unit's layers times the units, on one rank.
    std::vector<plan::RankMemory> ranks;
    if (spec.num_units() > kMaxWalkedUnits) {
      const plan::Layout l = plan_layout(o, {});
      const model::CostQuery q{std::max<int64_t>(1, o.batch / std::max(1, o.dp) / std::max(1, o.microbatches)),
                               std::max<int64_t>(1, o.seq), std::max(1, o.tp), o.sequence_parallel};
      const double units = static_cast<double>(spec.num_units());
      const double elems = spec.stage_param_elements({0, 1, false, false}, l.tp) * units;
      plan::RankMemory m;
      m.params = 4 * elems / (l.zero >= 3 ? l.dp : 1);
      m.grads = 4 * elems;
      m.optimizer = 4.0 * l.optimizer_state * elems / (l.zero >= 1 ? l.dp : 1);
      m.activations = model::total_saved_bytes(spec.op_costs({0, 1, false, false}, q)) * units / std::max(1, o.pp);
      ranks.push_back(m);
    } else {
      ranks = plan::predict_memory(spec, plan_layout(o, {}));
    }
    const double replicas = o.backend == "mpi" ? 1.0 : static_cast<double>(o.dp) * o.tp;
    const plan::RankMemory* largest = &ranks.front();
    for (const plan::RankMemory& r : ranks)
      if (r.total() > largest->total()) largest = &r;
    for (const plan::RankMemory& r : ranks) {
      if (o.backend == "mpi" && &r != largest) continue;
      e.params += replicas * r.params, e.grads += replicas * r.grads, e.optimizer += replicas * r.optimizer;
      e.activations += replicas * (r.activations + r.temp + r.buffers);
    }
    // Validation holds the inputs and targets of all --eval-batches batches of its rows.
    const double rows = static_cast<double>(std::max<int64_t>(o.batch, 1)) / std::max(1, o.dp);
    Shape sample = spec.sample_shape();
    double per_row = spec.input() == model::InputKind::images ? 4.0 : 8.0 * static_cast<double>(std::max<int64_t>(o.seq, 1));
    for (int64_t d : sample) per_row *= static_cast<double>(d);
    e.eval = static_cast<double>(std::max<int64_t>(o.eval_batches, 1)) * rows * per_row *
             (o.backend == "mpi" ? 1.0 : static_cast<double>(o.dp) * o.tp * o.pp);
  }
  std::error_code ec;
  if (spec.input() == model::InputKind::images) {
    e.data = 55e6;  // Fashion-MNIST's 70,000 images of 28 x 28, held as bytes (data/images.h)
  } else if (!o.data.empty() && fs::is_regular_file(o.data, ec)) {
    // The token file, held once per process as uint16 (a text file: one token per byte).
    const double size = static_cast<double>(fs::file_size(o.data, ec));
    if (!ec) e.data = fs::path(o.data).extension() == ".bin" ? size : 2 * size;
  }
  return e;
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else if (bytes < 10000) std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  else std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
  return buf;
}

// ---- threads ----

void check_threads(const std::string& flag, int64_t threads, const Machine& m, bool zero_means_auto) {
  const int64_t cap = static_cast<int64_t>(kThreadsPerCore) * m.cores;
  if (threads < 0 || (threads == 0 && !zero_means_auto))
    bad(flag + " must be " + (zero_means_auto ? "0 (automatic) or " : "") + "a number of kernel threads from 1 to " +
        std::to_string(cap) + ", got " + std::to_string(threads));
  if (threads > cap)
    bad(flag + " " + std::to_string(threads) + " is more than " + std::to_string(kThreadsPerCore) + " x the " +
        std::to_string(m.cores) + " core(s) of this machine; use at most " + std::to_string(cap) +
        (zero_means_auto ? " (or 0: cores / ranks)" : ""));
}

void check_ranks(const std::string& what, int64_t ranks, int64_t threads_per_rank, const Machine& m) {
  const int64_t cap = static_cast<int64_t>(kRanksPerCore) * m.cores;
  if (ranks > cap)
    bad(what + " would run " + std::to_string(ranks) + " ranks as threads of this process, more than " +
        std::to_string(kRanksPerCore) + " x the " + std::to_string(m.cores) + " core(s) of this machine = " +
        std::to_string(cap) + "; use fewer ranks, or --backend mpi to spread them over processes");
  if (threads_per_rank > 0 && ranks * threads_per_rank > cap)
    bad(std::to_string(ranks) + " rank(s) x --threads " + std::to_string(threads_per_rank) + " = " +
        std::to_string(ranks * threads_per_rank) + " kernel threads in this process, more than " +
        std::to_string(kRanksPerCore) + " x the " + std::to_string(m.cores) + " core(s) of this machine = " +
        std::to_string(cap) + "; lower --threads (0: cores / ranks) or the number of ranks");
}

int64_t bucket_bytes_from_mb(double mb) {
  constexpr double kMaxMb = 1024.0 * 1024.0;  // 1 TiB
  const double bytes = mb * 1024.0 * 1024.0;
  if (!std::isfinite(mb) || !(bytes >= 4) || mb > kMaxMb)
    bad("--bucket-mb must be a size in MiB from 4 bytes (0.000004) to 1 TiB (1048576), got " + num(mb));
  return static_cast<int64_t>(bytes);
}

// ---- hosts ----
void check_ranks_per_host(int k, int world) {
  if (k < 1)
    bad("--ranks-per-host must be at least 1 (the ranks on each host: ranks [0, K) are host 0, [K, 2K) host 1, "
        "...), not " + std::to_string(k));
  if (world % k != 0)
    bad("--ranks-per-host " + std::to_string(k) + " does not divide the " + std::to_string(world) +
        " ranks of this run, so the hosts would hold different numbers of ranks; give a divisor of " +
        std::to_string(world));
}

void check_hosts(const TrainOptions& o) {
  const int world = o.dp * o.tp * o.pp;
  if (o.ranks_per_host != 0) check_ranks_per_host(o.ranks_per_host, world);
  const auto algo = comm::parse_algorithm(o.allreduce);
  if (!algo || *algo == comm::Algorithm::direct)
    bad("--allreduce must be auto, ring, rhd, tree, hier, shm or native, not '" + o.allreduce + "'");
  if (*algo == comm::Algorithm::automatic) return;
  if (o.dp < 2 || o.ps_servers > 0)
    bad("--allreduce chooses how the data-parallel gradients are all-reduced; it needs --dp 2 or more and no "
        "--ps-servers (drop --allreduce, or add --dp)");
  if (o.zero >= 2)
    bad("--allreduce chooses the gradients' all-reduce, and --zero " + std::to_string(o.zero) +
        " reduce-scatters them instead; use --zero 0 or 1, or drop --allreduce");
  if (o.comm_dtype == kernels::Precision::bf16)
    bad("--allreduce chooses the float32 gradients' all-reduce, and --comm-dtype bf16 exchanges bf16 slices with "
        "an all-to-all instead; drop one of them");
  if (*algo == comm::Algorithm::native && o.backend != "mpi")
    bad("--allreduce native calls the MPI library's own all-reduce; it needs --backend mpi (use ring, rhd, tree "
        "or hier on threads)");
  if (*algo != comm::Algorithm::hier) return;
  // hier: every data-parallel group on two or more hosts, with as many of its ranks on each.
  std::vector<int> hosts;
  if (o.ranks_per_host > 0) hosts = comm::hosts_in_blocks(world, o.ranks_per_host);
  else if (o.backend == "mpi" && comm::have_mpi() && comm::launched_by_mpirun()) hosts = comm::mpi_world()->hosts();
  if (hosts.empty()) hosts.assign(static_cast<size_t>(world), 0);
  const parallel::MeshShape shape{o.dp, o.tp, o.pp};
  for (int r = 0; r < world; ++r) {
    const parallel::MeshCoord c = parallel::mesh_coord(shape, r);
    if (c.dp != 0) continue;  // one group per (pp, tp): its dp index 0 names it
    std::map<int, int> on;
    for (int d = 0; d < o.dp; ++d) ++on[hosts[static_cast<size_t>(parallel::mesh_rank(shape, {d, c.tp, c.pp}))]];
    if (on.size() < 2) {
      if (o.ranks_per_host > 0)
        bad("--allreduce hier reduces inside each host and then across hosts, and with --ranks-per-host " +
            std::to_string(o.ranks_per_host) + " the data-parallel ranks of rank " + std::to_string(r) +
            " are all on one host; give a smaller --ranks-per-host (ranks [0, K) are host 0, [K, 2K) host 1, ...)");
      bad(std::string("--allreduce hier reduces inside each host and then across hosts, and all ") +
          std::to_string(world) + " ranks are on one host; " +
          (o.backend == "mpi" ? "place the processes on two or more hosts, or give --ranks-per-host K to group them"
                              : "on threads give --ranks-per-host K to emulate hosts (ranks [0, K) are host 0, ...), "
                                "K below " + std::to_string(world) + " and dividing it"));
    }
    for (auto& [h, n] : on)
      if (n != on.begin()->second)
        bad("--allreduce hier needs as many data-parallel ranks on each host, and the group of rank " +
            std::to_string(r) + " has " + std::to_string(on.begin()->second) + " on one host and " +
            std::to_string(n) + " on another; choose --ranks-per-host so that every host holds whole "
            "tensor-parallel groups in equal numbers");
  }
}

// ---- output paths ----

void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    bad(flag + " " + path + " is a directory; give the path of a file to write");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::exists(dir, ec))
    bad(flag + " " + path + ": the directory " + dir.string() + " does not exist; create it or choose another path");
  if (!fs::is_directory(dir, ec))
    bad(flag + " " + path + ": " + dir.string() + " is not a directory; choose another path");
  if (::access(dir.c_str(), W_OK) != 0)
    bad(flag + " " + path + ": the directory " + dir.string() + " is not writable; choose another path");
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0)
    bad(flag + " " + path + " exists and is not writable; choose another path");
  if (const int err = cannot_create_in(dir))
    bad(flag + " " + path + ": no file can be created in the directory " + dir.string() + " (" +
        std::strerror(err) + "); choose another path");
}

void check_output_dir(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    bad(flag + " " + path + " is a file, not a directory; give a directory (it is created if missing)");
  fs::path up = p;
  while (!fs::exists(up, ec) && up.has_parent_path() && up.parent_path() != up) up = up.parent_path();
  if (!fs::is_directory(up, ec))
    bad(flag + " " + path + ": " + up.string() + " is a file, so the directory cannot be created; choose another path");
  if (::access(up.c_str(), W_OK) != 0)
    bad(flag + " " + path + ": " + up.string() + " is not writable; choose another path");
}

// ---- the pass ----

void validate_options(const TrainOptions& o, const model::GPTConfig& cfg, const Machine& m) {
  check_ranges(o, cfg);
  check_layout(o);
  if (o.exact_sums > 0)
    bad("--exact-sums slices the parameter gradients of convolutional networks' layers; " + cfg.name +
        " is a transformer: drop --exact-sums");
  if (o.intra != IntraSplit::tensor)
    bad(std::string("--") + intra_flag(o.intra) + " splits a convolutional network (" +
        (o.intra == IntraSplit::spatial ? "its feature maps by row bands" : "its Inception blocks by branch") +
        "); a transformer splits its layers with --tp");
  if (o.pp > 1) {  // the schedule's shape and the stage partition, as every rank will build them
    make_pipeline_schedule(o);
    stage_layers(o, cfg);
  }
  plan::check_layout(*model::gpt_spec(cfg), plan_layout(o, {}));  // the check plan and launch share
  check_threads("--threads", o.threads, m, /*zero_means_auto=*/true);
  check_ranks(o.ps_servers > 0 ? "--dp and --ps-servers" : "--dp, --tp and --pp", local_ranks(o), o.threads, m);
  check_memory(o, *model::gpt_spec(cfg), m);
  if (o.batch > (int64_t{1} << 24))
    bad("--batch " + std::to_string(o.batch) + " is more than the 16777216 rows per batch the data order supports");
  check_paths(o);
}

void check_paths(const TrainOptions& o) {
  PathPlan plan(o.overwrite);
  plan.input_file("--data", o.data);
  plan.input_file("--config", o.config_file);
  plan.output_file("--metrics", o.metrics, OutputKind::metrics);
  if (o.resume && !o.metrics.empty()) {  // the trim of a resumed run's metrics (train/metrics.h)
    plan.side_file("--metrics's backup", o.metrics + ".old");
    plan.side_file("--metrics's rewrite", o.metrics + ".tmp");
  }
  plan.output_file("--trace", o.trace, OutputKind::trace);
  if (!o.trace.empty()) plan.output_file("--trace's swimlane", trace_svg_path(o.trace), OutputKind::svg);
  plan.output_checkpoint_dir("--checkpoint-dir", o.checkpoint_dir);
  plan.check();
}

void validate_image_options(const TrainOptions& o, const model::ModelSpec& spec, const Machine& m) {
  const std::string name = spec.name();
  model::GPTConfig shape;  // the ranges of check_ranges with a "sequence" of one image
  shape.block_size = 1;
  check_ranges(o, shape);
  check_layout(o);
  auto refuse = [&](bool when, const std::string& what) {
    if (when) bad(name + " is an image model: " + what);
  };
  refuse(o.sequence_parallel, "--sequence-parallel splits a transformer's sequence; drop it");
  refuse(o.pad_vocab, "--pad-vocab pads a transformer's vocabulary; drop it");
  if (o.tp > 1 && o.intra == IntraSplit::spatial) {
    // Zero-bubble schedules defer the weight gradients past the unit's backward, where the
    // spatial layout sums their band-partial parts (parallel/spatial/cnn_spatial.h).
    refuse(o.pp > 1 && (o.schedule == "zb" || o.schedule == "zb-h1"),
           "--spatial sums each unit's partial weight gradients as its backward ends, which --schedule " + o.schedule +
               " defers; use --schedule 1f1b, gpipe or interleaved");
  }
  if (o.ps_servers > 0) {
    // Batch norm under the parameter server: at staleness 0 the workers compute each step
    // together and sum its statistics over a workers-only group (train/ps_trainer.h); with a
    // bound above 0 they run steps apart, so no worker can wait for another's statistics.
    const std::vector<std::pair<std::string, Shape>> buffers = spec.buffer_shapes();
    std::string why = "its batch norms share their statistics across the workers, which --staleness ";
    why += o.staleness < 0 ? std::string("inf") : std::to_string(o.staleness);
    why += " runs steps apart; add --batch-norm local (each worker's own statistics) or use --staleness 0";
    refuse(o.staleness != 0 && !buffers.empty() && !o.batch_norm_local, why);
    refuse(o.exact_sums > 0, "--exact-sums makes data parallelism's sums exact, and the parameter server sums its "
                             "pushes in float32; drop --exact-sums or --ps-servers");
  }
  refuse(o.recompute, "--recompute would run its batch norms twice per micro-batch; drop --recompute");
  refuse(o.precision == kernels::Precision::bf16, "its convolutions run in float32 only; drop --precision bf16");
  refuse(o.comm_dtype == kernels::Precision::bf16, "drop --comm-dtype bf16 (float32 gradients only for now)");
  if (o.exact_sums > 0) {
    refuse(o.tp > 1 && o.intra != IntraSplit::branch,
           std::string("--exact-sums makes the sums of data parallelism and of branch joins exact; --") +
               intra_flag(o.intra) + " adds sums of its own (partial outputs, halos) that it does not cover: drop one");
    refuse(o.exact_sums % o.dp != 0, "--exact-sums " + std::to_string(o.exact_sums) +
                                         " slices do not split over --dp " + std::to_string(o.dp) +
                                         " ranks; use a multiple of " + std::to_string(o.dp));
    const int64_t rows = o.batch / o.microbatches;
    refuse(rows % o.exact_sums != 0, "a micro-batch of " + std::to_string(rows) + " rows (--batch / --microbatches) "
                                         "does not make --exact-sums " + std::to_string(o.exact_sums) +
                                         " equal slices; use a divisor of " + std::to_string(rows));
  }
  refuse(o.data_order == DataOrder::sequential && o.augment,
         "--augment crops and flips by meshtrain's own draws, which --data-order sequential exists to avoid "
         "(its batches are the images in file order, for another framework to replay); drop one of them");
  refuse(o.pp_balance == "profile", "--pp-balance profile measures transformer blocks; give counts or flops");
  if (o.pp > 1) {
    make_pipeline_schedule(o);
    stage_units(o, *spec.cnn());
  }
  plan::check_layout(spec, plan_layout(o, {}));  // the split's own rules: the check plan and launch share
  if (o.pp > 1 && spec.cnn() && spec.cnn()->graph) {
    // The skips across the stages' cuts, refused here (before any work) where the executor's one
    // portal in and one out of a stage cannot carry them; the trainer sets the same portals up.
    const model::CNNConfig& cnn = *spec.cnn();
    std::vector<int64_t> first_unit;
    for (const pipeline::LayerSpan& sp : stage_units(o, cnn)) first_unit.push_back(sp.first);
    model::skip_portals(*cnn.graph, model::infer_shapes(*cnn.graph, {cnn.channels, cnn.height, cnn.width}), first_unit);
  }
  check_threads("--threads", o.threads, m, /*zero_means_auto=*/true);
  check_ranks(o.ps_servers > 0 ? "--dp and --ps-servers" : "--dp, --tp and --pp", local_ranks(o), o.threads, m);
  check_memory(o, spec, m);
  check_paths(o);
}

void validate_dataset(const TrainOptions& o, const model::GPTConfig& cfg, const TokenDataset& data) {
  if (data.vocab_size() > cfg.vocab_size) {
    // The first token beyond it, in file order (the training split, then the validation split).
    const uint16_t* t = data.tokens(Split::train);
    const int64_t n = data.num_tokens(Split::train) + data.num_tokens(Split::val);
    int64_t first = 0;
    while (first < n && t[first] < cfg.vocab_size) ++first;
    bad("the data file " + o.data + " has token ids up to " + std::to_string(data.vocab_size() - 1) +
        " but the model's vocabulary is " + std::to_string(cfg.vocab_size) +
        "; use a model with a larger vocab_size (the first id beyond it: " + std::to_string(t[first]) +
        " at index " + std::to_string(first) + (data.format() == TokenDataset::Format::npy ? " of the array" : "") +
        ")");
  }
  const int64_t n_val = data.num_tokens(Split::val), n_train = data.num_tokens(Split::train);
  if (n_val < o.seq + 1)
    bad("--val-fraction " + num(o.val_fraction) + " leaves " + std::to_string(n_val) + " validation tokens of " +
        o.data + ", fewer than --seq + 1 = " + std::to_string(o.seq + 1) +
        "; raise --val-fraction, lower --seq or use a longer file");
  if (o.data_order == DataOrder::sequential && n_train < o.batch * o.seq + 1)
    bad("the training split of " + o.data + " has " + std::to_string(n_train) +
        " tokens, fewer than the --batch x --seq + 1 = " + std::to_string(o.batch * o.seq + 1) +
        " one batch of --data-order sequential needs; lower --batch or --seq, or use a longer file");
}

}  // namespace meshtrain::train
