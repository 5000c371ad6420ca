#!/usr/bin/env python3
"""PyTorch against meshtrain's CNNs: parity from the same weights, and speed, in one script run.

--check (parity): meshtrain saves the step-0 weights of the model (--save-initial) and trains
--parity-steps steps with --data-order sequential (row i of step k is training image
(k*B + i) mod 60,000 in file order, no augmentation), SGD momentum 0.9, a constant learning rate
(--warmup 0, --min-lr = --lr), no clipping, one micro-batch, writing --metrics. `meshtrain
checkpoint convert --to-single` turns step 0 into a PyTorch state dict, which is read here with a
small safetensors parser (8-byte little-endian header length, JSON header, raw float32 data) into
the equivalent torch.nn model (same names: conv1.weight, bn1.running_mean, fc1.weight (out, in),
layer2.0.downsample.0.weight, ...). The same batches are replayed from the gzip IDX files,
normalised identically ((x/255 - 0.2860)/0.3530 in float32), with torch.optim.SGD(momentum=0.9),
and the per-step training losses are compared with PyTorch run in float64 (the exact answer to
round-off), as is in float32, and in float32 with its batch norms in float64 (the precision of
meshtrain's batch-norm sums). The check passes when meshtrain's largest relative difference
from float64 is within --tolerance (1e-4), or, where the training amplifies round-off past that
in 20 steps, no larger than PyTorch float32's own; otherwise it exits 1. Float32 PyTorch is not
the gate: its CPU batch norm (1.13) is off by up to 0.5% in its gradients here
(docs/benchmarks.md).

--speed: images/s of meshtrain (the median of its own metrics' images_per_s over the steps after
--warmup) against PyTorch (the same model, batch, optimizer and thread count, timed the same way:
batch gather, forward, backward, optimizer step), per model, with the ratio meshtrain / PyTorch.
The convolution share: meshtrain's, from its own --trace (the kernels track holds a span for
every convolution call: their milliseconds per step after --warmup, over the mean step of those
steps, in a second run with the trace on); PyTorch's from oneDNN's verbose log (ONEDNN_VERBOSE=1
prints every primitive execution with its time; torch 1.13 runs its convolutions on the same
library, its MKL-DNN path): the convolution primitives' milliseconds per step over the step time
of the same (verbose, hence a little slower) run.

--models also takes image layer-graph files (docs/models.md): each is built here as a
torch.nn.Module layer by layer under the graph's names (GraphModule), so a user's network is
checked against PyTorch the same way (a graph with dropout of p > 0 only for --speed: PyTorch
cannot replay its masks).

Threads: meshtrain runs one rank with --threads T; PyTorch gets torch.set_num_threads(T) and
OPENBLAS_NUM_THREADS=T (its linear layers go to OpenBLAS). The OpenBLAS core-type fallback of
bench/torch_gpt.py applies (--blas-core). Needs Debian's python3-torch (torch 1.13) and numpy;
exit status 2 when they are missing or the options are bad. Runs are short: on a loaded machine
compare the ratios, which come from runs made one after the other in this one script run.

  /usr/bin/python3 bench/torch_cnn.py --threads 2 --json
"""
import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402  (stdlib-only at import time; torch is imported later)

