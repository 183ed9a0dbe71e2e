#!/usr/bin/env python3
"""Point-to-point exchanges on Chorus's `chorus` backend (docs/python.md).

Run from the repository root, after python/install.sh, as a `program` job
of 2 or more ranks (tests/python_p2p_e2e_test.sh does):

  python_p2p.py --mode ring       every rank isends to its right and irecvs
                                  from its left, then waits: in both orders,
                                  and as one batch_isend_irecv
  python_p2p.py --mode pipeline   a 1F1B pipeline, one Linear+tanh stage per
                                  rank, on isend/irecv; each stage ends with
                                  the parameters a single process computes
                                  from the same micro-batches
  python_p2p.py --mode moe        a mixture-of-experts layer, one expert per
                                  rank: tokens go to their expert and back
                                  with all_to_all_single (uneven splits); each
                                  token's output equals the layer's in one
                                  process

Each rank prints "ring: rank R ok ..." or "pipeline: rank R stage max diff
D" and exits 1 on a wrong value. --backend gloo runs the same on PyTorch's
gloo (env://, as torchrun sets it up) for comparison. With --stall_rank R,
rank R of the ring sends but does not post its first receive, and sleeps
--stall_seconds instead (for the hang detector).
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist

WIDTH, BATCH = 16, 8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    p.add_argument("--mode", choices=["ring", "pipeline", "moe"], required=True)
    p.add_argument("--rounds", type=int, default=5, help="ring: exchanges per order")
    p.add_argument("--micro_batches", type=int, default=6)
    p.add_argument("--steps", type=int, default=3, help="pipeline: optimizer steps")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--stall_rank", type=int, default=-1)
    p.add_argument("--stall_seconds", type=float, default=60)
    return p.parse_args()


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


def ring(rank, size, rounds, stall_rank=-1, stall_seconds=0):
    right, left = (rank + 1) % size, (rank - 1) % size
    if rank == stall_rank:
        dist.isend(torch.zeros(1000, dtype=torch.float64), right)
        print(f"ring: rank {rank} sent and stalls for {stall_seconds} s", flush=True)
        time.sleep(stall_seconds)
        sys.exit(3)
    for order in ("send_first", "recv_first", "batch"):
        for r in range(rounds):
            out = torch.full((1000,), float(100 * r + rank), dtype=torch.float64)
            got = torch.zeros(1000, dtype=torch.float64)
            if order == "batch":
                ops = [dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, got, left)]
                works = dist.batch_isend_irecv(ops)
            elif order == "send_first":
                works = [dist.isend(out, right), dist.irecv(got, left)]
            else:
                works = [dist.irecv(got, left), dist.isend(out, right)]
            for w in works:
                w.wait()
            check(torch.equal(got, torch.full((1000,), float(100 * r + left), dtype=torch.float64)),
                  f"rank {rank} {order} round {r}: got {got[0].item()} from rank {left}")
    print(f"ring: rank {rank} ok: {3 * rounds} exchanges with ranks {left} and {right}", flush=True)


def stages(size):
    """The whole model, seeded alike everywhere: one Linear+tanh per stage."""
    torch.manual_seed(0)
    return [torch.nn.Linear(WIDTH, WIDTH).double() for _ in range(size)]


def micro_batches(step, count):
    g = torch.Generator().manual_seed(1000 + step)
    xs = [torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64) for _ in range(count)]
    ys = [torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64) for _ in range(count)]
    return xs, ys


def loss_of(out, y, count):
    return ((out - y) ** 2).mean() / count


def reference(size, args):
    """The same training in one process: every stage in turn, gradients
    accumulated over the micro-batches in their order."""
    layers = stages(size)
    for step in range(args.steps):
        xs, ys = micro_batches(step, args.micro_batches)
        for x, y in zip(xs, ys):
            h = x
            for layer in layers:
                h = torch.tanh(layer(h))
            loss_of(h, y, args.micro_batches).backward()
        with torch.no_grad():
            for layer in layers:
                for p in layer.parameters():
                    p -= args.lr * p.grad
                    p.grad = None
    return layers


class Stage:
    """This rank's stage of the 1F1B schedule, on isend/irecv."""

    def __init__(self, rank, size, layer, micro):
        self.rank, self.size, self.layer, self.micro = rank, size, layer, micro
        self.first, self.last = rank == 0, rank == size - 1
        self.sends = []
        self.kept = {}  # micro-batch -> (input, output) for its backward

    def forward(self, i, xs, ys):
        if self.first:
            x = xs[i]
        else:
            x = torch.zeros(BATCH, WIDTH, dtype=torch.float64)
            dist.irecv(x, self.rank - 1).wait()
        x.requires_grad_(not self.first)
        out = torch.tanh(self.layer(x))
        if self.last:
            out = loss_of(out, ys[i], self.micro)
        else:
            self.sends.append(dist.isend(out.detach(), self.rank + 1))
        self.kept[i] = (x, out)

    def backward(self, i):
        x, out = self.kept.pop(i)
        if self.last:
            out.backward()
        else:
            grad = torch.zeros(BATCH, WIDTH, dtype=torch.float64)
            dist.irecv(grad, self.rank + 1).wait()
            out.backward(grad)
        if not self.first:
            self.sends.append(dist.isend(x.grad, self.rank - 1))

    def step(self, step, lr):
        xs, ys = micro_batches(step, self.micro)
        warmup = min(self.size - self.rank - 1, self.micro)
        done_forward = done_backward = 0
        for _ in range(warmup):
            self.forward(done_forward, xs, ys)
            done_forward += 1
        while done_forward < self.micro:  # one forward, one backward
            self.forward(done_forward, xs, ys)
            done_forward += 1
            self.backward(done_backward)
            done_backward += 1
        while done_backward < self.micro:
            self.backward(done_backward)
            done_backward += 1
        for w in self.sends:
            w.wait()
        self.sends = []
        with torch.no_grad():
            for p in self.layer.parameters():
                p -= lr * p.grad
                p.grad = None


