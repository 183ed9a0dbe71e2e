# PyTorch peer of tests/bench/checkpoint_bench.sh: the training stall of a
# checkpoint taken with torch.save inside a plain PyTorch training loop.
#
# The job is the Chorus side's: MLP 1024 -> 5000 -> ReLU -> 4000 -> ReLU -> 10
# (~25.2M float32 parameters, ~100 MB), SGD with momentum 0.9 (momentum buffers,
# another ~100 MB), cross-entropy, batches of 32 random samples, 2 intra-op
# threads, --steps steps (default 40). Every --every steps (default 10) the loop
# calls
#   torch.save({'model': model.state_dict(), 'optimizer': opt.state_dict(),
#               'step': step}, DIR/ckpt_step<step>.pt)
# as users do; torch.save blocks the loop, so its duration is the stall. An
# os.fsync of the file follows, timed separately (torch.save alone does not make
# the checkpoint durable). As with Chorus' keep_last: 2, only the newest two
# files are kept (older ones are removed outside the timed regions).
#
#   /usr/bin/python3 tests/bench/torch_save_peer.py --dir DIR [--steps 40] [--every 10]
#
# Output (stdout): one line per checkpoint
#   save step=S torch_save_s=X fsync_s=Y bytes=B
# then, last, one JSON line:
#   {"torch_save_median_s": X, "fsync_median_s": Y, "save_plus_fsync_median_s": Z,
#    "bytes": B, "saves": N, "torch_save_s": [...], "fsync_s": [...],
#    "step_time_median_s": T, "torch": "1.13...", "threads": 2}
# (step_time_median_s: the median training step, checkpoint excluded.)
import argparse
import json
import os
import statistics
import sys
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True, help="directory for the checkpoint files (same disk as Chorus' state dir)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--keep_last", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.steps < 1 or args.every < 1:
        sys.exit("torch_save_peer: --steps and --every must be >= 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 5000), torch.nn.ReLU(),
        torch.nn.Linear(5000, 4000), torch.nn.ReLU(),
        torch.nn.Linear(4000, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    g = torch.Generator().manual_seed(0)
    n = 2048
    x_all = torch.randn(n, 1024, generator=g)
    y_all = torch.randint(0, 10, (n,), generator=g)
    batch = 32

    saves, fsyncs, step_times, kept = [], [], [], []
    size = 0
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        lo = ((step - 1) * batch) % (n - batch)
        x, y = x_all[lo:lo + batch], y_all[lo:lo + batch]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - t0)
        if step % args.every == 0:
            path = os.path.join(args.dir, "ckpt_step%d.pt" % step)
            t0 = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
            t1 = time.perf_counter()
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            t2 = time.perf_counter()
            size = os.path.getsize(path)
            saves.append(t1 - t0)
            fsyncs.append(t2 - t1)
            print("save step=%d torch_save_s=%.4f fsync_s=%.4f bytes=%d loss=%.4f"
                  % (step, t1 - t0, t2 - t1, size, loss.item()), flush=True)
            kept.append(path)
            while len(kept) > args.keep_last:
                os.remove(kept.pop(0))

    if not saves:
        sys.exit("torch_save_peer: no checkpoint taken (--steps < --every)")
    print(json.dumps({
        "torch_save_median_s": round(statistics.median(saves), 6),
        "fsync_median_s": round(statistics.median(fsyncs), 6),
        "save_plus_fsync_median_s": round(statistics.median([a + b for a, b in zip(saves, fsyncs)]), 6),
        "bytes": size,
        "saves": len(saves),
        "torch_save_s": [round(v, 6) for v in saves],
        "fsync_s": [round(v, 6) for v in fsyncs],
        "step_time_median_s": round(statistics.median(step_times), 6),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }), flush=True)


if __name__ == "__main__":
    main()
