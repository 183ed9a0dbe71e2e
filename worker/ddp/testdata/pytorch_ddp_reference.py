"""Reference run of PyTorch DDP for Chorus's parity test.

Usage: /usr/bin/python3 pytorch_ddp_reference.py OUT_DIR STEPS

Writes to OUT_DIR:
  model.pt   TorchScript MLP holding the initial weights
  x.bin      float32 inputs, shape [STEPS, 2 * 4, 10]
  y.bin      int64 class labels, shape [STEPS, 2 * 4]
  final.bin  float32 parameters after STEPS steps of PyTorch DDP (gloo, 2
             processes, SGD lr 0.05 momentum 0.9), concatenated in
             named_parameters() order
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WORLD = 2
BATCH = 4


def make_model():
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 3))


def train(rank, out_dir, steps):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out_dir, "rendezvous"),
                            rank=rank, world_size=WORLD)
    model = make_model()
    model.load_state_dict(torch.load(os.path.join(out_dir, "initial_state.pt")))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x = torch.load(os.path.join(out_dir, "x.pt"))
    y = torch.load(os.path.join(out_dir, "y.pt"))
    for s in range(steps):
        opt.zero_grad()
        xs = x[s, rank * BATCH:(rank + 1) * BATCH]
        ys = y[s, rank * BATCH:(rank + 1) * BATCH]
        nn.functional.cross_entropy(ddp(xs), ys).backward()
        opt.step()
    if rank == 0:
        flat = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
        flat.numpy().astype("float32").tofile(os.path.join(out_dir, "final.bin"))
    dist.destroy_process_group()


def main():
    out_dir, steps = sys.argv[1], int(sys.argv[2])
    os.makedirs(out_dir, exist_ok=True)
    # Gloo must bind loopback only.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.manual_seed(0)
    model = make_model()
    torch.save(model.state_dict(), os.path.join(out_dir, "initial_state.pt"))
    torch.jit.script(model).save(os.path.join(out_dir, "model.pt"))
    x = torch.randn(steps, WORLD * BATCH, 10)
    y = torch.randint(0, 3, (steps, WORLD * BATCH))
    torch.save(x, os.path.join(out_dir, "x.pt"))
    torch.save(y, os.path.join(out_dir, "y.pt"))
    x.numpy().astype("float32").tofile(os.path.join(out_dir, "x.bin"))
    y.numpy().astype("int64").tofile(os.path.join(out_dir, "y.bin"))
    mp.spawn(train, args=(out_dir, steps), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
