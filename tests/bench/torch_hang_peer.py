# PyTorch DDP (gloo) peer of tests/bench/hang_bench.sh: the same small job as
# the Chorus side (MLP 32-64-ReLU-4 on synthetic data, SGD, 32 samples per rank
# per step) with the same fault injected on rank 1 at step 10.
#
# Run by torchrun, one process per rank:
#   python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
#     --redirects 1 --tee 1 tests/bench/torch_hang_peer.py --fault never_joined
#
#   --fault never_joined  rank 1 sleeps --sleep_seconds (default 150) before its
#                         step 10 while rank 0 waits in DDP's gradient all-reduce.
#   --fault mismatch      at step 10 every rank issues two extra all-reduces,
#                         4 floats then 8 floats; rank 1 issues them in the
#                         opposite order.
#   --fault none          no fault (a healthy run of --steps steps).
#   --timeout_seconds     the process group's timeout (default 60).
#   --backend chorus      the same job on the chorus package's backend, as a
#                         Chorus program job (tests/bench/python_bench.py).
#
# Output (stdout, flushed, nothing per step):
#   FAULT unix_us=N                  rank 1, when the fault starts
#   DETECTED unix_us=N rank=R ERROR=...   a rank caught an exception (then exits 1)
#   DONE rank=R steps=S              a rank finished all steps
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def now_us():
    return int(time.time() * 1e6)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=["never_joined", "mismatch", "none"], required=True)
    p.add_argument("--at_step", type=int, default=10)
    p.add_argument("--sleep_seconds", type=float, default=150.0)
    p.add_argument("--timeout_seconds", type=float, default=60.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--backend", choices=["gloo", "chorus"], default="gloo",
                   help="chorus: the same job on the chorus package's backend, run as a "
                        "Chorus program job (tests/bench/python_bench.py)")
    # Not used by the script: the caller passes its own temp dir so that it can
    # find (and end) exactly its own processes by their command line.
    p.add_argument("--run_dir", default="")
    args = p.parse_args()

    torch.set_num_threads(1)
    if args.backend == "chorus":
        import chorus
        chorus.init_process_group()
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_seconds))
    rank = dist.get_rank()
    world = dist.get_world_size()

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    # Synthetic classification data: 8192 samples, 32 features, 4 classes.
    g = torch.Generator().manual_seed(0)
    n = 8192
    x_all = torch.randn(n, 32, generator=g)
    y_all = torch.randint(0, 4, (n,), generator=g)
    batch = 32
    per_step = batch * world

    step = 0
    try:
        for step in range(args.steps):
            if step == args.at_step and args.fault == "never_joined" and rank == 1:
                print(f"FAULT unix_us={now_us()}", flush=True)
                time.sleep(args.sleep_seconds)
            if step == args.at_step and args.fault == "mismatch":
                if rank == 1:
                    print(f"FAULT unix_us={now_us()}", flush=True)
                    dist.all_reduce(torch.ones(8))
                    dist.all_reduce(torch.ones(4))
                else:
                    dist.all_reduce(torch.ones(4))
                    dist.all_reduce(torch.ones(8))
            lo = (step * per_step + rank * batch) % (n - batch)
            x, y = x_all[lo:lo + batch], y_all[lo:lo + batch]
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP's gradient all-reduce
            opt.step()
    except Exception as e:  # noqa: BLE001 - any failure is the detection
        msg = " ".join(str(e).split("\n"))[:500]
        print(f"DETECTED unix_us={now_us()} rank={rank} ERROR={msg}", flush=True)
        sys.stdout.flush()
        os._exit(1)
    print(f"DONE rank={rank} steps={step + 1}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
