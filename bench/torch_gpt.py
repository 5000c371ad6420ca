#!/usr/bin/env python3
"""PyTorch reference for meshtrain's training speed: the same GPT, trained the same way, on CPU.

The model is meshtrain's GPT-2: pre-LN blocks, LayerNorm (eps 1e-5, with bias), fused qkv
Linear(d, 3d) with bias, causal self-attention, output projection with bias, MLP d -> 4d -> d with
tanh-approximate GELU, learned position embedding, final LayerNorm, lm_head tied to the token
embedding, no dropout. Init normal(0, 0.02), residual projections 0.02/sqrt(2*layers), biases 0,
LN weight 1. AdamW(lr 1e-3, betas (0.9, 0.99), eps 1e-8, weight decay 0.1 on 2-D weights only),
global grad-norm clipping at 1.0.

Threads: --intra-threads calls torch.set_num_threads (ATen's OpenMP pool); --blas-threads sets
OPENBLAS_NUM_THREADS, which OpenBLAS reads only when it is loaded, so the script re-executes itself
with the variable set (passing OPENBLAS_NUM_THREADS in the environment does the same).

OpenBLAS kernels: Debian 12's OpenBLAS 0.3.21 does not know recent Xeons (e.g. model 207, Emerald
Rapids) and falls back to its SSE3 "Prescott" kernels, about 8x slower than its AVX-512 ones. Unless
told otherwise (--blas-core), the script then sets OPENBLAS_CORETYPE=SkylakeX (AVX2 only: Haswell)
the same way, so the reference runs at the speed this BLAS can reach on the machine.

Needs Debian's python3-torch (torch 1.13; `apt-get install -y python3-torch python3-numpy`), which
is not part of the project's set-up. Exit status 2 when torch is missing or the options are bad.

  bench/torch_gpt.py --model gpt-tiny --steps 20 --intra-threads 1 --blas-threads 2 --json
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

def config_of_file(path):
    """A named token model's shape from its file (models/*.json, the layer graph meshtrain reads):
    blocks, width and heads from its layers, the position table from wpe, batch and length."""
    g = json.load(open(path))
    layers = {l["name"]: l for l in g["layers"]}
    blocks = sum(1 for l in g["layers"] if l["op"] == "causal_self_attention")
    return dict(layers=blocks, d=layers["wte"]["embedding_dim"], heads=layers["h.0.attn"]["heads"],
                vocab=g["input"]["vocab"], batch=g.get("batch", 12), seq=g["input"]["tokens"],
                max_seq=layers["wpe"]["num_embeddings"])


MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
CONFIGS = {name: config_of_file(os.path.join(MODELS_DIR, name + ".json"))
           for name in ("gpt-tiny", "gpt-small", "gpt2-124m")}

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3-torch lives here, not in a pyenv python


def check_threads_and_data(p, a):
    """The option checks every PyTorch script shares: thread counts >= 1, --data a file."""
    for name in ("intra_threads", "blas_threads"):
        v = getattr(a, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.data is not None and not os.path.isfile(a.data):
        p.error(f"--data {a.data}: no such file")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-tiny", choices=sorted(CONFIGS))
    p.add_argument("--batch", type=int, default=None, help="default: the model's benchmark batch")
    p.add_argument("--seq", type=int, default=None, help="default: the model's benchmark length")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    p.add_argument("--data", default=None, help="text file (byte tokens); random tokens if absent")
    p.add_argument("--intra-threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--blas-threads", type=int, default=None, help="OPENBLAS_NUM_THREADS")
    p.add_argument("--blas-core", default="auto",
                   help="OPENBLAS_CORETYPE: 'auto' (default) sets it only when OpenBLAS falls back to "
                        "its generic SSE kernels on a CPU it does not know (AVX-512: SkylakeX, AVX2: "
                        "Haswell); 'none' leaves OpenBLAS's own choice; or a core name")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none",
                   help="bf16: forward (and so backward) under torch.autocast('cpu', dtype=torch.bfloat16), "
                        "PyTorch's mixed precision on CPU (float32 weights and optimizer)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop the timed steps once this much time has passed (at least one runs)")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    a = p.parse_args(argv)
    cfg = CONFIGS[a.model]
    a.batch = a.batch or cfg["batch"]
    a.seq = a.seq or cfg["seq"]
    if a.batch < 1 or a.seq < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--batch, --seq and --steps must be >= 1, --warmup >= 0")
    if a.seq > cfg["max_seq"]:
        p.error(f"--seq {a.seq} exceeds {a.model}'s context of {cfg['max_seq']}")
    check_threads_and_data(p, a)
    return a


def reexec_if_needed(args, script=__file__):
    """Re-executes `script` (this file, or torch_ddp.py / torch_tp.py, which share it) with
    OPENBLAS_NUM_THREADS set, or under the system python when torch is missing.

    Probes for torch without importing it, so OpenBLAS is loaded only once, with its final setting.
    """
    import importlib.util
    want = {}
    if args.blas_threads is not None:
        want["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
    core = blas_core_wanted(args.blas_core)
    if core:
        want["OPENBLAS_CORETYPE"] = core
    env = None
    if any(os.environ.get(k) != v for k, v in want.items()):
        env = dict(os.environ, **want)
    exe = sys.executable
    if importlib.util.find_spec("torch") is None:
        if (os.path.exists(SYSTEM_PYTHON) and os.path.realpath(exe) != os.path.realpath(SYSTEM_PYTHON)
                and not os.environ.get("TORCH_GPT_REEXEC")):
            env = dict(env or os.environ, TORCH_GPT_REEXEC="1")
            exe = SYSTEM_PYTHON
        else:
            sys.stderr.write(f"{os.path.basename(script)}: PyTorch is not installed (it is needed only for this "
                             "benchmark, not by meshtrain).\n"
                             "  Debian 12: apt-get install -y python3-torch python3-numpy\n")
            sys.exit(2)
    if env is not None:
        sys.stdout.flush()
        os.execve(exe, [exe, os.path.abspath(script)] + sys.argv[1:], env)


# OpenBLAS's generic x86-64 fallbacks (SSE only): what its DYNAMIC_ARCH build picks for a CPU model
# newer than the library, e.g. Debian 12's 0.3.21 on Emerald Rapids, at a fraction of the speed.
GENERIC_CORES = {"Prescott", "Core2", "Nehalem", "Katmai", "Coppermine", "Northwood", "Banias", "Atom"}


def openblas_corename():
    """The kernel set the process's OpenBLAS uses (loads libopenblas if needed), or None."""
    import ctypes
    import ctypes.util
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return None