MODELS = ("cnn-small", "resnet-small")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN, STD = 0.2860, 0.3530  # data/images.h


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--meshtrain", default=os.path.join(REPO, "build", "meshtrain"))
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="directory of the four IDX files")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--check", action="store_true", help="parity only (default: parity and speed)")
    p.add_argument("--speed", action="store_true", help="speed only (default: parity and speed)")
    p.add_argument("--parity-steps", type=int, default=20)
    p.add_argument("--parity-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative loss difference allowed")
    p.add_argument("--batch", type=int, default=128, help="speed: batch size")
    p.add_argument("--steps", type=int, default=20, help="speed: timed steps")
    p.add_argument("--warmup", type=int, default=3, help="speed: untimed steps before them")
    p.add_argument("--threads", type=int, default=2, help="meshtrain --threads, torch.set_num_threads")
    p.add_argument("--no-conv-share", action="store_true", help="skip the traced and oneDNN-verbose runs")
    p.add_argument("--blas-core", default="auto", help="as bench/torch_gpt.py")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    a = p.parse_args(argv)
    a.models = [os.path.abspath(m) if m.endswith(".json") else m for m in a.models.split(",") if m]
    bad = [m for m in a.models if m not in MODELS and not m.endswith(".json")]
    if bad or not a.models:
        p.error(f"--models takes {', '.join(MODELS)} or image layer-graph files (.json); got {a.models}")
    for m in a.models:
        if m.endswith(".json"):
            if not os.path.isfile(m):
                p.error(f"--models {m}: no such file")
            g = json.load(open(m))
            drops = [l["name"] for l in g.get("layers", []) if l.get("op") == "dropout" and l.get("p", 0.5) > 0]
            if a.check or not a.speed:
                if drops:
                    p.error(f"--models {m}: dropout layer {drops[0]} draws masks PyTorch cannot replay; "
                            "set its p to 0 for the parity check, or give --speed")
    if min(a.parity_steps, a.parity_batch, a.batch, a.steps, a.threads) < 1 or a.warmup < 0:
        p.error("--parity-steps, --parity-batch, --batch, --steps and --threads must be >= 1, --warmup >= 0")
    if not os.path.isdir(a.data):
        p.error(f"--data {a.data}: no such directory (Debian's dataset-fashion-mnist installs it)")
    if not os.access(a.meshtrain, os.X_OK):
        p.error(f"--meshtrain {a.meshtrain}: not an executable (build the project first)")
    a.do_check = a.check or not a.speed
    a.do_speed = a.speed or not a.check
    a.blas_threads = a.threads  # what torch_gpt.reexec_if_needed reads
    return a


# ---- the data, read as meshtrain reads it ----

def read_idx(data_dir, name):
    import numpy as np
    for path in (os.path.join(data_dir, name), os.path.join(data_dir, name + ".gz")):
        if os.path.exists(path):
            with open(path, "rb") as f:
                raw = f.read()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            ndim = raw[3]
            dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    raise SystemExit(f"torch_cnn.py: {data_dir} has neither {name} nor {name}.gz")


def training_set(data_dir):
    """(images (n, 1, 28, 28) float32 normalised as data/images.h, labels (n,) int64)."""
    import numpy as np
    px = read_idx(data_dir, "train-images-idx3-ubyte")
    labels = read_idx(data_dir, "train-labels-idx1-ubyte").astype(np.int64)
    table = (np.arange(256, dtype=np.float32) / np.float32(255) - np.float32(MEAN)) / np.float32(STD)
    return table[px][:, None, :, :], labels


def sequential_rows(step, B, n):
    return [(step * B + i) % n for i in range(B)]


# ---- the models, as model/cnn.h builds them, under its parameter names ----

