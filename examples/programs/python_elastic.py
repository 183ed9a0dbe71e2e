#!/usr/bin/env python3
"""An elastic PyTorch DDP script on the chorus package (docs/python.md,
"Elastic scripts"). Run from the repository root, after python/install.sh:

  chorus up --local 3 examples/programs/python_elastic.yaml

Two ranks train a small MLP with DistributedDataParallel on a fixed
synthetic set; the third slot is a spare. When a rank is lost (kill -9 its
python), the survivor's collective fails; it keeps its process and memory,
joins the next generation (chorus.join_next_generation), and every member,
the newcomer on the spare slot included, takes the newest state any member
holds (chorus.share_newest_state): model, optimizer (momentum) and the data
position. No step is redone, and with the same number of ranks the result is
bit for bit that of an undisturbed run. A drain or a growth is taken at a
step boundary (chorus.reform_requested).

It prints "joined: rank R of W generation G pid P" after each join,
"state: rank R generation G held H now step S from rank X" after each
share, "progress: rank R step S" every 50 steps and, at the end,
"final: rank R generation G step S params_digest D".
"""

import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import chorus

FEATURES, CLASSES, SAMPLES = 32, 10, 8192


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--step_sleep_ms", type=float, default=0,
                   help="pause after each step (so that a test can act mid-run)")
    p.add_argument("--progress", default="",
                   help="append JSON-lines events (pid, start, step, final; restart = "
                        "generation - 1) to this file, as tests/bench/torchrun_checkpointed_mlp.py "
                        "does, for tests/bench/python_bench.py")
    return p.parse_args()


def emit(path, **fields):
    if not path:
        return
    fields["t"] = time.time()
    fields["restart"] = chorus.generation() - 1
    fields["rank"] = chorus.rank()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    finally:
        os.close(fd)


def digest(net):
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Trainer:
    def __init__(self, args):
        self.args = args
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(SAMPLES, FEATURES, generator=g)
        self.y = (self.x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(dim=1)
        torch.manual_seed(7)
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)
        # Where the data stands: part of the state that members share.
        self.position = {"step": 0, "offset": 0}
        self.ddp = None

    def state(self):
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "position": dict(self.position)}

    def form(self, held):
        """After joining: the newest state of any member, then DDP on the
        generation's process group."""
        print(f"joined: rank {chorus.rank()} of {chorus.world_size()} generation "
              f"{chorus.generation()} pid {os.getpid()}", flush=True)
        step, shared = chorus.share_newest_state(held, self.state())
        if step >= 0:
            self.net.load_state_dict(shared["model"])
            self.optimizer.load_state_dict(shared["optimizer"])
            self.position = dict(shared["position"])
        print(f"state: rank {chorus.rank()} generation {chorus.generation()} held {held} now "
              f"step {self.position['step']} digest {digest(self.net)}", flush=True)
        emit(self.args.progress, event="start", resumed_step=self.position["step"])
        self.ddp = DDP(self.net)

    def reform(self, error):
        """Joins the next generation; False: this rank is not part of it."""
        self.ddp = None  # its hooks go with it, before the next backward
        if not chorus.join_next_generation(error):
            print(f"left: rank {chorus.rank()} at step {self.position['step']}", flush=True)
            return False
        self.form(self.position["step"])
        return True

    def train_step(self):
        """One step; the state changes only once the gradients are synchronized."""
        world, rank, batch = chorus.world_size(), chorus.rank(), self.args.batch
        if self.position["offset"] + world * batch > SAMPLES:
            self.position["offset"] = 0
        with chorus.phase("DATA"):
            lo = self.position["offset"] + rank * batch
            xb, yb = self.x[lo:lo + batch], self.y[lo:lo + batch]
        self.optimizer.zero_grad()
        with chorus.phase("FORWARD"):
            loss = F.cross_entropy(self.ddp(xb), yb)
        with chorus.phase("BACKWARD"):
            loss.backward()
        with chorus.phase("OPTIMIZER"):
            self.optimizer.step()
        self.position["step"] += 1
        self.position["offset"] += world * batch
        chorus.step(self.position["step"], loss=loss.item(), samples=batch)
        emit(self.args.progress, event="step", step=self.position["step"])

    def run(self):
        emit(self.args.progress, event="pid", pid=os.getpid())
        self.form(-1)  # a newcomer holds nothing; at the start, rank 0's model
        while self.position["step"] < self.args.steps:
            error = None
            try:
                if chorus.reform_requested():
                    if not self.reform(None):
                        return 0
                    continue
                self.train_step()
            except RuntimeError as e:
                if not chorus.membership_lost(e):
                    raise
                error = str(e).splitlines()[0]
            if error is not None:
                print(f"lost: rank {chorus.rank()} at step {self.position['step']}: {error}",
                      flush=True)
                if not self.reform(error):
                    return 0
                continue
            if self.position["step"] % 50 == 0:
                print(f"progress: rank {chorus.rank()} step {self.position['step']}", flush=True)
            if self.args.step_sleep_ms:
                time.sleep(self.args.step_sleep_ms / 1000)
        print(f"final: rank {chorus.rank()} generation {chorus.generation()} step "
              f"{self.position['step']} params_digest {digest(self.net)}", flush=True)
        emit(self.args.progress, event="final", step=self.position["step"])
        return 0


def main():
    args = parse_args()
    torch.set_num_threads(1)
    chorus.init_process_group()
    return Trainer(args).run()


if __name__ == "__main__":
    sys.exit(main())