def blas_core_wanted(mode):
    """The OPENBLAS_CORETYPE to run with, or None to leave the environment as it is."""
    if mode == "none":
        return None
    if mode != "auto":
        return mode
    if os.environ.get("OPENBLAS_CORETYPE"):
        return None  # the caller chose
    core = openblas_corename()  # this probe process only; the run itself re-executes
    if core not in GENERIC_CORES:
        return None
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= set(flags):
        return "SkylakeX"
    if {"avx2", "fma"} <= set(flags):
        return "Haswell"
    return None


def cpu_busy_seconds():
    """Busy CPU seconds of the whole machine so far (/proc/stat), or None where unavailable."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def loaded_blas():
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
        return sorted(os.path.basename(x) + " (" + os.path.dirname(x) + ")" for x in libs)
    except OSError:
        return []


def gpt_class(torch, nn, F):
    """The reference GPT module class (GPT-2 layout, tied head, meshtrain's initialisation). A
    function of the torch modules so that this file imports without torch (main() imports it after
    setting OpenBLAS's threads); torch_ddp.py and torch_tp.py build their models from it."""

    class CausalSelfAttention(nn.Module):
        def __init__(self, d, heads, max_seq):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d, bias=True)
            self.proj = nn.Linear(d, d, bias=True)
            self.proj.residual = True
            mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, max_seq, max_seq), persistent=False)
            self.sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0 only

        def forward(self, x):
            B, T, C = x.shape
            hd = C // self.heads
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, T, self.heads, hd).transpose(1, 2)
            k = k.view(B, T, self.heads, hd).transpose(1, 2)
            v = v.view(B, T, self.heads, hd).transpose(1, 2)
            if self.sdpa is not None:
                y = self.sdpa(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
                att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.proj(y)

    class MLP(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc = nn.Linear(d, 4 * d, bias=True)
            self.proj = nn.Linear(4 * d, d, bias=True)
            self.proj.residual = True

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, d, heads, max_seq):
            super().__init__()
            self.ln1 = nn.LayerNorm(d, eps=1e-5)
            self.attn = CausalSelfAttention(d, heads, max_seq)
            self.ln2 = nn.LayerNorm(d, eps=1e-5)
            self.mlp = MLP(d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, layers, d, heads, vocab, max_seq):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Embedding(max_seq, d)
            self.blocks = nn.ModuleList([Block(d, heads, max_seq) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d, eps=1e-5)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            resid_std = 0.02 / math.sqrt(2 * layers)
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    if m is self.lm_head:
                        continue  # shares wte's weight
                    nn.init.normal_(m.weight, 0.0, resid_std if getattr(m, "residual", False) else 0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight, 0.0, 0.02)
                elif isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)

        def forward(self, idx, targets):
            B, T = idx.shape
            pos = torch.arange(T, dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT


def adamw(torch, params):
    """The reference optimizer: AdamW, weight decay on the 2-D weights only."""
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.99), eps=1e-8)


