#!/usr/bin/env python3
"""A PyTorch DDP script on Chorus's `chorus` backend (docs/python.md).

Run from the repository root, after python/install.sh:

  chorus up --local 2 examples/programs/python_ddp.yaml

It trains a small MLP on a fixed synthetic classification set with
torch.nn.parallel.DistributedDataParallel, reports its step, loss and phases
to Chorus, and checkpoints through the coordinator every --checkpoint_every
steps (resuming from --resume_from when the job was submitted with it).
Rank 0 ends with a line "final: rank 0 step N loss L params_digest D".

--backend gloo runs the same training on PyTorch's own Gloo backend (the
torchrun way: env:// with the MASTER_ADDR/MASTER_PORT Chorus sets), without
the chorus package, as the peer that the backend is compared with. The
--skip_*, --freeze_* and --linger_* flags make a rank misbehave for the hang
tests.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FEATURES, CLASSES, SAMPLES = 32, 10, 4096


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--checkpoint_every", type=int, default=0, help="0: never")
    p.add_argument("--save_params", default="", help="write the final parameters to PATH.RANK")
    p.add_argument("--timing", default="",
                   help="rank 0 writes the median step time after --warmup steps to this "
                        "file, as JSON (tests/bench/python_bench.py)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--skip_rank", type=int, default=-1,
                   help="this rank skips the extra all_reduce at --skip_at_step and waits "
                        "--skip_seconds in phase DATA instead")
    p.add_argument("--skip_at_step", type=int, default=10)
    p.add_argument("--skip_seconds", type=float, default=60)
    p.add_argument("--freeze_rank", type=int, default=-1,
                   help="this rank stops itself (SIGSTOP) at --freeze_at_step")
    p.add_argument("--freeze_at_step", type=int, default=10)
    p.add_argument("--linger_rank", type=int, default=-1,
                   help="after the last step the other ranks say they finished while this "
                        "one posts an all_reduce none of them joins; every rank exits 0 "
                        "--linger_seconds later (a slow shutdown: this rank's last heartbeats "
                        "say it waits inside that collective)")
    p.add_argument("--linger_seconds", type=float, default=6)
    return p.parse_args()


def dataset():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    return x, (x @ w).argmax(dim=1)


def model(hidden):
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))


def digest(net):
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class NoChorus:
    """The gloo run's stand-ins for the chorus package's progress calls."""

    @staticmethod
    def step(*args, **kwargs):
        pass

    @staticmethod
    def phase(name):
        import contextlib
        return contextlib.nullcontext()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.backend == "chorus":
        import chorus
        chorus.init_process_group()
        tracker = chorus
    else:
        dist.init_process_group("gloo")
        tracker = NoChorus
    rank, size = dist.get_rank(), dist.get_world_size()

    net = model(args.hidden)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if args.backend == "chorus":
        resumed = chorus.load_checkpoint()
        if resumed is not None:
            start, state = resumed
            net.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            print(f"checkpoint: rank {rank} restored step {start} digest {digest(net)}", flush=True)
    ddp = DDP(net)
    x, y = dataset()
    batches = SAMPLES // (args.batch * size)

    loss = torch.zeros(())
    step_seconds = []
    for step in range(start + 1, args.steps + 1):
        began = time.perf_counter()
        with tracker.phase("DATA"):
            b = (step - 1) % batches
            lo = (b * size + rank) * args.batch
            xb, yb = x[lo:lo + args.batch], y[lo:lo + args.batch]
        with tracker.phase("FORWARD"):
            loss = F.cross_entropy(ddp(xb), yb)
        with tracker.phase("BACKWARD"):
            optimizer.zero_grad()
            loss.backward()
        with tracker.phase("OPTIMIZER"):
            optimizer.step()
        tracker.step(step, loss=loss.item(), samples=len(xb))
        step_seconds.append(time.perf_counter() - began)
        if step == args.skip_at_step and args.skip_rank >= 0:
            if rank == args.skip_rank:
                print(f"skip: rank {rank} leaves out the all_reduce of step {step}", flush=True)
                with tracker.phase("DATA"):
                    time.sleep(args.skip_seconds)
            else:
                dist.all_reduce(loss.detach().clone())
        if step == args.freeze_at_step and rank == args.freeze_rank:
            print(f"freeze: rank {rank} stops itself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            chorus.save_checkpoint(step, {"model": net.state_dict(),
                                          "optimizer": optimizer.state_dict()})
            if rank == 0:
                print(f"checkpoint: saved step {step} digest {digest(net)}", flush=True)
    if args.backend == "chorus" and args.checkpoint_every:
        chorus.wait_for_checkpoints()
    if args.timing and rank == 0:
        timed = sorted(step_seconds[args.warmup:])
        with open(args.timing, "w") as f:
            json.dump({"backend": args.backend, "hidden": args.hidden, "steps": len(timed),
                       "median_step_seconds": timed[len(timed) // 2]}, f)
    if args.save_params:
        torch.save({n: p.detach() for n, p in net.named_parameters()},
                   f"{args.save_params}.{rank}")
    print(f"final: rank {rank} step {args.steps} loss {loss.item():.6f} "
          f"params_digest {digest(net)}", flush=True)
    if args.linger_rank >= 0 and args.backend == "chorus":
        # A slow shutdown: the other ranks have finished (and said so); this
        # one's heartbeats keep saying it waits in a collective. Every rank
        # stays up meanwhile, so the collective neither completes nor fails.
        if rank == args.linger_rank:
            print(f"linger: rank {rank} waits {args.linger_seconds} s inside an all_reduce "
                  "no other rank joins", flush=True)
            dist.all_reduce(loss.detach().clone(), async_op=True)
        else:
            chorus.session().enter_phase("FINISHED")
            chorus.session().flush_progress()
        time.sleep(args.linger_seconds)
        os._exit(0)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
