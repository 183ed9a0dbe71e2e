"""PyTorch's side of Chorus's ddp_cuda_bench: the step time of a model on one
GPU per process, with PyTorch DDP over NCCL and without DDP.

Usage: python3 pytorch_ddp_cuda_bench.py OUT_FILE MODEL GPUS BATCH WARMUP BLOCKS STEPS [VIEW [TRACE_DIR]]

VIEW 1 runs DDP with gradient_as_bucket_view=True (default 0, PyTorch's default).
With TRACE_DIR, rank 0 then profiles 10 more steps of each loop with
torch.profiler and writes Chrome traces pytorch_plain_MODEL.json and
pytorch_ddp_MODEL.json there (the names ddp_cuda_bench --trace uses).

MODEL is "mlp" (784-2048x4-10, 14.2 M parameters) or "cnn" (the bench's
VGG-style network for 3x32x32 images, 9.2 M parameters). Each process trains
with SGD (lr 0.01) on fixed random data. A block is STEPS steps between two
device synchronizations; the figure is the median block's time per step, in
milliseconds. Rank 0 writes two lines to OUT_FILE: "ddp MS" and "plain MS"
(the same loop on one GPU without DDP, run before DDP is set up), then
"version" and PyTorch's version.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def make_model(name):
    if name == "mlp":
        layers, width = [], 784
        for _ in range(4):
            layers += [nn.Linear(width, 2048), nn.ReLU()]
            width = 2048
        layers.append(nn.Linear(width, 10))
        return nn.Sequential(*layers)
    layers, width = [], 3
    for channels, pool in ((64, False), (128, True), (256, False), (256, True), (512, False),
                           (512, True), (512, False), (512, False)):
        layers += [nn.Conv2d(width, channels, 3, padding=1), nn.ReLU()]
        if pool:
            layers.append(nn.MaxPool2d(2))
        width = channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def batch(name, size, device):
    shape = (size, 784) if name == "mlp" else (size, 3, 32, 32)
    return torch.randn(*shape, device=device), torch.randint(0, 10, (size,), device=device)


def make_step(model, opt, x, y):
    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def trace_steps(path, step):
    """Runs 10 steps; with a path, under the profiler, whose trace goes there."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    if not path:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        return
    with torch.profiler.profile(activities=activities) as prof:
        torch.cuda.synchronize()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)


def median_step_ms(step, warmup, blocks, steps):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(blocks):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000 / steps)
    times.sort()
    return times[len(times) // 2]


def run(rank, rendezvous, out_file, name, gpus, size, warmup, blocks, steps, view, trace_dir):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    torch.manual_seed(0)
    x, y = batch(name, size, device)
    plain = make_model(name).to(device)
    plain_step = make_step(plain, torch.optim.SGD(plain.parameters(), lr=0.01), x, y)
    plain_ms = median_step_ms(plain_step, warmup, blocks, steps)

    def trace_path(side):
        if rank != 0 or not trace_dir:
            return None
        return os.path.join(trace_dir, "pytorch_%s_%s.json" % (side, name))

    if trace_dir:
        trace_steps(trace_path("plain"), plain_step)
    dist.init_process_group("nccl", init_method="file://" + rendezvous, rank=rank,
                            world_size=gpus)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model(name).to(device), device_ids=[rank],
                                                gradient_as_bucket_view=view)
    ddp_step = make_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y)
    ddp_ms = median_step_ms(ddp_step, warmup, blocks, steps)
    if trace_dir:
        trace_steps(trace_path("ddp"), ddp_step)
    if rank == 0:
        with open(out_file, "w") as f:
            f.write("ddp %.4f\nplain %.4f\nversion %s\n" % (ddp_ms, plain_ms, torch.__version__))
    dist.destroy_process_group()


def main():
    out_file, name = sys.argv[1], sys.argv[2]
    gpus, size, warmup, blocks, steps = (int(v) for v in sys.argv[3:8])
    view = len(sys.argv) > 8 and sys.argv[8] == "1"
    trace_dir = sys.argv[9] if len(sys.argv) > 9 else None
    rendezvous = os.path.join(tempfile.mkdtemp(), "rendezvous")
    mp.spawn(run, args=(rendezvous, out_file, name, gpus, size, warmup, blocks, steps, view,
                         trace_dir),
             nprocs=gpus, join=True)


if __name__ == "__main__":
    main()
