#!/usr/bin/env python3
"""PyTorch DDP peer of examples/fashion_mnist_mlp_ddp.textproto.

Trains the same job as the Chorus spec, with plain PyTorch, so that
tests/bench/e2e_bench.sh can compare the two end to end:

  model     flatten 784 -> Linear 256 -> ReLU -> Linear 128 -> ReLU -> Linear 10
  loss      cross-entropy
  data      Fashion-MNIST IDX gz files, pixels / 255, then (x - 0.2860) / 0.3530
  batches   64 per rank; every epoch shuffled with seed 1, each rank a disjoint
            share, remainder dropped (DistributedSampler(shuffle=True, seed=1,
            drop_last=True) + drop_last batching)
  epochs    5  (2 ranks: 5 * floor(60000 / 128) = 2340 steps)
  optimizer SGD lr 0.05 momentum 0.9
  lr        linear warmup lr * (step + 1) / 100 for 100 steps, then cosine
            decay to 0 at the final step
  threads   1 per rank
  eval      the full 10k test split at the end, each rank half of it, sums
            all-reduced

Run it with torchrun (the gloo backend, loopback only):

  OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo /usr/bin/python3 -m torch.distributed.run \
      --standalone --nproc_per_node 2 tests/bench/torchrun_fashion_mnist.py

Rank 0 ends with one machine-readable line:

  FINAL {"test_accuracy": ..., "test_loss": ..., "train_loss": ..., "steps": ...,
         "wall_seconds": ...}

wall_seconds there is measured inside rank 0 from interpreter start of this
script (after `import torch`) to the end of evaluation; the benchmark itself
times the whole torchrun command from outside.
"""

import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

_T0 = time.monotonic()

MEAN = 0.2860
STD = 0.3530


def read_idx_images(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, n, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != 2051:
        raise ValueError(f"{path}: bad IDX image magic {magic}")
    pixels = np.frombuffer(raw, dtype=np.uint8, count=n * rows * cols, offset=16)
    x = pixels.astype(np.float32).reshape(n, rows * cols) / 255.0
    return torch.from_numpy((x - MEAN) / STD)


def read_idx_labels(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, n = struct.unpack(">II", raw[:8])
    if magic != 2049:
        raise ValueError(f"{path}: bad IDX label magic {magic}")
    labels = np.frombuffer(raw, dtype=np.uint8, count=n, offset=8)
    return torch.from_numpy(labels.astype(np.int64))


class TensorBatches(Dataset):
    """Indexing with a list of sample indices returns that whole batch."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, idx):
        idx = torch.as_tensor(idx)
        return self.x[idx], self.y[idx]


def make_model():
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 256),
        nn.ReLU(),
        nn.Linear(256, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def lr_factor(step, warmup, total):
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--warmup_steps", type=int, default=100)
    ap.add_argument("--bucket_cap_mb", type=float, default=25)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    d = args.data_dir
    train_x = read_idx_images(os.path.join(d, "train-images-idx3-ubyte.gz"))
    train_y = read_idx_labels(os.path.join(d, "train-labels-idx1-ubyte.gz"))
    test_x = read_idx_images(os.path.join(d, "t10k-images-idx3-ubyte.gz"))
    test_y = read_idx_labels(os.path.join(d, "t10k-labels-idx1-ubyte.gz"))

    train = TensorBatches(train_x, train_y)
    sampler = DistributedSampler(
        train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    # The sampler yields whole batches of indices (remainder dropped); the
    # dataset gathers each batch with one tensor index instead of 64 lookups.
    loader = DataLoader(
        train,
        sampler=BatchSampler(sampler, batch_size=args.batch_size, drop_last=True),
        batch_size=None,
        num_workers=0,
    )
    steps_per_epoch = len(loader)
    total_steps = args.epochs * steps_per_epoch

    model = DDP(make_model(), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, args.warmup_steps, total_steps)
    )

    model.train()
    step = 0
    last_loss = float("nan")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        epoch_loss, epoch_batches = 0.0, 0
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            epoch_loss += loss.item()
            epoch_batches += 1
        last_loss = epoch_loss / max(1, epoch_batches)
        if rank == 0:
            print(
                f"epoch {epoch} steps {step}/{total_steps} train_loss {last_loss:.4f} "
                f"{time.monotonic() - _T0:.1f}s",
                file=sys.stderr,
                flush=True,
            )

    # Evaluation: each rank its contiguous share of the test split; sums all-reduced.
    model.eval()
    n_test = test_x.shape[0]
    lo, hi = rank * n_test // world, (rank + 1) * n_test // world
    with torch.no_grad():
        logits = model.module(test_x[lo:hi])
        sums = torch.tensor(
            [
                F.cross_entropy(logits, test_y[lo:hi], reduction="sum").item(),
                (logits.argmax(dim=1) == test_y[lo:hi]).sum().item(),
                float(hi - lo),
                last_loss,
            ],
            dtype=torch.float64,
        )
    dist.all_reduce(sums)
    test_loss, correct, count, train_loss_sum = sums.tolist()

    if rank == 0:
        final = {
            "test_accuracy": round(correct / count, 6),
            "test_loss": round(test_loss / count, 6),
            "train_loss": round(train_loss_sum / world, 6),
            "steps": step,
            "wall_seconds": round(time.monotonic() - _T0, 3),
        }
        print("FINAL " + json.dumps(final), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
