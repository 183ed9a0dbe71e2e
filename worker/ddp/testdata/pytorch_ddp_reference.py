"""Reference run of PyTorch DDP for Chorus's parity test.

Usage: python3 pytorch_ddp_reference.py OUT_DIR STEPS [--device cuda] [--world N]

Writes to OUT_DIR:
  model.pt     TorchScript MLP holding the initial weights
  initial.bin  float32 initial parameters, concatenated in named_parameters()
               order (for callers that build the same MLP themselves)
  x.bin        float32 inputs, shape [STEPS, WORLD * 4, 10]
  y.bin        int64 class labels, shape [STEPS, WORLD * 4]
  final.bin    float32 parameters after STEPS steps of PyTorch DDP (WORLD
               processes, SGD lr 0.05 momentum 0.9), concatenated in
               named_parameters() order

On the CPU (the default) the processes use gloo and WORLD is 2; with
--device cuda they use NCCL, one GPU each, and WORLD defaults to 1.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

BATCH = 4


def make_model():
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 3))


def flat_parameters(model):
    return torch.cat([p.detach().cpu().reshape(-1) for _, p in model.named_parameters()])


def train(rank, out_dir, steps, world, device):
    torch.set_num_threads(1)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method="file://" + os.path.join(out_dir, "rendezvous"),
                            rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    model = make_model()
    model.load_state_dict(torch.load(os.path.join(out_dir, "initial_state.pt")))
    model.to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x = torch.load(os.path.join(out_dir, "x.pt")).to(dev)
    y = torch.load(os.path.join(out_dir, "y.pt")).to(dev)
    for s in range(steps):
        opt.zero_grad()
        xs = x[s, rank * BATCH:(rank + 1) * BATCH]
        ys = y[s, rank * BATCH:(rank + 1) * BATCH]
        nn.functional.cross_entropy(ddp(xs), ys).backward()
        opt.step()
    if rank == 0:
        flat_parameters(model).numpy().astype("float32").tofile(
            os.path.join(out_dir, "final.bin"))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--world", type=int, default=0)
    args = parser.parse_args()
    world = args.world or (1 if args.device == "cuda" else 2)
    out_dir, steps = args.out_dir, args.steps
    os.makedirs(out_dir, exist_ok=True)
    # Gloo must bind loopback only.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.manual_seed(0)
    model = make_model()
    torch.save(model.state_dict(), os.path.join(out_dir, "initial_state.pt"))
    flat_parameters(model).numpy().astype("float32").tofile(os.path.join(out_dir, "initial.bin"))
    if args.device == "cpu":
        torch.jit.script(model).save(os.path.join(out_dir, "model.pt"))
    x = torch.randn(steps, world * BATCH, 10)
    y = torch.randint(0, 3, (steps, world * BATCH))
    torch.save(x, os.path.join(out_dir, "x.pt"))
    torch.save(y, os.path.join(out_dir, "y.pt"))
    x.numpy().astype("float32").tofile(os.path.join(out_dir, "x.bin"))
    y.numpy().astype("int64").tofile(os.path.join(out_dir, "y.bin"))
    mp.spawn(train, args=(out_dir, steps, world, args.device), nprocs=world, join=True)


if __name__ == "__main__":
    main()
