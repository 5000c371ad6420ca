// _meshtrain: the C++ half of the Python module (python/meshtrain/, docs/python.md).
//
// Every call is the program's own: the Python side turns keyword arguments into the words of a
// command line, and run_in_process (cli/in_process.h) parses and checks them with the program's
// parser and runs the subcommand, with hooks that hand back what the program only prints or
// writes. So a bad value raises ValueError with exactly the sentence `meshtrain` prints before
// exiting 2; a failure while running raises RuntimeError (the program's exit 1).
//
// Threads and the GIL: training releases the GIL for the whole run (ranks are C++ threads, or
// this process is one MPI rank); world rank 0 takes it back only to call on_step with each
// step's metrics row. An exception raised by on_step ends the run (the other ranks fail at their
// next collective) and is raised again, as it was, by train(); so does Ctrl-C's KeyboardInterrupt
// (at the end of the step in flight) when the ranks are threads.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/in_process.h"
#include "meshtrain/comm/world.h"
#include "meshtrain/plan/machine.h"
#include "meshtrain/train/trainer.h"

namespace py = pybind11;
using meshtrain::cli::InProcessHooks;
using meshtrain::cli::run_in_process;

namespace {

// Thrown on world rank 0 to end the run when on_step raised or Ctrl-C was pressed; train()
// raises the Python exception instead (Raised, below).
struct CallbackFailure : std::runtime_error {
  CallbackFailure() : std::runtime_error("on_step raised an exception (raised again by meshtrain.train)") {}
};

// Runs fn with this process's standard output (file descriptor 1, which the subcommands print
// to) sent to a temporary file, and returns what was written there.
std::string capture_stdout(const std::function<void()>& fn) {
  std::fflush(stdout);
  std::FILE* tmp = std::tmpfile();
  if (!tmp) throw std::runtime_error("cannot make a temporary file to read the output of meshtrain");
  const int saved = ::dup(1);
  ::dup2(::fileno(tmp), 1);
  auto restore = [&] {
    std::fflush(stdout);
    ::dup2(saved, 1);
    ::close(saved);
  };
  try {
    fn();
  } catch (...) {
    restore();
    std::fclose(tmp);
    throw;
  }
  restore();
  std::string out;
  std::rewind(tmp);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

// What on_step raised, or the KeyboardInterrupt that Ctrl-C raised during the run: set with the
// GIL held (the first wins), raised by train() once the run has ended.
struct Raised {
  std::unique_ptr<py::error_already_set> error;
  std::atomic<bool> interrupted{false};  // Ctrl-C: world rank 0 ends the run at its next step's end
};

// Runs the command with the GIL released; the error of on_step (or Ctrl-C's) first, then the
// command's own.
//
// Interruptible (train on threads): the command runs on a thread of its own while this thread
// (Python's main thread, where Python runs its signal handlers) wakes every 100 ms to let them
// run. A KeyboardInterrupt is kept and the run told to stop: world rank 0 throws at the end of the
// step in flight, the other ranks stop at their next collective, and train() raises it. Under
// MPI the command stays on this thread (MPI was initialised by it), and Ctrl-C waits for the end.
void run_released(const std::vector<std::string>& args, const InProcessHooks& hooks,
                  const std::shared_ptr<Raised>& raised, bool quiet_stdout, bool interruptible = false) {
  std::exception_ptr failure;
  auto body = [&] {
    try {
      if (quiet_stdout) capture_stdout([&] { run_in_process(args, hooks); });
      else run_in_process(args, hooks);
    } catch (...) {
      failure = std::current_exception();
    }
    std::fflush(stdout);
  };
  {
    py::gil_scoped_release nogil;
    if (!interruptible || !raised) {
      body();
    } else {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::thread runner([&] {
        body();
        std::lock_guard<std::mutex> lock(mu);
        done = true;
        cv.notify_all();
      });
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(mu);
          if (cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; })) break;
        }
        if (raised->interrupted) continue;
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {  // a handler raised (SIGINT: KeyboardInterrupt)
          py::error_already_set e;
          if (!raised->error) raised->error = std::make_unique<py::error_already_set>(std::move(e));
          raised->interrupted = true;
        }
      }
      runner.join();
    }
  }
  if (raised && raised->error) throw py::error_already_set(*raised->error);
  if (failure) std::rethrow_exception(failure);
}

py::object json_loads(const std::string& text) {
  return py::module_::import("json").attr("loads")(text);
}

