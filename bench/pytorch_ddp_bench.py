"""PyTorch DDP step time, the peer of Chorus's ddp_bench.

Usage: /usr/bin/python3 pytorch_ddp_bench.py OUT_FILE WARMUP STEPS VIEW HIDDEN...

VIEW is 1 for gradient_as_bucket_view=True, 0 for PyTorch's default.

Trains an MLP 784-HIDDEN...-10 with SGD (lr 0.01) on random data, batch 64 per
rank, 2 processes x 1 thread, gloo on loopback, PyTorch's default DDP options.
Rank 0 writes the median step time in milliseconds to OUT_FILE.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WORLD = 2
BATCH = 64


def make_model(hidden):
    layers, width = [], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def run(rank, rendezvous, out_file, warmup, steps, view, hidden):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank,
                            world_size=WORLD)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model(hidden),
                                                gradient_as_bucket_view=view)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, 784)
    y = torch.randint(0, 10, (BATCH,))
    times = []
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        elapsed = (time.perf_counter() - start) * 1000
        if i >= warmup:
            times.append(elapsed)
    if rank == 0:
        times.sort()
        with open(out_file, "w") as f:
            f.write("%.4f\n" % times[len(times) // 2])
    dist.destroy_process_group()


def main():
    out_file, warmup, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    view = sys.argv[4] == "1"
    hidden = [int(h) for h in sys.argv[5:]]
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(run, args=(os.path.join(d, "rendezvous"), out_file, warmup, steps, view, hidden),
                 nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
