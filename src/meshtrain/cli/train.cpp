// `meshtrain train`: the flags of DESIGN "Interfaces", mapped onto train::TrainOptions.
// Bad input (unknown model, missing data file, impossible layout, corrupt checkpoint) exits 2
// with the sentence the trainer raised; failures while training exit 1.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/options.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/world.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/onnx/onnx_import.h"
#include "meshtrain/plan/machine.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/stop.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/validate.h"

namespace meshtrain::cli {

namespace {

// --optimizer and --lr-schedule into `o`, and the flags that mean nothing for the chosen ones
// refused, naming what they need (the library ignores them; a user's call must not).
void check_optimizer_flags(train::TrainOptions& o, const std::string& optimizer, const std::string& schedule,
                           const std::function<bool(const char*)>& given) {
  using train::OptimizerKind;
  o.optim.kind = train::parse_optimizer(optimizer);
  o.optim.schedule = train::parse_lr_schedule(schedule);
  const std::string name = train::to_string(o.optim.kind);
  for (const char* flag : {"--momentum", "--nesterov"})
    if (given(flag) && o.optim.kind != OptimizerKind::sgd)
      throw std::invalid_argument(std::string(flag) + " sets SGD's momentum; it needs --optimizer sgd, and this run's "
                                  "optimizer is " + name + " (drop " + flag + ", or add --optimizer sgd)");
  if (given("--beta2") && o.optim.kind == OptimizerKind::sgd)
    throw std::invalid_argument("--beta2 sets the second-moment decay of AdamW and LAMB; it needs --optimizer adamw "
                                "or lamb, and SGD keeps no second moment (drop --beta2, or choose adamw or lamb)");
  if (o.optim.schedule != train::LrSchedule::step)
    for (const char* flag : {"--lr-step-every", "--lr-step-gamma"})
      if (given(flag))
        throw std::invalid_argument(std::string(flag) + " sets the step decay of the learning rate; it needs "
                                    "--lr-schedule step (drop " + flag + ", or add --lr-schedule step)");
  if (given("--min-lr") && o.optim.schedule == train::LrSchedule::step)
    throw std::invalid_argument("--min-lr is where the cosine decay ends; --lr-schedule step does not use it (drop "
                                "--min-lr, or use --lr-schedule cosine)");
}

// --init-from into `o`: onnx, seed or an ONNX file's weights (read here, checked against the
// model by the trainer's validation).
void resolve_init_from(train::TrainOptions& o, const std::string& from) {
  if (from.empty()) return;
  const std::string& model = o.config_file.empty() ? o.model : o.config_file;
  if (from == "seed") {
    o.init_from_seed = true;
  } else if (from == "onnx") {
    if (!model::is_onnx_path(model))
      throw std::invalid_argument("--init-from onnx starts from the weights of the ONNX file given as --model, and " +
                                  model + " is not one; give --model net.onnx, or --init-from net.onnx for the "
                                  "weights of another file");
  } else if (model::is_onnx_path(from)) {
    auto w = std::make_shared<std::vector<std::pair<std::string, Tensor>>>(onnx_import::import_onnx(from).weights);
    o.initial_weights = std::move(w);
    o.initial_source = "the ONNX file " + from;
  } else {
    throw std::invalid_argument("--init-from must be onnx, seed or an ONNX file (FILE.onnx), not '" + from + "'");
  }
}

}  // namespace

void add_train_command(CLI::App& app, std::shared_ptr<const InProcessHooks> hooks) {
  if (!hooks) hooks = std::make_shared<const InProcessHooks>();
  auto opt = std::make_shared<train::TrainOptions>();
  auto order = std::make_shared<std::string>("random");
  auto bucket_mb = std::make_shared<double>(0.0);
  auto staleness = std::make_shared<std::string>("0");
  auto precision = std::make_shared<std::string>("fp32");
  auto comm_dtype = std::make_shared<std::string>("fp32");
  auto optimizer = std::make_shared<std::string>("adamw");
  auto lr_schedule = std::make_shared<std::string>("cosine");
  auto weight_decay = std::make_shared<float>(0.f);
  auto machine = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("train", "Train a model (a GPT on text or tokens, a CNN on images)");
  c->add_option("--model", opt->model,
                "Named model: gpt-tiny, gpt-small, gpt2-124m (token models); cnn-small, resnet-small, "
                "inception-small (image classifiers)")
      ->capture_default_str();
  c->add_option("--config", opt->config_file, "Model config JSON file (instead of --model)");
  c->add_option("--data", opt->data,
                 "Token models: a text file (byte tokens), a uint16 token file (.bin) or a 1-d integer NumPy array "
                 "(.npy); image models: fashion-mnist (the Debian package), a directory of the four IDX files, or an "
                 ".npz holding x_train, y_train, x_test, y_test (uint8 or float32 images, integer labels)");
  auto data_layout = std::make_shared<std::string>();
  c->add_option("--data-layout", *data_layout,
                "Image models with an .npz: nhwc (N x H x W x C) or nchw (N x C x H x W), for 4-d images whose shape "
                "does not say (default: told from the shape)");
  c->add_flag("--augment", opt->augment, "Image models: random 2-pixel crops and horizontal flips of the training images");
  auto batch_norm = std::make_shared<std::string>("sync");
  c->add_option("--batch-norm", *batch_norm,
                "Image models: sync (batch-norm statistics over the data-parallel group: every layout gives the "
                "single-rank curve) or local (per rank: faster, different numbers)")
      ->capture_default_str();
  c->add_option("--data-order", *order, "random (drawn from seed and step) or sequential (file order, for replay elsewhere)")->capture_default_str();
  c->add_option("--val-fraction", opt->val_fraction, "Share of the tokens held out for validation (the end of the file)")->capture_default_str();
  c->add_option("--dp", opt->dp, "Data-parallel ranks")->check(integer<int>(1))->capture_default_str();
  c->add_option("--tp", opt->tp, "Tensor-parallel ranks")->check(integer<int>(1))->capture_default_str();
  c->add_option("--pp", opt->pp, "Pipeline stages")->check(integer<int>(1))->capture_default_str();
  auto spatial = std::make_shared<int>(1), branch = std::make_shared<int>(1);
  c->add_option("--spatial", *spatial, "Image models: ranks that split every feature map into bands of rows (halos exchanged)")
      ->check(integer<int>(1));
  c->add_option("--branch-parallel", *branch, "inception-small: ranks over which each Inception block's branches are placed")
      ->check(integer<int>(1));
  c->add_option("--branch-balance", opt->branch_balance,
                "With --branch-parallel: the rank of each of an Inception block's four branches, e.g. 0,1,1,0, or "
                "flops (balanced by their FLOPs); default: balanced by their time, measured at start and printed");
  c->add_flag("--sequence-parallel", opt->sequence_parallel, "With --tp: split layernorm and residual regions along the sequence");
  c->add_flag("--pad-vocab", opt->pad_vocab, "With --tp: split a vocabulary tp does not divide by padding it (left out of the loss)");
  c->add_option("--microbatches", opt->microbatches, "Micro-batches per step (gradient accumulation)")->check(integer<int>(1))->capture_default_str();
  c->add_option("--schedule", opt->schedule, "Pipeline schedule with --pp > 1: naive, gpipe, 1f1b, interleaved, zb (ZB-H1: backward split into input and weight gradients), pipedream-2bw (no flush between steps, one step of weight staleness; at --pp 1 its single-rank reference), pipedream (an update after every micro-batch, stage s of p on weights p-1-s updates old; --pp 1 --chunks P is the single-rank reference of a pp P run), chimera (two pipelines in opposite directions over the same ranks; even --pp and --microbatches)")->capture_default_str();
  c->add_option("--chunks", opt->chunks, "Model chunks per pipeline rank (--schedule interleaved: 2 or more)")->check(integer<int>(1))->capture_default_str();
  c->add_flag("--recompute", opt->recompute, "Keep each pipeline stage's input only and recompute its forward inside backward (less activation memory, one more forward)");
  c->add_option("--pp-cuts", opt->pp_cuts, "The layers the pipeline stages after the first begin at, comma-separated: blocks of a transformer (h.2) or layers of a graph that begin a unit (model show lists them)");
  c->add_option("--pp-balance", opt->pp_balance, "Blocks per pipeline stage: counts such as 3,3,2,2, or `flops` (the default: balanced by the analytic FLOPs of the blocks and the head) or `profile` (balanced by their forward + backward time, measured at start)");
  c->add_option("--zero", opt->zero, "ZeRO stage 0..3")->check(integer<int>(0))->capture_default_str();
  CLI::Option* bucket_flag = c->add_option("--bucket-mb", *bucket_mb, "Data-parallel gradient bucket size in MiB (default 4)");
  c->add_option("--ps-servers", opt->ps_servers, "Parameter-server ranks (0: none); the world is --dp workers plus these")->check(integer<int>(0))->capture_default_str();
  c->add_option("--staleness", *staleness, "Parameter server: steps a worker may run ahead of the slowest (0: synchronous; inf or -1: asynchronous)")->capture_default_str();
  c->add_option("--slow-worker", opt->slow_worker_factor, "Test flag: worker 0 sleeps so its step takes this many times longer")->capture_default_str();
  c->add_option("--backend", opt->backend, "Communication backend: threads or mpi")->capture_default_str();
  c->add_option("--allreduce", opt->allreduce,
                "Algorithm of the data-parallel gradient all-reduce: auto (the cost model's choice), ring, rhd, tree, "
                "hier (reduce-scatter inside each host, all-reduce across hosts, all-gather inside; needs two or "
                "more hosts), shm (ranks on one host: each sums a block of every rank's data in shared memory) or native (mpi)")
      ->capture_default_str();
  auto ranks_per_host = std::make_shared<int>(0);
  c->add_option("--ranks-per-host", *ranks_per_host,
                "Ranks per host: ranks [0,K) are host 0, [K,2K) host 1, ... (threads: emulated hosts, whose "
                "cross-host bytes are counted; mpi: overrides the hosts mpirun placed the processes on)");
  auto comm_timeout = std::make_shared<double>(0.0);
  CLI::Option* comm_timeout_opt = c->add_option(
      "--comm-timeout", *comm_timeout,
      "Deadline of every communication in seconds (default: MESHTRAIN_COMM_TIMEOUT_S, else 300)");
  c->add_option("--steps", opt->steps, "Optimizer steps")->check(integer<int64_t>(1))->capture_default_str();
  c->add_option("--batch", opt->batch, "Global batch size B (default: the model's)")->check(integer<int64_t>(1));
  c->add_option("--seq", opt->seq, "Sequence length T (default: the model's)")->check(integer<int64_t>(1));
  c->add_option("--optimizer", *optimizer, "adamw, sgd (momentum, optional Nesterov, L2 weight decay) or lamb (AdamW's moments scaled per tensor by the trust ratio |w| / |update|)")->capture_default_str();
  c->add_option("--lr", opt->optim.lr, "Peak learning rate")->capture_default_str();
  c->add_option("--lr-schedule", *lr_schedule, "After the warm-up: cosine (down to --min-lr) or step (times --lr-step-gamma every --lr-step-every steps)")->capture_default_str();
  c->add_option("--min-lr", opt->optim.min_lr, "Learning rate at the end of the cosine decay")->capture_default_str();
  c->add_option("--lr-step-every", opt->optim.step_every, "--lr-schedule step: steps between two decays (counted from the run's start)")->check(integer<int64_t>(1));
  c->add_option("--lr-step-gamma", opt->optim.step_gamma, "--lr-schedule step: the factor of each decay")->capture_default_str();
  c->add_option("--warmup", opt->optim.warmup_steps, "Linear warm-up steps")->check(integer<int64_t>(0))->capture_default_str();
  c->add_option("--weight-decay", *weight_decay, "Weight decay of the 2-D weights (default: adamw 0.1, lamb 0.01, sgd 0; sgd adds it to the gradient as L2, adamw and lamb decouple it)");
  c->add_option("--beta2", opt->optim.beta2, "AdamW and LAMB: second-moment decay")->capture_default_str();
  c->add_option("--momentum", opt->optim.momentum, "SGD: momentum (0: none)")->capture_default_str();
  c->add_flag("--nesterov", opt->optim.nesterov, "SGD: Nesterov momentum");
  c->add_option("--grad-clip", opt->optim.grad_clip, "Clip the global gradient norm to this (0: off)")->capture_default_str();
  c->add_option("--seed", opt->seed, "Seed of the initialisation and the data order")->check(integer<uint64_t>())->capture_default_str();
  c->add_option("--precision", *precision, "Matrix products in fp32, or bf16 (bf16 operands, float32 accumulation; float32 master weights, Adam, norms, softmax and loss)")->capture_default_str();
  c->add_option("--exact-sums", opt->exact_sums,
                 "Image models: sum parameter gradients exactly over N equal slices of every micro-batch, so that "
                 "data parallelism (dp dividing N) gives the single rank's loss curve at the same --threads (0: off)")
      ->check(integer<int>(0))
      ->capture_default_str();
  c->add_option("--comm-dtype", *comm_dtype, "Data-parallel gradient buckets and tensor-parallel activations on the wire as fp32, or bf16 (half the bytes; summed in float32)")->capture_default_str();
  c->add_option("--threads", opt->threads, "Kernel threads per rank (0: cores / ranks)")->check(integer<int>(0))->capture_default_str();
  c->add_option("--eval-every", opt->eval_every, "Validation loss every K steps (0: only at the end)")->check(integer<int64_t>(0))->capture_default_str();
  c->add_option("--eval-batches", opt->eval_batches, "Batches averaged for the validation loss")->check(integer<int64_t>(1))->capture_default_str();
  c->add_option("--metrics", opt->metrics, "Write one JSON line per step to this file");
  c->add_option("--trace", opt->trace, "Write a Chrome trace (Perfetto) of every rank to this file");
  c->add_option("--fail-rank", opt->fail_rank,
                 "Test fault injection: this world rank fails at the start of --fail-at-step (a lost rank)")
      ->group("");
  c->add_option("--fail-at-step", opt->fail_at_step, "Test fault injection: the step (0-based) --fail-rank fails at")
      ->group("");
  c->add_option("--machine", *machine,
                "The machine file (meshtrain calibrate) of the cost model's prediction, printed against the measured "
                "step time and memory; default: the cached one, measured quickly on first use (docs/planner.md)");
  c->add_option("--checkpoint-dir", opt->checkpoint_dir,
                 "Directory for checkpoints: saved every --checkpoint-every steps and at the end");
  c->add_option("--checkpoint-every", opt->checkpoint_every,
                 "With --checkpoint-dir: save every K steps (default " + std::to_string(kDefaultCheckpointEvery) +
                     "; 0: only at the end); the end of the run is always saved")->check(integer<int64_t>(0))->capture_default_str();
  c->add_option("--checkpoint-every-s", opt->checkpoint_every_s,
                "Also save a checkpoint once this many seconds have passed since the last (rank 0's clock; "
                "with --checkpoint-dir)");
  c->add_option("--keep-checkpoints", opt->keep_checkpoints, "Keep only the newest N checkpoints (0: all)")->check(integer<int>(0))->capture_default_str();
  c->add_flag("--resume", opt->resume, "Continue from the newest checkpoint in --checkpoint-dir");
  c->add_flag("--save-initial", opt->save_initial, "Also save the initial weights as step 0");
  auto init_from = std::make_shared<std::string>();
  c->add_option("--init-from", *init_from,
                "The step-0 weights: onnx (the --model ONNX file's own; the default for one), seed (--seed's draws; "
                "the default otherwise) or FILE.onnx (the weights of an ONNX file of the same network, e.g. for a "
                "model file `meshtrain import` wrote)");
  c->add_flag("--overwrite", opt->overwrite, "Let --metrics and --trace replace existing files that meshtrain did not write");
  c->add_option("--log-every", opt->log_every, "Progress line every N steps")->check(integer<int64_t>(0))->capture_default_str();
  c->add_flag("--quiet", opt->quiet, "No progress output");
  c->callback([c, hooks, machine, spatial, branch, batch_norm, data_layout, opt, ranks_per_host, order, bucket_mb, bucket_flag, staleness, precision, comm_dtype, comm_timeout, comm_timeout_opt,
               optimizer, lr_schedule, weight_decay, init_from] {
    train::TrainOptions o = *opt;
    auto given = [c](const char* flag) { return c->get_option(flag)->count() > 0; };
    try {
      // A flag given an empty value would silently mean "not given": refuse it.
      for (const char* flag : {"--model", "--config", "--data", "--metrics", "--trace", "--checkpoint-dir",
                               "--pp-balance", "--pp-cuts", "--schedule", "--backend", "--data-order", "--optimizer",
                               "--lr-schedule", "--allreduce", "--data-layout"})
        if (given(flag) && c->get_option(flag)->as<std::string>().empty())
          throw std::invalid_argument(std::string(flag) + " is empty; give it a value or leave the flag out");
      if (given("--model") && given("--config"))
        throw std::invalid_argument("--model and --config both choose the model; give one of them (--config FILE "
                                    "for a model of your own, --model NAME for a named one)");
      const bool known_schedule = o.schedule == "naive" || o.schedule == "gpipe" || o.schedule == "1f1b" ||
                                  o.schedule == "interleaved" || o.schedule == "zb" || o.schedule == "zb-h1" ||
                                  o.schedule == "chimera";
      // An unknown name: validation names it. pipedream-2bw and pipedream at pp 1 are their single-rank references.
      if (given("--schedule") && o.pp == 1 && known_schedule)
        throw std::invalid_argument("--schedule chooses the pipeline schedule; it needs --pp 2 or more (drop "
                                    "--schedule, or add --pp)");
      // Flags of one axis given without it (the library accepts them, so that a single-rank
      // reference run can share a parallel run's options; a user's call must not).
      if (o.recompute && o.pp == 1)
        throw std::invalid_argument("--recompute keeps each pipeline stage's input and recomputes its forward; it "
                                    "needs --pp 2 or more (drop --recompute, or add --pp)");
      // The intra-layer axis carries one split: filters and channels (--tp), row bands (--spatial)
      // or branches (--branch-parallel); its size is the mesh's tp.
      {
        const int splits = (o.tp > 1) + (*spatial > 1) + (*branch > 1);
        if (splits > 1)
          throw std::invalid_argument("--tp, --spatial and --branch-parallel each split the layers over the same "
                                      "intra-layer ranks; give one of them (and --dp or --pp for more ranks)");
        if (*spatial > 1) o.tp = *spatial, o.intra = train::IntraSplit::spatial;
        if (*branch > 1) o.tp = *branch, o.intra = train::IntraSplit::branch;
        if (given("--branch-balance") && *branch == 1)
          throw std::invalid_argument("--branch-balance places Inception branches on ranks; it needs "
                                      "--branch-parallel 2 or more (drop it, or add --branch-parallel)");
      }
      if (o.pad_vocab && o.tp == 1)
        throw std::invalid_argument("--pad-vocab pads the vocabulary that tensor parallelism splits; it needs --tp 2 "
                                    "or more (drop it, or add --tp)");
      if (given("--bucket-mb") && (o.dp == 1 || o.ps_servers > 0))
        throw std::invalid_argument("--bucket-mb sizes the gradient buckets data parallelism all-reduces; it needs "
                                    "--dp 2 or more and no --ps-servers (drop --bucket-mb, or add --dp)");
      if (given("--staleness") && o.ps_servers == 0)
        throw std::invalid_argument("--staleness bounds how far parameter-server workers run ahead; it needs "
                                    "--ps-servers 1 or more (drop --staleness, or add --ps-servers)");
      if (given("--keep-checkpoints") && o.checkpoint_dir.empty())
        throw std::invalid_argument("--keep-checkpoints needs --checkpoint-dir DIR (the checkpoints it keeps)");
      if (given("--zero") && o.zero > 0 && o.dp == 1)
        throw std::invalid_argument("--zero " + std::to_string(o.zero) +
                                    " shards the training state over data-parallel ranks; it needs --dp 2 or more "
                                    "(drop --zero, or add --dp)");
      if (given("--log-every") && o.quiet)
        throw std::invalid_argument("--log-every sets how often progress lines print, and --quiet prints none; "
                                    "give one of them");
      if (given("--ranks-per-host")) {
        train::check_ranks_per_host(*ranks_per_host, o.dp * o.tp * o.pp);
        o.ranks_per_host = *ranks_per_host;
      }
      check_optimizer_flags(o, *optimizer, *lr_schedule, given);
      resolve_init_from(o, *init_from);
      if (given("--weight-decay")) o.optim.weight_decay = *weight_decay;
      // --checkpoint-dir alone saves at the default cadence and at the end (README).
      if (!o.checkpoint_dir.empty() && !given("--checkpoint-every") && !given("--checkpoint-every-s"))
        o.checkpoint_every = kDefaultCheckpointEvery;
      check_comm_timeout_env();
      if (*batch_norm != "sync" && *batch_norm != "local")
        throw std::invalid_argument("--batch-norm must be sync or local, not '" + *batch_norm + "'");
      o.batch_norm_local = *batch_norm == "local";
      if (model::is_cnn_name(o.model) || !o.config_file.empty()) {
        // checked by the trainer once the model is known
      } else if (given("--augment") || given("--batch-norm") || given("--data-layout")) {
        throw std::invalid_argument(std::string(given("--augment") ? "--augment" : given("--batch-norm") ? "--batch-norm" : "--data-layout") +
                                    " applies to image models (cnn-small, resnet-small, inception-small); " + o.model +
                                    " reads tokens: drop it");
      }
      if (comm_timeout_opt->count() > 0) {
        const double s = *comm_timeout;
        if (!(s > 0 && s <= 604'800))  // also refuses nan
          throw std::invalid_argument("--comm-timeout must be a number of seconds above 0 and at most 604800 (a week), not " +
                                      comm_timeout_opt->as<std::string>());
        comm::Communicator::set_default_timeout(comm::Timeout(std::max<int64_t>(1, static_cast<int64_t>(s * 1000))));
      }
      if (bucket_flag->count() > 0) o.bucket_bytes = train::bucket_bytes_from_mb(*bucket_mb);
      o.data_order = train::parse_data_order(*order);
      if (given("--data-layout")) o.data_layout = train::parse_image_layout(*data_layout);
      try {
        o.precision = kernels::parse_precision(*precision);
      } catch (const std::invalid_argument&) {
        throw std::invalid_argument("--precision must be fp32 or bf16, not '" + *precision + "'");
      }
      try {
        o.comm_dtype = kernels::parse_precision(*comm_dtype);
      } catch (const std::invalid_argument&) {
        throw std::invalid_argument("--comm-dtype must be fp32 or bf16, not '" + *comm_dtype + "'");
      }
      if (*staleness == "inf" || *staleness == "unbounded") {
        o.staleness = -1;
      } else {
        size_t used = 0;
        try {
          o.staleness = std::stoll(*staleness, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != staleness->size())
          throw std::invalid_argument("--staleness must be a number of steps (0: synchronous) or inf (unbounded), not '" + *staleness + "'");
      }
      // The cost model's hardware (plan/cost.h), predicted against measured at the end: read or
      // measured once every input has been checked.
      o.on_checked = [machine, program = hooks->calibrate_program](train::TrainOptions& run) {
        std::string source;
        const bool mpi = comm::launched_by_mpirun();
        // The quick calibration runs as a child process (`meshtrain calibrate --quick`), so its
        // buffers never count in this run's peak memory.
        auto child = [program](const std::string& out) {
          std::error_code ec;
          const std::string self = program == "/proc/self/exe" ? std::filesystem::read_symlink(program, ec).string() : program;
          if (ec || self.empty() || self.find('\'') != std::string::npos || out.find('\'') != std::string::npos) return false;
          const std::string cmd = "'" + self + "' calibrate --quick --overwrite --out '" + out + "' > /dev/null 2>&1";
          return std::system(cmd.c_str()) == 0;
        };
        if (auto m = plan::machine_for_run(*machine, !mpi && !program.empty(), &source, child)) {
          run.hardware = std::make_shared<const plan::Hardware>(plan::hardware_from_machine(*m, 0));
          run.hardware_source = source;
        }
      };
      if ((o.fail_rank >= 0) != (o.fail_at_step >= 0))
        throw std::invalid_argument("--fail-rank and --fail-at-step inject a failure together; give both or neither");
      if (o.fail_rank >= o.dp * o.tp * o.pp)
        throw std::invalid_argument("--fail-rank " + std::to_string(o.fail_rank) + " is not a rank of the " +
                                    std::to_string(o.dp * o.tp * o.pp) + " of this layout");
      if (const char* status = std::getenv("MESHTRAIN_LAUNCH_STATUS")) o.launch_status_file = status;  // cli/launch.cpp
      train::configure_allocator();
      // SIGINT, SIGTERM and SIGUSR1 stop at the end of the step in flight, with a checkpoint
      // (train/stop.h; under MPI SIGTERM stays the backend's); the parameter server's ranks run
      // free of steps in common, so it keeps the default.
      if (o.ps_servers == 0 && hooks->install_stop_handlers) train::install_stop_handlers(/*with_sigterm=*/o.backend != "mpi");
      o.on_step = hooks->on_step;
      if (hooks->before_train) hooks->before_train(o);
      train::TrainResult r = train::train(o);
      if (r.stopped_by != 0 && !r.steps.empty()) {
        const long long step = static_cast<long long>(r.steps.back().step + 1);
        if (o.checkpoint_dir.empty())
          std::printf("stopped at step %lld by %s; no --checkpoint-dir, so there is nothing to resume from\n", step,
                      train::signal_name(r.stopped_by));
        else
          std::printf("stopped at step %lld by %s, checkpoint written to %s (continue with --resume)\n", step,
                      train::signal_name(r.stopped_by), o.checkpoint_dir.c_str());
        std::fflush(stdout);
      }
      if (hooks->on_result) hooks->on_result(std::move(r));
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    } catch (const train::DataError& e) {
      throw UsageError(e.what());
    } catch (const train::CheckpointError& e) {
      throw UsageError(e.what());
    }
  });
}

}  // namespace meshtrain::cli
