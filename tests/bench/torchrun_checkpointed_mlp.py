#!/usr/bin/python3
"""A torchrun script that resumes from its own checkpoint after a restart.

What it is
    The smallest job a torchrun user writes to survive `--max_restarts`: an MLP
    trained with PyTorch DDP over gloo on random data drawn from a fixed seed
    (the same on every run and every rank; each rank trains its own share of
    every batch). After every optimizer step rank 0 saves the model, the
    optimizer and the step to --ckpt (torch.save to a temporary name, then an
    atomic rename). A worker started with TORCHELASTIC_RESTART_COUNT > 0 loads
    that file, if there is one, and carries on from its step. It reads only
    what torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, the
    TORCHELASTIC_* variables), so the same file runs under torchrun and as a
    Chorus program job unchanged.

What it prints (one line each, flushed)
    "torchrun-mlp: start rank R pid P restart_count K max_restarts M run_id ID
     group_rank G role_rank RR role_world_size RW group_world_size GW
     local_world_size LW role_name N use_agent_store U"
    "torchrun-mlp: rank R restart K resumed_step S"   (S = 0 without a checkpoint)
    "torchrun-mlp: rank R restart K step S loss L"     every step
    "torchrun-mlp: final rank R restart K step S loss L params_digest D"
With --progress FILE it also appends JSON lines (one write each) that
tests/bench/restart_all_bench.py reads:
    {"event": "pid", "rank": R, "pid": P, "restart": K, "t": T}
    {"event": "start", "rank": R, "restart": K, "resumed_step": S, "t": T}
    {"event": "step", "rank": R, "restart": K, "step": S, "t": T}
    {"event": "final", "rank": R, "restart": K, "step": S, "t": T}
T is time.time().

How to run
    OMP_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run --nnodes 1 \\
        --nproc_per_node 2 --max_restarts 3 --redirects 1 --tee 1 \\
        tests/bench/torchrun_checkpointed_mlp.py --ckpt /tmp/mlp.pt --steps 40
"""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 64  # samples per step, over all ranks
FEATURES = 32


def emit(progress, **fields):
    if not progress:
        return
    fields["t"] = time.time()
    line = (json.dumps(fields) + "\n").encode()
    fd = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def say(text):
    print(f"torchrun-mlp: {text}", flush=True)


def batch_of(step, rank, world):
    """Step `step`'s batch (the same whatever the world size), this rank's share."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    share = BATCH // world
    return x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def save(path, step, model, optimizer):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
               tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint file (rank 0 writes it)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step_sleep", type=float, default=0.05,
                    help="seconds each step sleeps, so that a test can act mid-run")
    ap.add_argument("--progress", default="", help="JSON-lines progress file")
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    env = os.environ.get
    say(f"start rank {rank} pid {os.getpid()} restart_count {env('TORCHELASTIC_RESTART_COUNT')} "
        f"max_restarts {env('TORCHELASTIC_MAX_RESTARTS')} run_id {env('TORCHELASTIC_RUN_ID')} "
        f"group_rank {env('GROUP_RANK')} role_rank {env('ROLE_RANK')} "
        f"role_world_size {env('ROLE_WORLD_SIZE')} group_world_size {env('GROUP_WORLD_SIZE')} "
        f"local_world_size {env('LOCAL_WORLD_SIZE')} role_name {env('ROLE_NAME')} "
        f"use_agent_store {env('TORCHELASTIC_USE_AGENT_STORE')}")
    emit(args.progress, event="pid", rank=rank, pid=os.getpid(), restart=restart)

    dist.init_process_group("gloo")
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = 0
    if restart > 0 and os.path.exists(args.ckpt):
        state = torch.load(args.ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    ddp = DDP(model)
    say(f"rank {rank} restart {restart} resumed_step {step}")
    emit(args.progress, event="start", rank=rank, restart=restart, resumed_step=step)

    loss = torch.zeros(())
    while step < args.steps:
        x, y = batch_of(step, rank, world)
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0:
            save(args.ckpt, step, model, optimizer)
        say(f"rank {rank} restart {restart} step {step} loss {loss.item():.4f}")
        emit(args.progress, event="step", rank=rank, restart=restart, step=step)
        time.sleep(args.step_sleep)

    dist.barrier()
    say(f"final rank {rank} restart {restart} step {step} loss {loss.item():.4f} "
        f"params_digest {digest(model)}")
    emit(args.progress, event="final", rank=rank, restart=restart, step=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
