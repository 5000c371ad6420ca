#!/usr/bin/env python3
"""PyTorch tensor-parallel reference for meshtrain's --tp: Megatron-LM-style GPT, gloo, CPU.

Debian 12's torch 1.13 has no torch.distributed.tensor.parallel, and its torch.distributed._shard
fails to import under Python 3.11, so PyTorch's own TP API is unusable here. The peer is therefore
written as Megatron-LM itself is, in plain PyTorch over a gloo process group (loopback only,
tcp://127.0.0.1:<free port>, one process per tp rank):
  - copy_to_tp: identity forward, all-reduce of the input gradient backward (Megatron's f);
    reduce_from_tp: all-reduce forward, identity backward (Megatron's g). Both all-reduce in place.
  - ColumnParallelLinear: weight split on output features, copy_to_tp on its input, no
    communication in forward. RowParallelLinear: weight split on input features, reduce_from_tp on
    the product, bias (replicated) added after the reduce.
  - Attention split by heads: the fused qkv projection is column-split so that a rank holds whole
    heads (its q, k and v rows for heads [r H/P, (r+1) H/P)), attends locally, and the output
    projection is row-parallel. MLP: fc column-parallel, GELU, proj row-parallel.
  - So per block 2 all-reduces forward and 2 backward, of B*T*d floats each; plus one scalar
    all-reduce per step for the global gradient norm.
  - Replicated on every rank (not split): token and position embeddings, the layernorms, the
    row-parallel biases and the tied lm-head with its cross-entropy (vocab 256 for gpt-tiny and
    gpt-small; meshtrain splits the head over the vocabulary, this peer does not). Their gradients
    are the same on every rank, since what flows into them has been all-reduced.
Every rank gets the same batch (tensor parallelism does not split it). Each step (forward,
backward, clipping, AdamW) is timed on every rank; a step's time is the slowest rank's and
tokens/s = B*T / median step time after --warmup untimed steps.

Model, initialisation, AdamW (lr 1e-3, betas (0.9, 0.99), eps 1e-8, decay 0.1 on 2-D weights) and
clipping (global norm 1.0) are bench/torch_gpt.py's. Every rank builds torch_gpt.py's full model
from the common --seed (its class, torch_gpt.gpt_class) and keeps its slice, so every
layout starts from the same weights; the global norm sums the split parameters' squared norms over
the ranks and counts the replicated ones once. With --tp 1 the same code runs without a process
group (the all-reduces are skipped): the single-process reference of this script.

Communication: every all-reduce is timed on its rank (wall time inside dist.all_reduce, which
includes waiting for the other ranks to arrive, not only the transfer). comm_ms is rank 0's median
per timed step, comm_share that over the median step time: the communication share to set beside
meshtrain's trace figure ("tp communication ... of its compute-track time").

--check trains --tp 1 and --tp P for --steps steps (default 5, no warm-up) from the same seed, in
two runs of this script, prints both loss lists (and both lists of global gradient norms) and exits
1 unless every loss and every norm agree within 1e-4 relative and the replicated parameters ended
equal on all ranks.

Threads: --intra-threads (torch.set_num_threads, per process) and --blas-threads
(OPENBLAS_NUM_THREADS, per process; the script re-executes itself with it set, and with
OPENBLAS_CORETYPE where torch_gpt.py would set it). Default with --tp >= 2: 1 and 1.

  bench/torch_tp.py --model gpt-small --tp 2 --steps 10 --json
  bench/torch_tp.py --model gpt-small --tp 1 --intra-threads 2 --blas-threads 2 --steps 10 --json
  bench/torch_tp.py --model gpt-tiny --tp 2 --batch 2 --seq 32 --check

Exit status 2 when torch is missing or the options are bad; 1 when --check finds a difference.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402  (stdlib-only at import time; torch is imported later)
import torch_ddp  # noqa: E402  (likewise: its config loader, free port and torch_gpt's model class)

CHECK_RTOL = 1e-4


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model", default=None, choices=sorted(torch_gpt.CONFIGS))
    g.add_argument("--config", default=None, help="meshtrain model config JSON (as --config there)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel processes (1: no group)")
    p.add_argument("--batch", type=int, default=None, help="batch, the same on every rank "
                                                           "(default: the model's)")
    p.add_argument("--seq", type=int, default=None, help="default: the model's benchmark length")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; 5 with --check)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    p.add_argument("--data", default=None, help="text file (byte tokens); random tokens if absent")
    p.add_argument("--intra-threads", type=int, default=None,
                   help="torch.set_num_threads per process (default: 1 when --tp >= 2)")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="OPENBLAS_NUM_THREADS per process (default: 1 when --tp >= 2)")
    p.add_argument("--blas-core", default="auto", help="as torch_gpt.py's --blas-core")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop the timed steps once this much time has passed (at least one runs)")
    p.add_argument("--check", action="store_true",
                   help="train --tp 1 and --tp P from the same seed for --steps steps and compare "
                        "the losses (exit 1 if they differ by more than 1e-4 relative)")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    a = p.parse_args(argv)
    if a.config:
        if not os.path.isfile(a.config):
            p.error(f"--config {a.config}: no such file")
        try:
            a.name, a.cfg = torch_ddp.load_config(a.config)
        except (ValueError, KeyError) as e:
            p.error(f"--config {a.config}: {e!r}")
    else:
        a.name = a.model or "gpt-tiny"
        a.cfg = torch_gpt.CONFIGS[a.name]
    a.batch = a.batch or a.cfg["batch"]
    a.seq = a.seq or a.cfg["seq"]
    a.steps = a.steps if a.steps is not None else (5 if a.check else 20)
    if a.tp < 1 or a.batch < 1 or a.seq < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--tp, --batch, --seq and --steps must be >= 1, --warmup >= 0")
    if a.seq > a.cfg["max_seq"]:
        p.error(f"--seq {a.seq} exceeds {a.name}'s context of {a.cfg['max_seq']}")
    d, heads = a.cfg["d"], a.cfg["heads"]
    for what, n in (("heads", heads), ("d", d), ("4d", 4 * d)):
        if n % a.tp:
            p.error(f"--tp {a.tp} does not divide {a.name}'s {what} = {n}: every rank must hold "
                    f"whole heads and equal slices of d and 4d")
    if a.tp >= 2:
        a.intra_threads = 1 if a.intra_threads is None else a.intra_threads
        a.blas_threads = 1 if a.blas_threads is None else a.blas_threads
    torch_gpt.check_threads_and_data(p, a)
    return a


class Comm:
    """The tp group's all-reduce (sum, in place), timed; a no-op without a group (--tp 1)."""

    def __init__(self, dist, world):
        self.dist, self.world = dist, world
        self.seconds, self.calls, self.elems = 0.0, 0, 0

    def all_reduce(self, t):
        if self.world == 1:
            return t
        t0 = time.perf_counter()
        self.dist.all_reduce(t)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.elems += t.numel()
        return t

    def reset(self):
        self.seconds, self.calls, self.elems = 0.0, 0, 0