def model_class(torch, nn, name):
    def conv(i, o, k=3, s=1):
        return nn.Conv2d(i, o, k, stride=s, padding=k // 2, bias=False)

    class CnnSmall(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = conv(1, 32), nn.BatchNorm2d(32)
            self.conv2, self.bn2 = conv(32, 64), nn.BatchNorm2d(64)
            self.fc1, self.fc2 = nn.Linear(64 * 7 * 7, 128), nn.Linear(128, 10)

        def forward(self, x):
            F = nn.functional
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
            x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
            return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))

    class Basic(nn.Module):
        def __init__(self, i, o, s):
            super().__init__()
            self.conv1, self.bn1 = conv(i, o, 3, s), nn.BatchNorm2d(o)
            self.conv2, self.bn2 = conv(o, o), nn.BatchNorm2d(o)
            self.downsample = (nn.Sequential(nn.Conv2d(i, o, 1, stride=s, bias=False), nn.BatchNorm2d(o))
                               if s != 1 or i != o else None)

        def forward(self, x):
            F = nn.functional
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(y + (self.downsample(x) if self.downsample is not None else x))

    class ResnetSmall(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = conv(1, 32), nn.BatchNorm2d(32)
            self.layer1 = nn.Sequential(Basic(32, 32, 1))
            self.layer2 = nn.Sequential(Basic(32, 64, 2))
            self.layer3 = nn.Sequential(Basic(64, 128, 2))
            self.fc = nn.Linear(128, 10)

        def forward(self, x):
            F = nn.functional
            x = self.layer3(self.layer2(self.layer1(F.relu(self.bn1(self.conv1(x))))))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    if name.endswith(".json"):
        return lambda: GraphModule(torch, nn, json.load(open(name)))
    return {"cnn-small": CnnSmall, "resnet-small": ResnetSmall}[name]


def GraphModule(torch, nn, g):
    """An image layer graph (docs/models.md) as a torch.nn.Module: each layer a module under its
    own name (so "features.0" is submodule 0 of container "features", and the state-dict names
    are the graph's), run in the file's order, each reading the previous layer or its "from"."""
    F = nn.functional

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.plan = []  # (name, op, inputs, fn)
            shapes = {"input": tuple(g["input"]["image"])}
            prev = "input"
            for l in g["layers"]:
                name, op = l["name"], l["op"]
                src = l.get("from", prev)
                src = [src] if isinstance(src, str) else list(src)
                x = shapes[src[0]]
                mod, fn = None, None
                k, st, pad = l.get("kernel_size", 1), l.get("stride"), l.get("padding", 0)
                if op == "conv2d":
                    mod = nn.Conv2d(x[0], l["out_channels"], k, stride=st or 1, padding=pad, bias=l.get("bias", True))
                    y = (l["out_channels"], (x[1] + 2 * pad - k) // (st or 1) + 1, (x[2] + 2 * pad - k) // (st or 1) + 1)
                elif op == "batchnorm2d":
                    mod, y = nn.BatchNorm2d(x[0], eps=l.get("eps", 1e-5), momentum=l.get("momentum", 0.1)), x
                elif op == "linear":
                    mod, y = nn.Linear(x[0], l["out_features"], bias=l.get("bias", True)), (l["out_features"],)
                elif op == "layernorm":
                    mod, y = nn.LayerNorm(x[0], eps=l.get("eps", 1e-5)), x
                elif op in ("maxpool2d", "avgpool2d"):
                    st = st or k
                    y = (x[0], (x[1] + 2 * pad - k) // st + 1, (x[2] + 2 * pad - k) // st + 1)
                    fn = ((lambda t, k=k, st=st, pad=pad: F.max_pool2d(t, k, st, pad)) if op == "maxpool2d" else
                          (lambda t, k=k, st=st, pad=pad: F.avg_pool2d(t, k, st, pad, count_include_pad=True)))
                elif op == "relu":
                    fn, y = F.relu, x
                elif op == "gelu":
                    fn, y = (lambda t, a=l.get("approximate", "none"): F.gelu(t, approximate=a)), x
                elif op == "dropout":
                    fn, y = (lambda t: t), x  # p 0 only (parse_args refuses the rest for parity)
                elif op == "global_avgpool2d":
                    fn, y = (lambda t: F.adaptive_avg_pool2d(t, 1)), (x[0], 1, 1)
                elif op == "flatten":
                    fn, y = (lambda t: torch.flatten(t, 1)), (x[0] * x[1] * x[2],)
                elif op == "add":
                    y = x
                elif op == "concat":
                    y = (sum(shapes[s_][0] for s_ in src), x[1], x[2])
                else:
                    raise SystemExit(f"torch_cnn.py: layer {name}: op {op} has no PyTorch replay here")
                if mod is not None:
                    parent = self
                    *path, leaf = name.split(".")
                    for part in path:
                        if not hasattr(parent, part):
                            parent.add_module(part, nn.Module())
                        parent = getattr(parent, part)
                    parent.add_module(leaf, mod)
                    fn = None  # looked up by name when run: bn_in_float64 may have swapped it
                self.plan.append((name, op, src, fn))
                shapes[name] = y
                prev = name

        def forward(self, x):
            out = {"input": x}
            for name, op, src, fn in self.plan:
                ins = [out[s_] for s_ in src]
                if op == "add":
                    y = ins[0]
                    for t in ins[1:]:
                        y = y + t
                elif op == "concat":
                    y = torch.cat(ins, 1)
                else:
                    y = (fn or self.get_submodule(name))(ins[0])
                out[name] = y
            return out[self.plan[-1][0]]

    return Graph()


def read_safetensors(torch, path):
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"torch_cnn.py: {path}: tensor {name} is {t['dtype']}, expected F32")
        b, e = t["data_offsets"]
        arr = np.frombuffer(raw, dtype="<f4", count=(e - b) // 4, offset=8 + n + b).reshape(t["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


# ---- running meshtrain ----

def meshtrain(a, args, **kw):
    r = subprocess.run([a.meshtrain] + args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"torch_cnn.py: meshtrain {' '.join(args)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return r


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def sgd_flags(a):
    return ["--optimizer", "sgd", "--momentum", "0.9", "--lr", str(a.lr), "--min-lr", str(a.lr),
            "--warmup", "0", "--grad-clip", "0", "--microbatches", "1"]


# ---- parity ----

def parity(a, model, torch, nn, data, tmp):
    images, labels = data
    tag = os.path.basename(model)
    ck, out = os.path.join(tmp, f"ck-{tag}"), os.path.join(tmp, f"{tag}-parity.jsonl")
    meshtrain(a, ["train", "--model", model, "--data", a.data, "--data-order", "sequential",
                  "--batch", str(a.parity_batch), "--steps", str(a.parity_steps), "--threads", str(a.threads),
                  "--seed", str(a.seed), "--eval-every", "0", "--eval-batches", "1", "--quiet",
                  "--metrics", out, "--checkpoint-dir", ck, "--save-initial",
                  "--checkpoint-every", str(a.parity_steps)] + sgd_flags(a))
    st = os.path.join(tmp, f"{tag}-step0.safetensors")
    meshtrain(a, ["checkpoint", "convert", "--to-single", os.path.join(ck, "step_00000000"), st])
    state = read_safetensors(torch, st)
    theirs = [m["loss"] for m in metrics(out)]
    ref = {kind: replay(a, model, torch, nn, data, state, kind) for kind in ("float64", "float32", "float32-bn64")}

    def worst(ours):
        rel = [abs(m - t) / abs(t) for m, t in zip(theirs, ours)]
        return max(rel), rel.index(max(rel)) + 1

    d = {kind: worst(losses) for kind, losses in ref.items()}
    return {"model": model, "steps": a.parity_steps, "batch": a.parity_batch, "lr": a.lr,
            "meshtrain_loss": theirs, "torch_loss": ref,
            "max_rel_diff": d["float64"][0], "worst_step": d["float64"][1],
            "max_rel_diff_float32": d["float32"][0],
            "max_rel_diff_float32_bn64": d["float32-bn64"][0],
            "torch_float32_bn64_vs_float64": worst_between(ref["float32-bn64"], ref["float64"]),
            "torch_float32_vs_float64": worst_between(ref["float32"], ref["float64"]),
            # Within the tolerance of the exact answer, or (where 20 steps amplify round-off past it)
            # no farther from it than PyTorch's own float32 run is.
            "ok": len(theirs) == a.parity_steps and (
                d["float64"][0] <= a.tolerance or d["float64"][0] <= worst_between(ref["float32"], ref["float64"]))}


def worst_between(u, v):
    return max(abs(x - y) / abs(y) for x, y in zip(u, v))


def bn_in_float64(torch, nn, net):
    """Every BatchNorm2d of a float32 model runs in float64 (its input cast up, its output back
    down; its parameters and running statistics in float64): the precision in which meshtrain's
    batch-norm kernels accumulate, the rest of the model as PyTorch runs it in float32."""
    class Float64BatchNorm(nn.Module):
        def __init__(self, bn):
            super().__init__()
            self.bn = bn.to(torch.float64)

        def forward(self, x):
            return self.bn(x.to(torch.float64)).to(torch.float32)

    for parent in list(net.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, name, Float64BatchNorm(child))


def replay(a, model, torch, nn, data, state, kind):
    """The training losses of PyTorch's replay. kind: 'float64' (the whole model in double: the
    exact answer to round-off, the reference the check gates on) or 'float32' (PyTorch as is,
    whose CPU batch norm in 1.13 is off by up to 0.5% in its gradients at these sizes, where
    meshtrain's kernels accumulate in double; docs/benchmarks.md)."""
    images, labels = data
    net = model_class(torch, nn, model)()
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise SystemExit(f"torch_cnn.py: {model}: the checkpoint does not match the PyTorch model: "
                         f"missing {missing}, unexpected {unexpected}")
    dtype = torch.float64 if kind == "float64" else torch.float32
    net = net.to(dtype)
    if kind == "float32-bn64":
        bn_in_float64(torch, nn, net)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    losses = []
    for step in range(a.parity_steps):
        rows = sequential_rows(step, a.parity_batch, len(labels))
        x, y = torch.from_numpy(images[rows]).to(dtype), torch.from_numpy(labels[rows])
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---- speed ----

ONEDNN_LINE = re.compile(r"^(?:onednn|dnnl)_verbose,(?:\d+,)?exec,cpu,([a-z_]+),.*,([0-9.]+)\s*$")


def conv_ms(log, steps):
    """Convolution primitives' total time in a oneDNN verbose log, per step."""
    total = 0.0
    for line in log.splitlines():
        m = ONEDNN_LINE.match(line)
        if m and m.group(1) == "convolution":
            total += float(m.group(2))
    return total / steps


def trace_conv_ms(path, warmup, steps):
    """Rank 0's convolution time per step in a meshtrain --trace: its kernels-track spans (tid 2)
    after the end of the warmup-th step (its optimizer span), over `steps` steps."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 0]
    ends = sorted(e["ts"] + e["dur"] for e in events if e.get("cat") == "optimizer")
    start = ends[warmup - 1] if warmup > 0 else 0.0
    return sum(e["dur"] for e in events if e.get("tid") == 2 and e["ts"] >= start) / 1e3 / steps


def meshtrain_speed(a, model, tmp, traced=False):
    tag = os.path.basename(model)
    out = os.path.join(tmp, f"{tag}-speed{'-traced' if traced else ''}.jsonl")
    trace = os.path.join(tmp, f"{tag}-speed.trace.json")
    meshtrain(a, ["train", "--model", model, "--data", a.data, "--batch", str(a.batch),
                      "--steps", str(a.warmup + a.steps), "--threads", str(a.threads), "--seed", str(a.seed),
                      "--eval-every", "0", "--eval-batches", "1", "--quiet", "--overwrite", "--metrics", out]
                  + (["--trace", trace] if traced else []) + sgd_flags(a))
    m = metrics(out)[a.warmup:]
    res = {"images_per_s": statistics.median(x["images_per_s"] for x in m),
           "step_ms": statistics.median(x["step_ms"] for x in m)}
    if traced:
        res["conv_ms_per_step"] = trace_conv_ms(trace, a.warmup, a.steps)
        res["traced_step_ms"] = statistics.mean(x["step_ms"] for x in m)
    return res


def torch_speed(a, model, torch, nn, data, verbose_share=False):
    images, labels = data
    torch.manual_seed(a.seed)
    net = model_class(torch, nn, model)()
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    X, Y = torch.from_numpy(images), torch.from_numpy(labels)
    g = torch.Generator().manual_seed(a.seed)
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        idx = torch.randint(0, len(Y), (a.batch,), generator=g)
        x, y = X[idx], Y[idx]
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    t = times[a.warmup:]
    return {"images_per_s": statistics.median(a.batch / s for s in t), "step_ms": statistics.median(t) * 1e3,
            "all_step_ms": [s * 1e3 for s in times]}


def torch_conv_share(a, model, tmp):
    """PyTorch's convolution time from oneDNN's verbose log: a child process (the variable is read
    when the library loads), which reruns this script's timing loop for one model."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1", TORCH_CNN_CHILD=model)
    r = subprocess.run([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env,
                       capture_output=True, text=True)
    res = None
    for line in r.stdout.splitlines():
        if line.startswith("TORCH_CNN_CHILD "):
            res = json.loads(line.split(" ", 1)[1])
    if res is None:
        return None
    steps = a.warmup + a.steps
    return {"conv_ms_per_step": conv_ms(r.stdout, steps), "verbose_step_ms": statistics.mean(res["all_step_ms"])}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def main():
    a = parse_args(sys.argv[1:])
    torch_gpt.reexec_if_needed(a, __file__)
    try:
        import numpy  # noqa: F401
        import torch
        import torch.nn as nn
    except ImportError as e:
        sys.stderr.write(f"torch_cnn.py: {e}; Debian 12: apt-get install -y python3-torch python3-numpy\n")
        sys.exit(2)
    torch.set_num_threads(a.threads)
    data = training_set(a.data)
    child = os.environ.get("TORCH_CNN_CHILD")
    if child:  # the oneDNN-verbose rerun of torch_speed (torch_conv_share)
        print("TORCH_CNN_CHILD " + json.dumps(torch_speed(a, child, torch, nn, data)), flush=True)
        return 0
    report = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": a.threads, "torch": torch.__version__,
              "openblas_core": torch_gpt.openblas_corename(), "blas": torch_gpt.loaded_blas(),
              "onednn_conv": torch.backends.mkldnn.is_available()}
    print(f"CPU {report['cpu']} ({report['cores']} cores); threads {a.threads}; torch {torch.__version__}; "
          f"OpenBLAS core {report['openblas_core']}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="torch_cnn.") as tmp:
        if a.do_check:
            report["parity"] = []
            for model in a.models:
                r = parity(a, model, torch, nn, data, tmp)
                report["parity"].append(r)
                failed |= not r["ok"]
                print(f"parity {model}: {r['steps']} steps of SGD momentum 0.9 at B={r['batch']}, lr {r['lr']}: "
                      f"max relative loss difference {r['max_rel_diff']:.2e} against torch float64 "
                      f"(step {r['worst_step']}; losses {r['meshtrain_loss'][0]:.6f} -> "
                      f"{r['meshtrain_loss'][-1]:.6f}) {'ok' if r['ok'] else 'FAILED'}; "
                      f"against torch float32 {r['max_rel_diff_float32']:.2e} "
                      f"(torch float32 against float64: {r['torch_float32_vs_float64']:.2e}); "
                      f"against torch float32 with its batch norms in float64 "
                      f"{r['max_rel_diff_float32_bn64']:.2e} (it against float64: "
                      f"{r['torch_float32_bn64_vs_float64']:.2e})")
        if a.do_speed:
            report["speed"] = []
            busy0, t0 = torch_gpt.cpu_busy_seconds(), time.time()
            for model in a.models:
                m = meshtrain_speed(a, model, tmp)
                t = torch_speed(a, model, torch, nn, data)
                t.pop("all_step_ms")
                r = {"model": model, "batch": a.batch, "meshtrain": m, "torch": t,
                     "ratio": m["images_per_s"] / t["images_per_s"]}
                if not a.no_conv_share:
                    mv = meshtrain_speed(a, model, tmp, traced=True)
                    tv = torch_conv_share(a, model, tmp)
                    r["conv_share"] = {"meshtrain": mv["conv_ms_per_step"] / mv["traced_step_ms"],
                                       "meshtrain_conv_ms": mv["conv_ms_per_step"]}
                    if tv:
                        r["conv_share"]["torch"] = tv["conv_ms_per_step"] / tv["verbose_step_ms"]
                        r["conv_share"]["torch_conv_ms"] = tv["conv_ms_per_step"]
                report["speed"].append(r)
                line = (f"speed {model} B={a.batch} threads {a.threads}: meshtrain {m['images_per_s']:.0f} img/s "
                        f"({m['step_ms']:.1f} ms), torch {t['images_per_s']:.0f} img/s ({t['step_ms']:.1f} ms): "
                        f"ratio {r['ratio']:.2f}x")
                if "conv_share" in r:
                    c = r["conv_share"]
                    line += (f"; convolutions {c['meshtrain_conv_ms']:.1f} ms/step = {100 * c['meshtrain']:.0f}% "
                             f"of meshtrain's step")
                    if "torch" in c:
                        line += f", {c['torch_conv_ms']:.1f} ms/step = {100 * c['torch']:.0f}% of torch's"
                print(line, flush=True)
            busy1 = torch_gpt.cpu_busy_seconds()
            if busy0 is not None and busy1 is not None:
                report["machine_busy_cores"] = (busy1 - busy0) / max(time.time() - t0, 1e-9)
                print(f"machine load during the speed runs: {report['machine_busy_cores']:.2f} busy cores "
                      f"of {report['cores']} (this script's runs use {a.threads})")
    if a.json:
        print(json.dumps(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