def batcher(torch, data, vocab, B, T, gen, prog):
    """A function returning (inputs, targets) of B random windows of T+1 byte tokens of the file
    `data`, or of uniform random tokens when data is None; exits 2 when the file is too short."""
    if data is None:
        def batch():
            idx = torch.randint(0, vocab, (B, T + 1), generator=gen)
            return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
        return batch
    with open(data, "rb") as f:
        raw = f.read()
    if len(raw) < T + 2:
        sys.stderr.write(f"{prog}: --data {data} is shorter than seq+2 bytes\n")
        sys.exit(2)
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.long)

    def batch():
        starts = torch.randint(0, tokens.numel() - T - 1, (B,), generator=gen)
        idx = torch.stack([tokens[s:s + T + 1] for s in starts.tolist()])
        return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    return batch


def timing(times, tokens, losses, own, others):
    """The JSON fields every PyTorch script reports for its timed steps (seconds each): tokens/s
    of `tokens` per median step, the step-time statistics, the loss, and the CPU shares."""
    med, mean = statistics.median(times), statistics.fmean(times)
    return {
        "tokens_per_s": round(tokens / med, 1),
        "step_ms": {"median": round(med * 1e3, 3), "mean": round(mean * 1e3, 3),
                    "min": round(min(times) * 1e3, 3), "max": round(max(times) * 1e3, 3)},
        "loss": {"first": round(losses[0], 5), "last": round(losses[-1], 5)},
        "cpu_cores": {"own": round(own, 2), "others": None if others is None else round(others, 2)},
    }


def main(argv):
    args = parse_args(argv)
    reexec_if_needed(args)

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    cfg = CONFIGS[args.model]
    if args.intra_threads is not None:
        torch.set_num_threads(args.intra_threads)
    torch.manual_seed(args.seed)

    GPT = gpt_class(torch, nn, F)
    model = GPT(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["max_seq"])
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]  # tied weight appears once
    n_params = sum(p.numel() for p in params)
    opt = adamw(torch, params)

    B, T = args.batch, args.seq
    gen = torch.Generator().manual_seed(args.seed + 1)
    batch = batcher(torch, args.data, cfg["vocab"], B, T, gen, "torch_gpt.py")

    def forward(x, y):
        if args.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(x, y)
        return model(x, y)

    def step():
        x, y = batch()
        loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    intra = torch.get_num_threads()
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    if not args.quiet:
        print(f"torch {torch.__version__}: {args.model} ({n_params / 1e6:.2f}M params) B={B} T={T} "
              f"intra-op threads {intra}, OPENBLAS_NUM_THREADS={blas}, OpenBLAS core "
              f"{openblas_corename()}, "
              f"attention {'sdpa' if hasattr(F, 'scaled_dot_product_attention') else 'manual'}",
              flush=True)
    losses, times = [], []
    t_start = time.perf_counter()
    for i in range(args.warmup + args.steps):
        if times and args.max_seconds is not None and time.perf_counter() - t_start > args.max_seconds:
            break  # out of time: report the timed steps done so far
        if i == args.warmup:  # the timed region: own CPU and the whole machine's, to expose noise
            cpu0, busy0, wall0 = time.process_time(), cpu_busy_seconds(), time.perf_counter()
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        losses.append(loss)
        timed = i >= args.warmup
        if timed:
            times.append(dt)
        if not args.quiet:
            print(f"step {i:4d}{'' if timed else ' (warm-up)'}: loss {loss:.4f}  {dt * 1e3:8.1f} ms  "
                  f"{B * T / dt:9.0f} tok/s", flush=True)
    wall = time.perf_counter() - wall0
    own = (time.process_time() - cpu0) / wall
    busy1 = cpu_busy_seconds()
    others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) / wall - own)
    med = statistics.median(times)
    mean = statistics.fmean(times)
    result = {
        "impl": "pytorch", "autocast": args.autocast, "torch": torch.__version__, "model": args.model, "params": n_params,
        "batch": B, "seq": T, "steps": len(times), "warmup": args.warmup,
        "data": args.data or "random",
        "threads": {"intra_op": intra, "openblas": blas},
        # cpu_cores: cores this process kept busy, and cores other processes used, while timed
        **timing(times, B * T, losses, own, others),
        "blas_lib": loaded_blas(),
        "blas_core": openblas_corename(),
    }
    if not args.quiet:
        print(f"{args.model}: median {med * 1e3:.1f} ms/step (mean {mean * 1e3:.1f}), "
              f"{B * T / med:.0f} tokens/s; loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
              f"CPU cores: own {own:.2f}, others {others if others is None else round(others, 2)}",
              flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