def tp_gpt(torch, nn, F, cfg, world, rank, comm):
    """The tensor-parallel GPT for rank `rank` of `world` (uninitialised: see load_from)."""
    import math

    class CopyToTP(torch.autograd.Function):
        """Megatron's f: identity forward; backward all-reduces the input gradient."""

        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return comm.all_reduce(g.contiguous())

    class ReduceFromTP(torch.autograd.Function):
        """Megatron's g: forward all-reduces the partial products (in place); identity backward."""

        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return comm.all_reduce(x)

        @staticmethod
        def backward(ctx, g):
            return g

    def copy_to_tp(x):
        return x if world == 1 else CopyToTP.apply(x)

    def reduce_from_tp(x):
        return x if world == 1 else ReduceFromTP.apply(x.contiguous())

    def split_rows(parts):
        """Slice of a full (out, in) weight or (out,) bias: the rank's rows of each of `parts`
        equal blocks of the output features (qkv: parts 3, the rank's heads of q, of k, of v)."""
        def take(full):
            return torch.cat([blk.chunk(world, 0)[rank] for blk in full.chunk(parts, 0)], 0)
        return take

    def split_cols(full):
        return full.chunk(world, 1)[rank]

    def shard(param, take):
        param.tp_take = take  # full tensor -> this rank's slice; absent: replicated
        return param

    class ColumnParallelLinear(nn.Module):
        def __init__(self, d_in, d_out, parts=1):
            super().__init__()
            self.weight = shard(nn.Parameter(torch.empty(d_out // world, d_in)), split_rows(parts))
            self.bias = shard(nn.Parameter(torch.empty(d_out // world)), split_rows(parts))

        def forward(self, x):
            return F.linear(copy_to_tp(x), self.weight, self.bias)

    class RowParallelLinear(nn.Module):
        def __init__(self, d_in, d_out):
            super().__init__()
            self.weight = shard(nn.Parameter(torch.empty(d_out, d_in // world)), split_cols)
            self.bias = nn.Parameter(torch.empty(d_out))  # replicated, added after the reduce

        def forward(self, x):
            return reduce_from_tp(F.linear(x, self.weight)) + self.bias

    class ParallelAttention(nn.Module):
        def __init__(self, d, heads, max_seq):
            super().__init__()
            self.heads = heads // world  # this rank's heads
            self.hd = d // heads
            self.qkv = ColumnParallelLinear(d, 3 * d, parts=3)
            self.proj = RowParallelLinear(d, d)
            mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, max_seq, max_seq), persistent=False)
            self.sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0 only

        def forward(self, x):
            B, T, _ = x.shape
            H, hd = self.heads, self.hd
            q, k, v = self.qkv(x).split(H * hd, dim=2)
            q = q.view(B, T, H, hd).transpose(1, 2)
            k = k.view(B, T, H, hd).transpose(1, 2)
            v = v.view(B, T, H, hd).transpose(1, 2)
            if self.sdpa is not None:
                y = self.sdpa(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
                att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, H * hd)
            return self.proj(y)

    class ParallelMLP(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc = ColumnParallelLinear(d, 4 * d)
            self.proj = RowParallelLinear(4 * d, d)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, d, heads, max_seq):
            super().__init__()
            self.ln1 = nn.LayerNorm(d, eps=1e-5)
            self.attn = ParallelAttention(d, heads, max_seq)
            self.ln2 = nn.LayerNorm(d, eps=1e-5)
            self.mlp = ParallelMLP(d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        """Parameter names as torch_gpt.py's GPT (lm_head tied to wte, so not a parameter)."""

        def __init__(self, layers, d, heads, vocab, max_seq):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Embedding(max_seq, d)
            self.blocks = nn.ModuleList([Block(d, heads, max_seq) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d, eps=1e-5)

        @torch.no_grad()
        def load_from(self, full):
            """Copies this rank's slice of every parameter of the full model `full`."""
            src = dict(full.named_parameters())
            for name, p in self.named_parameters():
                w = src[name].detach()
                take = getattr(p, "tp_take", None)
                p.copy_(take(w) if take else w)

        def forward(self, idx, targets):
            B, T = idx.shape
            pos = torch.arange(T, dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm_head, replicated
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["max_seq"])


def worker(rank, args, port):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    dist = None
    P = args.tp
    if args.intra_threads is not None:
        torch.set_num_threads(args.intra_threads)
    if P >= 2:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=P)
    comm = Comm(dist, P)
    cfg = args.cfg

    # The full model of torch_gpt.py, from the common seed, on every rank; each keeps its slice.
    torch.manual_seed(args.seed)
    full = torch_gpt.gpt_class(torch, nn, F)(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"],
                                             cfg["max_seq"])
    n_params = sum(p.numel() for p in full.parameters())  # tied weight counted once
    model = tp_gpt(torch, nn, F, cfg, P, rank, comm)
    model.load_from(full)
    del full
    model.train()
    params = list(model.parameters())
    split = [p for p in params if hasattr(p, "tp_take")]
    repl = [p for p in params if not hasattr(p, "tp_take")]
    n_local = sum(p.numel() for p in params)
    opt = torch_gpt.adamw(torch, params)

    def clip_grad_norm(max_norm=1.0):
        """torch.nn.utils.clip_grad_norm_ over the whole model: the split parameters' squared
        norms summed over the ranks, the replicated ones (equal on every rank) counted once."""
        sq = torch.stack([torch.linalg.vector_norm(p.grad) for p in split]).square().sum().view(1)
        comm.all_reduce(sq)
        sq = sq + torch.stack([torch.linalg.vector_norm(p.grad) for p in repl]).square().sum()
        norm = sq.sqrt()
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in params:
            p.grad.mul_(coef)
        return norm

    B, T = args.batch, args.seq
    gen = torch.Generator().manual_seed(args.seed + 1)  # torch_gpt.py's data; the same on every rank
    batch = torch_gpt.batcher(torch, args.data, cfg["vocab"], B, T, gen, "torch_tp.py")

    def step():
        x, y = batch()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = clip_grad_norm(1.0)
        opt.step()
        return loss.item(), norm.item()

    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    if rank == 0 and not args.quiet:
        print(f"torch {torch.__version__} TP {'gloo' if P >= 2 else '(no group)'}: {args.name} "
              f"({n_params / 1e6:.2f}M params, {n_local / 1e6:.2f}M per rank) B={B} T={T} on "
              f"{P} process(es) x {torch.get_num_threads()} intra-op thread(s), "
              f"OPENBLAS_NUM_THREADS={blas}, OpenBLAS core {torch_gpt.openblas_corename()}",
              flush=True)
    if dist:
        dist.barrier()
    losses, norms, times, comms = [], [], [], []
    calls = elems = 0
    stop = torch.zeros(1)
    t_start = time.perf_counter()
    for i in range(args.warmup + args.steps):
        if times and args.max_seconds is not None:  # rank 0 decides, outside the timed region
            if rank == 0:
                stop[0] = float(time.perf_counter() - t_start > args.max_seconds)
            if dist:
                dist.broadcast(stop, 0)
            if stop[0] > 0:
                break
        if i == args.warmup:
            if dist:
                dist.barrier()
            cpu0, busy0, wall0 = time.process_time(), torch_gpt.cpu_busy_seconds(), time.perf_counter()
        comm.reset()
        t0 = time.perf_counter()
        loss, norm = step()
        dt = time.perf_counter() - t0
        losses.append(loss)
        norms.append(norm)
        calls, elems = comm.calls, comm.elems
        timed = i >= args.warmup
        if timed:
            times.append(dt)
            comms.append(comm.seconds)
        if rank == 0 and not args.quiet:
            print(f"step {i:4d}{'' if timed else ' (warm-up)'}: loss {loss:.4f}  {dt * 1e3:8.1f} ms  "
                  f"{B * T / dt:9.0f} tok/s  comm {comm.seconds * 1e3:7.1f} ms (rank 0)", flush=True)
    wall = time.perf_counter() - wall0
    own_cpu = torch.tensor([time.process_time() - cpu0], dtype=torch.float64)
    busy1 = torch_gpt.cpu_busy_seconds()
    t = torch.tensor(times, dtype=torch.float64)
    comm_rank = torch.zeros(P, len(comms), dtype=torch.float64)
    comm_rank[rank] = torch.tensor(comms, dtype=torch.float64)
    repl_diff = 0.0
    if dist:
        # a step takes as long as its slowest rank; the CPU of all ranks together is "own"
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(own_cpu)
        dist.all_reduce(comm_rank)
        # the replicated parameters must have stayed equal on every rank
        with torch.no_grad():
            for p in repl:
                r0 = p.detach().clone()
                dist.broadcast(r0, 0)
                repl_diff = max(repl_diff, (p.detach() - r0).abs().max().item())
        rd = torch.tensor([repl_diff], dtype=torch.float64)
        dist.all_reduce(rd, op=dist.ReduceOp.MAX)
        repl_diff = rd.item()
    if rank == 0:
        times = t.tolist()
        own = own_cpu.item() / wall
        others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) / wall - own)
        med, mean = statistics.median(times), statistics.fmean(times)
        comm_med = [statistics.median(row) for row in comm_rank.tolist()]
        result = {
            "impl": "pytorch-tp", "torch": torch.__version__, "backend": "gloo" if dist else None,
            "tp": P, "model": args.name, "params": n_params, "params_per_rank": n_local,
            "batch": B, "seq": T, "steps": len(times), "warmup": args.warmup,
            "data": args.data or "random",
            "threads": {"intra_op": torch.get_num_threads(), "openblas": blas},
            **torch_gpt.timing(times, B * T, losses, own, others),
            # time inside the all-reduces per timed step: rank 0's median, and each rank's
            "comm_ms": {"median": round(comm_med[0] * 1e3, 3),
                        "per_rank": [round(c * 1e3, 3) for c in comm_med]},
            "comm_share": round(comm_med[0] / med, 4),
            "allreduce_per_step": {"calls": calls, "bytes": elems * 4},
            "losses": losses,  # every step, warm-up included
            "grad_norms": norms,  # the global gradient norm before clipping, every step
            "replicated_max_abs_diff": repl_diff,
            "blas_core": torch_gpt.openblas_corename(),
        }
        if not args.quiet:
            print(f"{args.name} TP x{P}: median {med * 1e3:.1f} ms/step (mean {mean * 1e3:.1f}), "
                  f"{B * T / med:.0f} tokens/s; comm {comm_med[0] * 1e3:.1f} ms/step (rank 0, "
                  f"median) = {100 * comm_med[0] / med:.1f}% of the step, {calls} all-reduces of "
                  f"{elems * 4 / 1e6:.2f} MB per step; loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
                  f"CPU cores: own {own:.2f}, others {others if others is None else round(others, 2)}",
                  flush=True)
        if args.json:
            print(json.dumps(result), flush=True)
    if dist:
        # Leave as torch_ddp.py does (after a barrier, without tearing gloo down: torch 1.13's
        # ProcessGroupGloo destructor can hang at interpreter exit).
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def check(args, argv):
    """Runs --tp 1 and --tp P from the same seed (two runs of this script) and compares the losses."""
    base = [a for a in argv if not (a.startswith("--ch") and "--check".startswith(a))]
    runs = {}
    for tp in sorted({1, args.tp}):
        cmd = [sys.executable, os.path.abspath(__file__)] + base + [
            "--tp", str(tp), "--steps", str(args.steps), "--warmup", "0", "--json", "--quiet"]
        if tp == 1 and args.tp >= 2:  # --tp 1 would leave the thread counts to torch and OpenBLAS
            cmd += ["--intra-threads", str(args.intra_threads), "--blas-threads", str(args.blas_threads)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            sys.stderr.write(f"torch_tp.py --check: the --tp {tp} run failed (exit {out.returncode})\n")
            return out.returncode
        runs[tp] = json.loads(out.stdout.strip().splitlines()[-1])
    def rel(a, b):
        return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))

    ref, got = runs[1]["losses"], runs[args.tp]["losses"]
    nref, ngot = runs[1]["grad_norms"], runs[args.tp]["grad_norms"]
    diff = runs[args.tp]["replicated_max_abs_diff"]
    ok = (len(ref) == len(got) == args.steps and rel(ref, got) <= CHECK_RTOL
          and rel(nref, ngot) <= CHECK_RTOL and diff == 0.0)
    print(f"{args.name} B={args.batch} T={args.seq} seed {args.seed}, {args.steps} steps:")
    print(f"  tp 1 losses: {[round(x, 6) for x in ref]}")
    print(f"  tp {args.tp} losses: {[round(x, 6) for x in got]}")
    print(f"  tp 1 gradient norms: {[round(x, 6) for x in nref]}")
    print(f"  tp {args.tp} gradient norms: {[round(x, 6) for x in ngot]}")
    print(f"  largest relative difference: losses {rel(ref, got):.2e}, gradient norms "
          f"{rel(nref, ngot):.2e} (tolerance {CHECK_RTOL:g}); replicated parameters' largest "
          f"difference between ranks {diff:g}: {'OK' if ok else 'MISMATCH'}", flush=True)
    if args.json:
        print(json.dumps({"check": ok, "model": args.name, "tp": args.tp, "batch": args.batch,
                          "seq": args.seq, "seed": args.seed, "losses_tp1": ref,
                          f"losses_tp{args.tp}": got, "grad_norms_tp1": nref,
                          f"grad_norms_tp{args.tp}": ngot, "max_rel_diff": rel(ref, got),
                          "max_rel_diff_grad_norms": rel(nref, ngot),
                          "replicated_max_abs_diff": diff}), flush=True)
    return 0 if ok else 1


def main(argv):
    args = parse_args(argv)
    torch_gpt.reexec_if_needed(args, __file__)
    if args.check:
        return check(args, argv)
    if args.tp == 1:
        return worker(0, args, None)
    import torch.multiprocessing as mp
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    port = torch_ddp.free_port()
    os.environ["MASTER_PORT"] = str(port)
    mp.spawn(worker, args=(args, port), nprocs=args.tp, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
