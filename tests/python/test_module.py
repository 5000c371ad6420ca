"""The Python module against the program (docs/python.md): a graph built with meshtrain.Builder,
trained at dp 2 x pp 2 (2 micro-batches) from Python and by `meshtrain train` with the same
options, must give identical losses (exact equality of the metrics rows) and identical weights
(run.state_dict() against `meshtrain checkpoint convert --to-single`, read here as safetensors);
a bad value raises ValueError with the program's own sentence; an unknown keyword raises
TypeError; on_step gets one dict per step, and what it raises comes back out of train().

Usage: test_module.py BUILD_DIR SOURCE_DIR (PYTHONPATH must hold BUILD_DIR/python).
Exit 77 (ctest's skip) when the module was not built or NumPy is absent, with a note saying which.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


try:
    import numpy as np
except ImportError:
    skip(f"NumPy is not installed for {sys.executable} (Debian: python3-numpy)")
try:
    import meshtrain
    from meshtrain import _meshtrain  # noqa: F401  (the extension, not only the package)
except ImportError as e:
    skip(f"the meshtrain module is not built ({e}); CMake builds it when pybind11-dev and python3-dev are installed")

BUILD, SOURCE = sys.argv[1], sys.argv[2]
PROGRAM = os.path.join(BUILD, "meshtrain")
MACHINE = os.path.join(SOURCE, "examples", "clusters", "this-machine.machine.json")
STEPS = 3


def read_safetensors(path):
    """name -> float32 array: 8-byte little-endian header length, the JSON header, the data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        begin, end = t["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(t["shape"])
    return out


def cli(*args, check=True):
    r = subprocess.run([PROGRAM, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"meshtrain {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def model():
    return (meshtrain.Builder("py-net", image=(1, 28, 28), classes=10, batch=16)
            .conv2d("features.0", out_channels=4, kernel_size=3, padding=1)
            .batchnorm2d("features.1")
            .relu("features.2")
            .maxpool2d("features.3", kernel_size=2)
            .flatten("flat")
            .linear("classifier", out_features=10))


# The run both sides make, as keyword arguments and as flags.
OPTIONS = dict(data="fashion-mnist", steps=STEPS, dp=2, pp=2, microbatches=2, batch=16, data_order="sequential",
               seed=7, lr=0.01, threads=1, eval_every=0, eval_batches=1, machine=MACHINE, quiet=True)


def as_flags(options):
    words = []
    for k, v in options.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            words.append(flag)
        else:
            words += [flag, str(v)]
    return words


def check_parity(tmp):
    builder = model()
    rows = []
    run = meshtrain.train(builder.build(), on_step=rows.append, **OPTIONS)
    assert len(rows) == STEPS and all(isinstance(r, dict) for r in rows), rows
    assert [r["step"] for r in run.metrics] == list(range(1, STEPS + 1)), run.metrics
    assert [r["loss"] for r in rows] == run.losses

    # The program, with the same graph as a file.
    path = os.path.join(tmp, "py-net.json")
    with open(path, "w") as f:
        json.dump(builder.to_dict(), f)
    metrics, ckpt, single = (os.path.join(tmp, n) for n in ("m.jsonl", "ckpt", "single.safetensors"))
    cli("train", "--model", path, *as_flags(OPTIONS), "--metrics", metrics, "--checkpoint-dir", ckpt)
    with open(metrics) as f:
        cli_rows = [json.loads(line) for line in f]
    assert [r["loss"] for r in cli_rows] == run.losses, (run.losses, [r["loss"] for r in cli_rows])
    print("losses (identical):", run.losses)

    cli("checkpoint", "convert", "--to-single", ckpt, single)
    want = read_safetensors(single)
    got = run.state_dict()
    extra = sorted(set(got) - set(want))
    assert extra == ["features.1.num_batches_tracked"], extra
    assert got["features.1.num_batches_tracked"].dtype == np.int64
    assert int(got["features.1.num_batches_tracked"]) == STEPS
    for name, a in want.items():
        assert got[name].shape == a.shape and got[name].dtype == np.float32, (name, got[name].shape, a.shape)
        assert np.array_equal(got[name], a), f"{name} differs from checkpoint convert's"
    assert got["classifier.weight"].shape == (10, 4 * 14 * 14)
    assert list(got)[:5] == ["features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
                             "features.1.running_mean"], list(got)
    print(f"state dict equals checkpoint convert's: {len(want)} tensors + num_batches_tracked")
    check_torch_loads(got)

    # model show: the program's text.
    assert builder.build().show() == cli("model", "show", path).stdout
    assert builder.build().show(pp=2) == cli("model", "show", path, "--pp", "2").stdout
    return path


def check_torch_loads(state):
    """The same network written in PyTorch takes the state dict with strict=True (when PyTorch is here)."""
    try:
        import torch
    except ImportError:
        print("PyTorch is absent: load_state_dict not checked (Debian: python3-torch)")
        return

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                                torch.nn.ReLU(), torch.nn.MaxPool2d(2))
            self.flat = torch.nn.Flatten()
            self.classifier = torch.nn.Linear(4 * 14 * 14, 10)

    net = Net()
    assert list(net.state_dict()) == list(state), (list(net.state_dict()), list(state))
    net.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    assert int(net.features[1].num_batches_tracked) == STEPS
    print("PyTorch: load_state_dict(strict=True) takes it, in the module's own order")


def check_refusals(path):
    m = meshtrain.Model.from_file(path)
    for kwargs, flags in [({"dp": 0}, ["--dp", "0"]), ({"optimizer": "foo"}, ["--optimizer", "foo"]),
                          ({"zero": 1}, ["--zero", "1"]), ({"lr": "abc"}, ["--lr", "abc"])]:
        r = cli("train", "--model", path, "--data", "fashion-mnist", "--steps", "1", *flags, check=False)
        assert r.returncode == 2, (flags, r.returncode, r.stderr)
        sentence = r.stderr.strip()
        assert sentence.startswith("meshtrain: "), sentence
        sentence = sentence[len("meshtrain: "):]
        try:
            meshtrain.train(m, data="fashion-mnist", steps=1, **kwargs)
        except ValueError as e:
            assert str(e) == sentence, (str(e), sentence)
        else:
            raise AssertionError(f"{kwargs} was not refused")
        print(f"{kwargs}: ValueError {sentence!r}")
    try:
        meshtrain.train(m, data="fashion-mnist", steps=1, no_such_option=3)
    except TypeError as e:
        assert "no_such_option" in str(e) and "--no-such-option" in str(e), str(e)
        print(f"unknown keyword: TypeError {e}")
    else:
        raise AssertionError("an unknown keyword was accepted")


class Stop(Exception):
    pass


def check_callback_error(path):
    seen = []

    def on_step(row):
        seen.append(row["step"])
        if len(seen) == 2:
            raise Stop("enough")

    try:
        meshtrain.train(meshtrain.Model.from_file(path), on_step=on_step, **dict(OPTIONS, steps=5))
    except Stop as e:
        assert str(e) == "enough"
    else:
        raise AssertionError("the exception on_step raised did not come out of train()")
    assert len(seen) == 2, seen
    # A run started from on_step is refused (one run at a time), and the refusal comes out as raised.
    def nested(row):
        meshtrain.train(meshtrain.Model.from_file(path), **dict(OPTIONS, steps=1))

    try:
        meshtrain.train(meshtrain.Model.from_file(path), on_step=nested, **dict(OPTIONS, steps=2))
    except RuntimeError as e:
        assert "another run is in progress" in str(e), str(e)
    else:
        raise AssertionError("a run inside a run was not refused")
    # The process trains again afterwards.
    run = meshtrain.train(meshtrain.Model.from_file(path), **dict(OPTIONS, steps=1))
    assert len(run.metrics) == 1
    print("on_step's exception raised again by train(), after", len(seen), "steps")


def check_interrupt(path):
    """Ctrl-C (SIGINT) during a run: KeyboardInterrupt out of train() at the end of the step in
    flight, long before the run would end. The signal is sent as step 3 ends."""
    import signal
    import time

    steps = []

    def on_step(row):
        steps.append(row["step"])
        if row["step"] == 3:
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own handler, even where the parent ignores SIGINT (a background job's does).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.time()
    try:
        meshtrain.train(meshtrain.Model.from_file(path), on_step=on_step, **dict(OPTIONS, steps=100000))
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("Ctrl-C did not stop the run")
    finally:
        signal.signal(signal.SIGINT, previous)
    took = time.time() - start
    assert 3 <= len(steps) < 100000 and took < 60, (len(steps), took)
    print(f"Ctrl-C: KeyboardInterrupt after {len(steps)} steps, {took:.1f} s")


def check_plan(path):
    rows = meshtrain.plan(path, cluster=os.path.join(SOURCE, "examples", "clusters", "this-machine.json"),
                          global_batch=16, top=3)
    assert 1 <= len(rows) <= 3 and rows[0]["rank"] == 1, rows
    out = cli("plan", "--model", path, "--cluster", os.path.join(SOURCE, "examples", "clusters", "this-machine.json"),
              "--global-batch", "16", "--top", "3").stdout
    for r in rows:
        assert r["layout"] in out, (r["layout"], out)
    print("plan:", [r["layout"] for r in rows])
    # --goodput: one row per batch 16, 32, 64, their efficiency (N + 16) / (N + B) by hand, the
    # best the largest goodput and ranked first.
    rows = meshtrain.plan(path, cluster=os.path.join(SOURCE, "examples", "clusters", "this-machine.json"),
                          global_batch=16, goodput=True, noise_scale=40, max_batch=64)
    assert [r["batch"] for r in rows] == [16, 32, 64], rows
    for r in rows:
        e = (40 + 16) / (40 + r["batch"])
        assert abs(r["stat_efficiency"] - e) < 1e-12 and abs(r["goodput"] - r["samples_per_s"] * e) < 1e-6 * r["goodput"], r
    best = max(rows, key=lambda r: r["goodput"])
    assert best["best"] and best["rank"] == 1 and sum(r["best"] for r in rows) == 1, rows
    assert sorted(r["rank"] for r in rows) == [1, 2, 3], rows
    print("plan --goodput:", [(r["batch"], round(r["goodput"], 1)) for r in rows])


def check_builder():
    """The builder makes the graph of a model file: examples/models/vgg-mini.json, call for call."""
    built = (meshtrain.Builder("vgg-mini", image=(1, 28, 28), classes=10)
             .conv2d("features.0", out_channels=32, kernel_size=3, padding=1)
             .batchnorm2d("features.1")
             .relu("features.2")
             .maxpool2d("features.3", kernel_size=2)
             .conv2d("skip", out_channels=32, kernel_size=1, bias=False, from_="features.3")
             .add("sum", from_=["features.3", "skip"])
             .flatten("flat")
             .linear("classifier.0", out_features=10)
             .build())
    from_file = meshtrain.Model.from_file(os.path.join(SOURCE, "examples", "models", "vgg-mini.json"))
    assert built.show(tp=2) == from_file.show(tp=2)
    assert built.show(pp=2) == from_file.show(pp=2)
    print("builder: vgg-mini's layer table, as its file gives it")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        path = check_parity(tmp)
        check_refusals(path)
        check_callback_error(path)
        check_interrupt(path)
        check_plan(path)
        check_builder()
    print("PYTHON MODULE OK")


if __name__ == "__main__":
    main()