def pipeline(rank, size, args):
    layer = stages(size)[rank]
    stage = Stage(rank, size, layer, args.micro_batches)
    for step in range(args.steps):
        stage.step(step, args.lr)
    want = reference(size, args)[rank]
    diff = max((a - b).abs().max().item()
               for a, b in zip(layer.parameters(), want.parameters()))
    print(f"pipeline: rank {rank} stage max diff {diff}", flush=True)
    check(diff <= 1e-12, f"rank {rank}: stage parameters differ from the reference by {diff}")


def moe(rank, size):
    torch.manual_seed(0)
    gate = torch.nn.Linear(WIDTH, size).double()
    experts = [torch.nn.Linear(WIDTH, WIDTH).double() for _ in range(size)]
    g = torch.Generator().manual_seed(500 + rank)
    tokens = torch.randn(10 + 3 * rank, WIDTH, generator=g, dtype=torch.float64)
    with torch.no_grad():
        choice = gate(tokens).argmax(dim=1)
        order = torch.argsort(choice, stable=True)
        send_counts = torch.bincount(choice, minlength=size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        sent, received = send_counts.tolist(), recv_counts.tolist()
        mine = torch.empty(sum(received), WIDTH, dtype=torch.float64)
        dist.all_to_all_single(mine, tokens[order], received, sent)        # dispatch
        done = torch.tanh(experts[rank](mine))
        back = torch.empty(len(tokens), WIDTH, dtype=torch.float64)
        dist.all_to_all_single(back, done, sent, received)                 # combine
        out = torch.empty_like(back)
        out[order] = back
        want = torch.stack([torch.tanh(experts[e](t)) for t, e in zip(tokens, choice.tolist())])
    diff = (out - want).abs().max().item()
    print(f"moe: rank {rank} max diff {diff} (sent {sent}, received {received})", flush=True)
    check(diff <= 1e-12, f"rank {rank}: the layer's output differs from one process's by {diff}")


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.backend == "chorus":
        import chorus
        chorus.init_process_group()
    else:
        dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.mode == "ring":
        ring(rank, size, args.rounds, args.stall_rank, args.stall_seconds)
    elif args.mode == "pipeline":
        pipeline(rank, size, args)
    else:
        moe(rank, size)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