// train(args, on_step, checkpoint_dir, program) -> dict
//   args: the words of `meshtrain train ...`; on_step: None or a callable taking a row (dict);
//   checkpoint_dir: where to save the end of the run for state_dict() when the call gives no
//   --checkpoint-dir (not under MPI, --resume or a parameter server; "" for none); program: the
//   `meshtrain` program that measures the machine for the cost model when no machine file is
//   cached ("" for none).
py::dict train(const std::vector<std::string>& args, py::object on_step, const std::string& checkpoint_dir,
               const std::string& program) {
  struct State {
    std::vector<std::string> lines;
    std::string used_dir;
    bool own_dir = false;
    meshtrain::train::TrainResult result;
    bool have_result = false;
  };
  // One run at a time: the communication deadline and the machine file are process-wide, and a
  // run started from on_step would wait on the run that calls it.
  static std::atomic<bool> busy{false};
  if (busy.exchange(true))
    throw std::runtime_error("meshtrain.train: another run is in progress in this process (one at a time; from "
                             "on_step too); wait for it to return");
  struct Release {
    ~Release() { busy = false; }
  } release;
  auto st = std::make_shared<State>();
  auto raised = std::make_shared<Raised>();
  InProcessHooks hooks;
  hooks.install_stop_handlers = false;  // Python keeps its own SIGINT
  hooks.calibrate_program = program;
  const bool call = !on_step.is_none();
  // A handle, not an object: the hooks are copied and dropped inside the run, without the GIL;
  // `on_step` (this frame's argument) keeps the callable alive until train() returns.
  const py::handle callback = on_step;
  hooks.on_step = [st, raised, callback, call](const nlohmann::json& line) {
    st->lines.push_back(line.dump());  // world rank 0's thread only
    if (raised->interrupted) throw CallbackFailure();  // Ctrl-C: stop at this step's end
    if (!call) return;
    py::gil_scoped_acquire gil;
    try {
      callback(json_loads(st->lines.back()));
    } catch (py::error_already_set& e) {
      if (!raised->error) raised->error = std::make_unique<py::error_already_set>(std::move(e));
      throw CallbackFailure();
    }
  };
  hooks.before_train = [st, checkpoint_dir](meshtrain::train::TrainOptions& o) {
    if (o.checkpoint_dir.empty() && !checkpoint_dir.empty() && !o.resume && o.ps_servers == 0 &&
        o.backend != "mpi" && !meshtrain::comm::launched_by_mpirun()) {
      o.checkpoint_dir = checkpoint_dir;  // only the end of the run
      o.checkpoint_every = 0, o.checkpoint_every_s = 0;
      st->own_dir = true;
    }
    st->used_dir = o.checkpoint_dir;
  };
  hooks.on_result = [st](meshtrain::train::TrainResult&& r) {
    st->result = std::move(r);
    st->have_result = true;
  };
  // Ctrl-C stops a run of ranks as threads (not an MPI process: see run_released).
  bool mpi = meshtrain::comm::launched_by_mpirun();
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--backend" && args[i + 1] == "mpi") mpi = true;
  run_released(args, hooks, raised, /*quiet_stdout=*/false, /*interruptible=*/!mpi);
  py::dict out;
  py::list lines;
  for (const std::string& l : st->lines) lines.append(json_loads(l));
  out["metrics"] = lines;
  out["checkpoint_dir"] = st->used_dir;
  out["own_checkpoint_dir"] = st->own_dir;
  if (st->have_result) {
    const auto& r = st->result;
    out["model"] = r.model;
    out["start_step"] = r.start_step;
    out["steps_run"] = r.steps.size();
    out["stopped_by"] = r.stopped_by;
    out["wall_s"] = r.wall_s;
    out["final_val_loss"] = r.final_val_loss ? py::cast(*r.final_val_loss) : py::none();
    out["final_val_accuracy"] = r.final_val_accuracy ? py::cast(*r.final_val_accuracy) : py::none();
  }
  return out;
}

// plan(args) -> list of dicts: the ranked layouts of `meshtrain plan ...` (its table not printed).
py::list plan(const std::vector<std::string>& args) {
  auto rows = std::make_shared<std::vector<nlohmann::ordered_json>>();
  InProcessHooks hooks;
  hooks.on_plan_rows = [rows](std::vector<nlohmann::ordered_json>&& r) { *rows = std::move(r); };
  run_released(args, hooks, nullptr, /*quiet_stdout=*/true);
  py::list out;
  for (const nlohmann::ordered_json& r : *rows) out.append(json_loads(r.dump()));
  return out;
}

// show(args) -> str: what `meshtrain model show ...` prints.
std::string show(const std::vector<std::string>& args) {
  std::string text;
  {
    py::gil_scoped_release nogil;
    text = capture_stdout([&] { run_in_process(args, {}); });
  }
  return text;
}

// single_state(path) -> (step, cnn, [(name, numpy float32 array)]): a checkpoint's model as
// `checkpoint convert --to-single` writes it. path: a checkpoint directory (its newest step
// that verifies) or a step folder.
py::tuple single_state(const std::string& path) {
  using meshtrain::cli::SingleFileModel;
  SingleFileModel m;
  std::vector<meshtrain::Tensor> tensors;
  {
    py::gil_scoped_release nogil;
    try {
      m = meshtrain::cli::single_file_model(meshtrain::cli::tool_step_folder(path, "nothing to read"));
      for (const auto& [name, shape] : m.tensors) tensors.push_back(m.read(name));
    } catch (const meshtrain::train::CheckpointError& e) {
      throw meshtrain::cli::UsageError(e.what());
    }
  }
  py::module_ np = py::module_::import("numpy");
  py::list items;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const meshtrain::Tensor& t = tensors[i];
    std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
    py::array_t<float> a(shape);
    std::copy(t.data(), t.data() + t.numel(), a.mutable_data());
    items.append(py::make_tuple(m.tensors[i].first, a));
  }
  return py::make_tuple(m.step, m.cnn, m.model, items);
}

}  // namespace

PYBIND11_MODULE(_meshtrain, mod) {
  mod.doc() = "meshtrain's C++ half: the program's subcommands run in this process (see the meshtrain package)";
  // The program's exit-2 sentences (UsageError) as ValueError, with the sentence alone.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const meshtrain::cli::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  mod.def("options", &meshtrain::cli::command_options, py::arg("command"),
          "The options of a subcommand: (long name, is a flag) pairs");
  mod.def("train", &train, py::arg("args"), py::arg("on_step"), py::arg("checkpoint_dir"), py::arg("program"));
  mod.def("plan", &plan, py::arg("args"));
  mod.def("show", &show, py::arg("args"));
  mod.def("single_state", &single_state, py::arg("path"));
  mod.def("default_machine_path", &meshtrain::plan::default_machine_path);
  mod.def("have_mpi", &meshtrain::comm::have_mpi);
}
