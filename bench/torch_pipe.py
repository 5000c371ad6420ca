#!/usr/bin/env python3
"""PyTorch GPipe peer for meshtrain's pipeline: torch.distributed.pipeline.sync.Pipe (torch 1.13).

The model is torch_gpt.py's GPT, cut into 2 stages of an nn.Sequential (stage 0: the embeddings
and the first half of the blocks; stage 1: the other blocks, ln_f and the head with the loss)
and run by Pipe with --microbatches chunks (GPipe: all forwards, then all backwards). The tied
head keeps wte's weight: both stages sit on the CPU, the only device torch's Pipe has here, so
Pipe runs them as one partition on one worker thread with the intra-op pool of --intra-threads;
that is what PyTorch offers for pipelining on CPU. Targets travel with the activations (a tuple
through the stages); each micro-batch's mean loss comes out and the step's loss is their mean.

Needs Debian's python3-torch (`apt-get install -y python3-torch python3-numpy`); RPC, which
Pipe requires, is initialised on 127.0.0.1. Exit status 2 when torch is missing or options are bad.

  bench/torch_pipe.py --model gpt-small --microbatches 8 --steps 8 --intra-threads 2 --json
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402


def main(argv):
    p_argv = [a for a in argv]
    m = 8
    if "--microbatches" in p_argv:
        i = p_argv.index("--microbatches")
        try:
            m = int(p_argv[i + 1])
        except (IndexError, ValueError):
            sys.stderr.write("torch_pipe.py: --microbatches needs a positive integer\n")
            sys.exit(2)
        del p_argv[i:i + 2]
    if m < 1:
        sys.stderr.write("torch_pipe.py: --microbatches must be >= 1\n")
        sys.exit(2)
    args = torch_gpt.parse_args(p_argv)
    if args.batch % m:
        sys.stderr.write(f"torch_pipe.py: --batch {args.batch} does not split into {m} micro-batches\n")
        sys.exit(2)
    torch_gpt.reexec_if_needed(args, script=__file__)

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed import rpc
    from torch.distributed.pipeline.sync import Pipe

    cfg = torch_gpt.CONFIGS[args.model]
    if args.intra_threads is not None:
        torch.set_num_threads(args.intra_threads)
    torch.manual_seed(args.seed)
    GPT = torch_gpt.gpt_class(torch, nn, F)
    gpt = GPT(cfg["layers"], cfg["d"], cfg["heads"], cfg["vocab"], cfg["max_seq"])
    half = cfg["layers"] // 2

    class Stage0(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe, self.blocks = gpt.wte, gpt.wpe, nn.ModuleList(gpt.blocks[:half])

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], dtype=torch.long))
            for b in self.blocks:
                x = b(x)
            return x, targets

    class Stage1(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.ln_f, self.lm_head = nn.ModuleList(gpt.blocks[half:]), gpt.ln_f, gpt.lm_head

        def forward(self, x, targets):
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)).view(1)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    rpc.init_rpc("worker", rank=0, world_size=1)
    model = Pipe(nn.Sequential(Stage0(), Stage1()), chunks=m)
    model.train()
    params = [p for p in gpt.parameters() if p.requires_grad]
    opt = torch_gpt.adamw(torch, params)
    B, T = args.batch, args.seq
    gen = torch.Generator().manual_seed(args.seed + 1)
    batch = torch_gpt.batcher(torch, args.data, cfg["vocab"], B, T, gen, "torch_pipe.py")

    def step():
        x, y = batch()
        loss = model(x, y).local_value().mean()  # one mean loss per micro-batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    if not args.quiet:
        print(f"torch {torch.__version__} Pipe: {args.model} B={B} T={T} micro-batches {m}, "
              f"intra-op threads {torch.get_num_threads()}", flush=True)
    losses, times = [], []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            cpu0, busy0, wall0 = time.process_time(), torch_gpt.cpu_busy_seconds(), time.perf_counter()
        t0 = time.perf_counter()
        loss = step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss)
        if not args.quiet:
            print(f"step {i + 1}: loss {loss:.4f} {1e3 * (time.perf_counter() - t0):.1f} ms", flush=True)
    wall = time.perf_counter() - wall0
    own = (time.process_time() - cpu0) / wall
    busy = torch_gpt.cpu_busy_seconds()
    others = None if busy is None or busy0 is None else max(0.0, (busy - busy0) / wall - own)
    out = dict(program="torch-pipe", model=args.model, batch=B, seq=T, microbatches=m,
               **torch_gpt.timing(times, B * T, losses, own, others))
    if args.json:
        print(__import__("json").dumps(out))
    rpc.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
