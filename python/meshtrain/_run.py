"""train(), its Run, and plan(): `meshtrain train` and `meshtrain plan` called from Python."""

import collections
import os
import tempfile

from . import _cli
from ._model import as_model


class Run:
    """The result of train(): the rows of its steps and its final weights.

    metrics: one dict per step, the fields of the metrics file (`--metrics`), in step order
        (world rank 0's; an empty list on the other processes of an MPI job).
    losses: [row["loss"] for row in metrics].
    model: the model's name. steps_run: the steps this call ran (after a resume, from there).
    final_val_loss, final_val_accuracy: the last evaluation (None when there was none).
    stopped_by: 0, or the signal that stopped the run early.
    checkpoint_dir: the run's checkpoint directory (checkpoint_dir=..., or the temporary one
        state_dict() reads; None when there is neither).
    """

    def __init__(self, result, tmp):
        self._tmp = tmp  # the temporary checkpoint directory lives as long as the Run
        own = result["own_checkpoint_dir"]
        rows = result["metrics"]
        if own:  # the save meshtrain.train added for state_dict() is not the user's
            for row in rows:
                row.pop("checkpoint", None)
        self.metrics = rows
        self.checkpoint_dir = result["checkpoint_dir"] or None
        self.model = result.get("model")
        self.steps_run = result.get("steps_run", 0)
        self.start_step = result.get("start_step", 0)
        self.stopped_by = result.get("stopped_by", 0)
        self.wall_s = result.get("wall_s", 0.0)
        self.final_val_loss = result.get("final_val_loss")
        self.final_val_accuracy = result.get("final_val_accuracy")

    @property
    def losses(self):
        return [row["loss"] for row in self.metrics]

    def state_dict(self):
        """The final weights as an ordered dict name -> numpy array: what `meshtrain checkpoint
        convert --to-single` writes, under PyTorch's state-dict names and layouts (an image
        model's linear weights (out, in), batch-norm running_mean and running_var, and
        num_batches_tracked as an int64 0-d array, the steps trained; a token model under
        GPT-2's names). Read from the run's checkpoint directory (its newest step)."""
        if self.checkpoint_dir is None:
            raise RuntimeError("this run saved no checkpoint to read its weights from: under MPI, with --resume or "
                               "with a parameter server, give train() checkpoint_dir=DIR (a directory every "
                               "process sees)")
        return load_state_dict(self.checkpoint_dir)

    def __repr__(self):
        last = f", loss {self.metrics[-1]['loss']:.4f}" if self.metrics else ""
        return f"<meshtrain.Run {self.model}: {len(self.metrics)} steps{last}>"


def load_state_dict(path):
    """A checkpoint's model (a checkpoint directory's newest step, or one step folder) as
    Run.state_dict() gives it."""
    import numpy as np

    step, cnn, _, items = _cli.native().single_state(os.fspath(path))
    if not cnn:
        return collections.OrderedDict(items)
    # PyTorch's order: module by module (in the order of their first tensor), each module's
    # parameters, then its buffers, then a batch norm's num_batches_tracked.
    modules = collections.OrderedDict()
    for name, array in items:
        prefix = name.rsplit(".", 1)[0]
        modules.setdefault(prefix, []).append((name, array))
    out = collections.OrderedDict()
    for prefix, entries in modules.items():
        for name, array in entries:
            out[name] = array
        if any(n.endswith(".running_var") for n, _ in entries):
            out[prefix + ".num_batches_tracked"] = np.array(step, dtype=np.int64)
    return out


def train(model, *, on_step=None, **options):
    """Trains `model` as `meshtrain train --model MODEL ...` would, in this process.

    model: a Model, a dict (a layer graph), a named model or a model file's path.
    on_step: None, or a callable taking each step's row (a dict, the metrics line) on world
        rank 0 as the step ends; an exception it raises stops the run and is raised again here.
    options: every option of `meshtrain train` under its name with dashes as underscores
        (data, steps, dp, tp, pp, microbatches, schedule, zero, optimizer, lr, batch,
        data_order, exact_sums, checkpoint_dir, metrics, quiet, ...); flags as True/False.
        A value the program refuses raises ValueError with its sentence; an unknown keyword
        raises TypeError.
    Returns a Run.
    """
    if on_step is not None and not callable(on_step):
        raise TypeError(f"train(): on_step must be callable, not {type(on_step).__name__}")
    m = as_model(model) if model is not None else None  # None: the program's default (or config=FILE)
    flags = _cli.flags("train", options, "train")
    tmp = tempfile.TemporaryDirectory(prefix="meshtrain-run-")
    ckpt = os.path.join(tmp.name, "checkpoint")  # made by the run, when it saves there
    try:
        if m is None:
            result = _cli.native().train(["train"] + flags, on_step, ckpt, _cli.program())
        else:
            with m.argument() as arg:
                result = _cli.native().train(["train", "--model", arg] + flags, on_step, ckpt, _cli.program())
    except BaseException:
        tmp.cleanup()
        raise
    if not result["own_checkpoint_dir"]:
        tmp.cleanup()
        tmp = None
    return Run(result, tmp)


def plan(model, *, ranks=None, **options):
    """The layouts of `model` ranked by predicted step time, as `meshtrain plan` prints them, as
    a list of dicts (rank, layout, dp, tp, pp, microbatches, schedule, zero, recompute, step_s,
    tokens_per_s, samples_per_s, mfu, peak_bytes, bubble, comm_share, train_flags, ...).

    ranks: plan for this many of the machine's devices (plan's --devices).
    options: every option of `meshtrain plan` (global_batch, machine, cluster, seq, top,
        optimizer, layout, oversubscribe, svg, ...). Without machine= or cluster=, the machine
        file `meshtrain train` caches (meshtrain calibrate) is used when there is one.
    """
    m = as_model(model)
    if ranks is not None:
        options["devices"] = ranks
    if options.get("machine") is None and options.get("cluster") is None:
        cached = _cli.native().default_machine_path()
        if cached and os.path.isfile(cached):
            options["machine"] = cached
    flags = _cli.flags("plan", options, "plan")
    with m.argument() as arg:
        return _cli.native().plan(["plan", "--model", arg] + flags)
