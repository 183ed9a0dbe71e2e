#!/usr/bin/python3
"""torchrun elastic peer: a PyTorch DDP job that survives a killed worker the way
torchrun users make it survive one.

What it runs
    The Fashion-MNIST MLP of tests/bench/torchrun_fashion_mnist.py (same model,
    data, normalisation, sampler, optimizer and schedule), trained with PyTorch
    DDP over gloo for at most --steps steps. torchrun restarts every worker of
    the node when one dies (--max_restarts), so the script does what a torchrun
    user's script must: rank 0 saves model, optimizer, scheduler and the
    position in the epoch to --ckpt_dir every --ckpt_every steps (torch.save to
    a temporary file, fsync, rename), and every worker loads the newest one at
    start and carries on from there. Steps since that checkpoint are trained
    again.

What it reports (for tests/bench/elastic_bench.sh)
    JSON lines appended to --progress (one write each, O_APPEND):
      {"event": "pid", "rank": R, "pid": P, "restart": K, "t": T}
          every worker, at start (K = TORCHELASTIC_RESTART_COUNT);
      {"event": "start", "restart": K, "resumed_step": S, "world": W, "t": T}
          rank 0, once the process group is up and the checkpoint is loaded
          (S = 0 without one);
      {"event": "step", "step": S, "restart": K, "t": T}
          rank 0, after every optimizer step;
      {"event": "final", "steps": S, "test_accuracy": A, "t": T}
          rank 0, after evaluation.
    T is time.time() (seconds since the epoch, comparable across processes).

How to run (Debian's python3-torch; loopback only)
    OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo /usr/bin/python3 -m torch.distributed.run \\
        --nnodes 1:2 --nproc_per_node 4 --max_restarts 3 --rdzv_backend c10d \\
        --rdzv_endpoint 127.0.0.1:PORT tests/bench/torchrun_elastic_peer.py \\
        --ckpt_dir DIR --ckpt_every 50 --steps 600 --progress DIR/progress.jsonl
"""

import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchrun_fashion_mnist import (  # noqa: E402  (the same job as the e2e peer)
    TensorBatches,
    lr_factor,
    make_model,
    read_idx_images,
    read_idx_labels,
)


def report(path, **fields):
    fields["t"] = time.time()
    line = (json.dumps(fields) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def save_checkpoint(ckpt_dir, state):
    tmp = os.path.join(ckpt_dir, "checkpoint.pt.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt_dir, "checkpoint.pt"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=600, help="stop after this many steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--warmup_steps", type=int, default=100)
    ap.add_argument("--ckpt_dir", required=True)
    ap.add_argument("--ckpt_every", type=int, default=50)
    ap.add_argument("--progress", required=True)
    args = ap.parse_args()

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report(args.progress, event="pid", rank=rank, pid=os.getpid(), restart=restart)
    torch.manual_seed(args.seed)

    d = args.data_dir
    train = TensorBatches(
        read_idx_images(os.path.join(d, "train-images-idx3-ubyte.gz")),
        read_idx_labels(os.path.join(d, "train-labels-idx1-ubyte.gz")),
    )
    test_x = read_idx_images(os.path.join(d, "t10k-images-idx3-ubyte.gz"))
    test_y = read_idx_labels(os.path.join(d, "t10k-labels-idx1-ubyte.gz"))
    sampler = DistributedSampler(
        train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    batches = BatchSampler(sampler, batch_size=args.batch_size, drop_last=True)
    steps_per_epoch = len(batches)
    total_steps = min(args.steps, args.epochs * steps_per_epoch)

    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, args.warmup_steps, total_steps)
    )

    step = 0
    ckpt = os.path.join(args.ckpt_dir, "checkpoint.pt")
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step = state["step"]
    if rank == 0:
        report(args.progress, event="start", restart=restart, resumed_step=step, world=world)

    model.train()
    while step < total_steps:
        epoch, offset = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        for idx in itertools.islice(batches, offset, None):
            x, y = train[idx]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
            step += 1
            if rank == 0:
                report(args.progress, event="step", step=step, restart=restart)
                if step % args.ckpt_every == 0:
                    save_checkpoint(
                        args.ckpt_dir,
                        {
                            "model": model.module.state_dict(),
                            "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(),
                            "step": step,
                        },
                    )
            if step >= total_steps:
                break

    model.eval()
    n_test = test_x.shape[0]
    lo, hi = rank * n_test // world, (rank + 1) * n_test // world
    with torch.no_grad():
        logits = model.module(test_x[lo:hi])
        sums = torch.tensor(
            [(logits.argmax(dim=1) == test_y[lo:hi]).sum().item(), float(hi - lo)],
            dtype=torch.float64,
        )
    dist.all_reduce(sums)
    correct, count = sums.tolist()
    if rank == 0:
        report(args.progress, event="final", steps=step, test_accuracy=round(correct / count, 6))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
