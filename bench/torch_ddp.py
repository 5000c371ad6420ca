#!/usr/bin/env python3
"""PyTorch data-parallel reference for meshtrain's --dp: DistributedDataParallel, gloo, CPU.

The model, initialisation, AdamW and clipping are bench/torch_gpt.py's (imported, not copied). With
--nproc P >= 2 the script spawns P processes that join a gloo process group over loopback only
(tcp://127.0.0.1:<free port>), wraps the model in DistributedDataParallel (default 25 MiB buckets,
all-reduce overlapped with backward) and splits the global batch B into P local batches of B/P rows.
Each step is timed on every rank; a step's time is the slowest rank's, and tokens/s counts the
global batch: B*T / median step time after --warmup untimed steps.

With --nproc 1 it runs torch_gpt.py itself (its main(), with this script's model config added to
its table), so the single-process figure is exactly the reference's.

Threads: --intra-threads (torch.set_num_threads, per process) and --blas-threads
(OPENBLAS_NUM_THREADS, per process; OpenBLAS reads it at load time, so the script re-executes
itself with it set, as torch_gpt.py does, and with OPENBLAS_CORETYPE where torch_gpt.py would set
it). The data-parallel default is 1 and 1: P processes x 1 thread.

  bench/torch_ddp.py --config bench/configs/gpt-4l-256.json --nproc 2 --steps 20 --warmup 2 --json
  bench/torch_ddp.py --model gpt2-124m --batch 4 --seq 64 --nproc 1 --intra-threads 1 --blas-threads 2

Exit status 2 when torch is missing or the options are bad.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402  (stdlib-only at import time; torch is imported later)


def load_config(path):
    """A meshtrain model config JSON (name, n_layer, n_embd, n_head, vocab_size, block_size, batch,
    seq) as a torch_gpt.CONFIGS entry."""
    with open(path) as f:
        j = json.load(f)
    cfg = dict(layers=int(j["n_layer"]), d=int(j["n_embd"]), heads=int(j["n_head"]),
               vocab=int(j["vocab_size"]), max_seq=int(j["block_size"]))
    cfg["seq"] = int(j.get("seq", cfg["max_seq"]))
    cfg["batch"] = int(j.get("batch", 8))
    name = j.get("name") or os.path.splitext(os.path.basename(path))[0]
    return name, cfg


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model", default=None, choices=sorted(torch_gpt.CONFIGS))
    g.add_argument("--config", default=None, help="meshtrain model config JSON (as --config there)")
    p.add_argument("--nproc", type=int, default=2, help="processes (1: torch_gpt.py's single run)")
    p.add_argument("--batch", type=int, default=None, help="global batch (default: the model's)")
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    p.add_argument("--data", default=None, help="text file (byte tokens); random tokens if absent")
    p.add_argument("--intra-threads", type=int, default=None,
                   help="torch.set_num_threads per process (default: 1 when --nproc >= 2)")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="OPENBLAS_NUM_THREADS per process (default: 1 when --nproc >= 2)")
    p.add_argument("--blas-core", default="auto", help="as torch_gpt.py's --blas-core")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (torch's default 25)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop the timed steps once this much time has passed (at least one runs)")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    a = p.parse_args(argv)
    if a.config:
        if not os.path.isfile(a.config):
            p.error(f"--config {a.config}: no such file")
        try:
            a.name, a.cfg = load_config(a.config)
        except (ValueError, KeyError) as e:
            p.error(f"--config {a.config}: {e!r}")
    else:
        a.name = a.model or "gpt-tiny"
        a.cfg = torch_gpt.CONFIGS[a.name]
    a.batch = a.batch or a.cfg["batch"]
    a.seq = a.seq or a.cfg["seq"]
    if a.nproc < 1 or a.batch < 1 or a.seq < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--nproc, --batch, --seq and --steps must be >= 1, --warmup >= 0")
    if a.batch % a.nproc:
        p.error(f"--batch {a.batch} does not split over --nproc {a.nproc}")
    if a.seq > a.cfg["max_seq"]:
        p.error(f"--seq {a.seq} exceeds {a.name}'s context of {a.cfg['max_seq']}")
    if a.nproc >= 2:
        a.intra_threads = 1 if a.intra_threads is None else a.intra_threads
        a.blas_threads = 1 if a.blas_threads is None else a.blas_threads
    torch_gpt.check_threads_and_data(p, a)
    return a


def run_single(args):
    """The single-process reference: torch_gpt.py's main() on this config."""
    torch_gpt.CONFIGS.setdefault(args.name, args.cfg)
    argv = ["--model", args.name, "--batch", str(args.batch), "--seq", str(args.seq),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
            # the environment is already what torch_gpt.py wants: it must not re-execute
            "--blas-core", os.environ.get("OPENBLAS_CORETYPE") or "none"]
    for flag, v in (("--intra-threads", args.intra_threads), ("--blas-threads", args.blas_threads),
                    ("--data", args.data), ("--max-seconds", args.max_seconds)):
        if v is not None:
            argv += [flag, str(v)]
    argv += [f for f, on in (("--json", args.json), ("--quiet", args.quiet)) if on]
    return torch_gpt.main(argv)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    P = args.nproc
    torch.set_num_threads(args.intra_threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
    cfg = args.cfg
    torch.manual_seed(args.seed)  # same initialisation on every rank (DDP also broadcasts rank 0's)
    model = torch_gpt.gpt_class(torch, nn, F)(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["max_seq"])
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]  # tied weight appears once
    n_params = sum(p.numel() for p in params)
    # The causal masks are bool buffers, constant and equal on every rank; gloo cannot broadcast
    # bool tensors (torch 1.13: "Invalid scalar type"), so DDP leaves the buffers alone.
    DDP._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in model.named_buffers()])
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb, broadcast_buffers=False)
    # torch_gpt.py's optimizer
    opt = torch_gpt.adamw(torch, params)

    B, T = args.batch // P, args.seq  # local batch
    gen = torch.Generator().manual_seed(args.seed + 1 + rank)
    batch = torch_gpt.batcher(torch, args.data, cfg["vocab"], B, T, gen, "torch_ddp.py")

    def step():
        x, y = batch()
        loss = ddp(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets as backward produces them
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    if rank == 0 and not args.quiet:
        print(f"torch {torch.__version__} DDP gloo: {args.name} ({n_params / 1e6:.2f}M params) "
              f"global B={args.batch} T={T} over {P} processes x {torch.get_num_threads()} intra-op "
              f"thread(s), OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
              f"OpenBLAS core {torch_gpt.openblas_corename()}", flush=True)
    dist.barrier()
    losses, times = [], []
    stop = torch.zeros(1)
    t_start = time.perf_counter()
    for i in range(args.warmup + args.steps):
        if times and args.max_seconds is not None:  # rank 0 decides, outside the timed region
            if rank == 0:
                stop[0] = float(time.perf_counter() - t_start > args.max_seconds)
            dist.broadcast(stop, 0)
            if stop[0] > 0:
                break
        if i == args.warmup:
            dist.barrier()
            cpu0, busy0, wall0 = time.process_time(), torch_gpt.cpu_busy_seconds(), time.perf_counter()
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        losses.append(loss)
        timed = i >= args.warmup
        if timed:
            times.append(dt)
        if rank == 0 and not args.quiet:
            print(f"step {i:4d}{'' if timed else ' (warm-up)'}: loss {loss:.4f}  {dt * 1e3:8.1f} ms  "
                  f"{args.batch * T / dt:9.0f} tok/s (rank 0)", flush=True)
    wall = time.perf_counter() - wall0
    own_cpu = torch.tensor([time.process_time() - cpu0], dtype=torch.float64)
    busy1 = torch_gpt.cpu_busy_seconds()
    # a step takes as long as its slowest rank; the CPU of all ranks together is "own"
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(own_cpu)
    lt = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(lt)
    if rank == 0:
        times = t.tolist()
        losses = (lt / P).tolist()
        own = own_cpu.item() / wall
        others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) / wall - own)
        med, mean = statistics.median(times), statistics.fmean(times)
        GB = args.batch * T
        result = {
            "impl": "pytorch-ddp", "torch": torch.__version__, "backend": "gloo", "nproc": P,
            "model": args.name, "params": n_params, "batch": args.batch, "local_batch": B,
            "seq": T, "steps": len(times), "warmup": args.warmup, "data": args.data or "random",
            "bucket_mb": args.bucket_mb,
            "threads": {"intra_op": torch.get_num_threads(),
                        "openblas": os.environ.get("OPENBLAS_NUM_THREADS", "unset")},
            **torch_gpt.timing(times, GB, losses, own, others),
            "blas_core": torch_gpt.openblas_corename(),
        }
        if not args.quiet:
            print(f"{args.name} DDP x{P}: median {med * 1e3:.1f} ms/step (mean {mean * 1e3:.1f}), "
                  f"{GB / med:.0f} tokens/s; loss {losses[0]:.4f} -> {losses[-1]:.4f}; CPU cores: "
                  f"own {own:.2f}, others {others if others is None else round(others, 2)}", flush=True)
        if args.json:
            print(json.dumps(result), flush=True)
    # Leave without tearing DDP down: in torch 1.13 the Reducer's ProcessGroupGloo destructor, run at
    # interpreter exit, joins a gloo thread that waits for the GIL the joining thread holds, and now
    # and then the rank hangs there for good (seen under load). All ranks are done after the barrier.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv):
    args = parse_args(argv)
    torch_gpt.reexec_if_needed(args, __file__)
    if args.nproc == 1:
        return run_single(args)
    import torch.multiprocessing as mp
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    port = free_port()
    os.environ["MASTER_PORT"] = str(port)
    mp.spawn(worker, args=(args, port), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
