#!/usr/bin/env python3
"""Elastic benchmark driver (tests/bench/elastic_bench.sh documents what it measures).

Standard library only: it starts the two sides as processes and watches what
they write (Chorus' per-rank sample traces, the peer's progress file).
"""

import argparse
import functools
import glob
import json
import os
import random
import signal
import subprocess
import tempfile
import time


import bench_util
from bench_util import Progress, free_port, log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
POLL = 0.02  # seconds between looks at the traces and the progress file
wait_until = functools.partial(bench_util.wait_until, poll=POLL)




# ----------------------------------------------------------------- Chorus


def chorus_spec(steps, max_restarts, epochs):
    """The peer's job (tests/bench/torchrun_elastic_peer.py) as a Chorus spec."""
    return f"""
name: "elastic-bench"
model {{ mlp {{ hidden_sizes: [256, 128] }} }}
loss {{ kind: CROSS_ENTROPY }}
data {{ fashion_mnist {{ dir: "/usr/share/datasets/fashion-mnist" }} }}
training {{ batch_size_per_rank: 64 epochs: {epochs} max_steps: {steps} seed: 1 log_every_steps: 50 }}
optimizer {{ kind: SGD lr: 0.05 momentum: 0.9 }}
lr_schedule {{ cosine {{ warmup_steps: 100 }} }}
strategy {{ ddp {{ bucket_cap_mb: 25 }} }}
resources {{ min_ranks: 4 max_ranks: 4 threads_per_rank: 1 device: CPU }}
elastic {{ max_restarts: {max_restarts} wait_seconds: 60 }}
"""


class Traces:
    """Reads the per-process sample traces (CHORUS_SAMPLE_TRACE) as they grow.

    A line "step G R S ..." says that the process, as rank R of generation G,
    took the batch of step S (0-based): it has finished every step before S.
    """

    def __init__(self, directory):
        self.directory = directory
        self.offsets = {}
        self.rank_of = {}  # pid -> (generation, rank) of its latest step
        self.done = {}  # (generation, step) -> set of ranks
        # Steps every rank of some generation took, kept as lines arrive
        # (recounting on every poll cost the bench's own CPU, growing with
        # the run, on the machine it measures).
        self.world = 4
        self.completed = set()
        self.first_seen = {}  # generation -> (time first seen, first step)

    def poll(self):
        now = time.time()
        for path in glob.glob(os.path.join(self.directory, "*.trace")):
            pid = int(os.path.basename(path).split(".")[0])
            with open(path) as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            cut = data.rfind("\n") + 1  # whole lines only
            self.offsets[path] = self.offsets.get(path, 0) + len(data[:cut].encode())
            for line in data[:cut].splitlines():
                fields = line.split()
                if len(fields) < 4 or fields[0] != "step":
                    continue
                gen, rank, step = int(fields[1]), int(fields[2]), int(fields[3])
                self.rank_of[pid] = (gen, rank)
                ranks = self.done.setdefault((gen, step), set())
                ranks.add(rank)
                if len(ranks) == self.world:
                    self.completed.add(step)
                seen, lowest = self.first_seen.get(gen, (now, step))
                self.first_seen[gen] = (seen, min(lowest, step))

    def steps_of(self, pid):
        return max((s for (g, s), ranks in self.done.items()
                    if self.rank_of.get(pid, (None, None))[0] == g
                    and self.rank_of[pid][1] in ranks), default=0)

    def pid_of(self, generation, rank):
        for pid, (g, r) in self.rank_of.items():
            if g == generation and r == rank:
                return pid
        return None

    def completed_steps(self, world):
        """Steps every rank of some generation finished."""
        assert world == self.world
        return self.completed


# The kill runs train 5 epochs, capped at --steps; the chaos runs as many
# epochs as the chaos window needs (they are stopped when it closes).
KILL_EPOCHS = 5
CHAOS_EPOCHS = 1000


def start_chorus(args, tmp, name, steps, max_restarts, epochs=KILL_EPOCHS):
    spec = os.path.join(tmp, f"{name}.textproto")
    with open(spec, "w") as f:
        f.write(chorus_spec(steps, max_restarts, epochs))
    trace = os.path.join(tmp, f"{name}.trace")
    os.makedirs(trace)
    env = dict(os.environ, CHORUS_SAMPLE_TRACE=trace)
    out = open(os.path.join(tmp, f"{name}.out"), "w")
    err = open(os.path.join(tmp, f"{name}.err"), "w")
    proc = subprocess.Popen(
        [args.chorus, "up", "--local", "5", "--state_dir", os.path.join(tmp, f"{name}.state"),
         spec, "--json"], stdout=out, stderr=err, env=env, start_new_session=True)
    return proc, Traces(trace)


def chorus_kill_run(args, tmp):
    proc, traces = start_chorus(args, tmp, "ours-kill", args.steps, 3)
    try:
        def ready():
            traces.poll()
            pid = traces.pid_of(1, 1)
            return pid if pid and traces.steps_of(pid) >= args.kill_step else None
        victim = wait_until(ready, 300, "Chorus: rank 1 reaching the kill step")
        t0 = traces.first_seen[1][0]
        rate = len(traces.completed_steps(4)) / max(1e-9, time.time() - t0)
        os.kill(victim, signal.SIGKILL)
        killed = time.time()
        killed_at = traces.steps_of(victim)

        # The first step of generation 2 is finished when a rank takes the
        # batch of the next one.
        def recovered():
            traces.poll()
            first = traces.first_seen.get(2)
            return (time.time(), first[1]) if first and (2, first[1] + 1) in traces.done else None
        seen, first_new = wait_until(recovered, 300, "Chorus: a step finished by generation 2")
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
    last_old = max((s for (g, s), r in traces.done.items() if g == 1 and len(r) == 4), default=0)
    with open(os.path.join(tmp, "ours-kill.out")) as f:
        lines = f.read().strip().splitlines()
    final = json.loads(lines[-1]) if lines else {}
    if final.get("state") != "SUCCEEDED":
        raise RuntimeError(f"Chorus job ended {final.get('state')}: {final.get('reason', '')}")
    return {
        "recovery_seconds": seen - killed,
        "killed_at_step": killed_at,
        # Steps 0..last_old-1 were finished by every rank of generation 1
        # (step last_old is the interrupted one).
        "steps_redone": max(0, last_old - first_new),
        "steps_per_second": rate,
        "test_accuracy": final.get("final_metrics", {}).get("test_accuracy"),
    }


def chorus_chaos_run(args, tmp):
    proc, traces = start_chorus(args, tmp, "ours-chaos", 1000000, 1000, CHAOS_EPOCHS)
    rng = random.Random(1)
    kills = 0
    try:
        wait_until(lambda: traces.poll() or len(traces.completed_steps(4)) >= 50, 300,
                   "Chorus: 50 steps before the chaos")
        # The undisturbed rate of this very job, just before the chaos.
        baseline_start = time.time()
        baseline_before = len(traces.completed_steps(4))
        while time.time() < baseline_start + args.baseline_seconds:
            traces.poll()
            time.sleep(POLL)
        traces.poll()
        start = time.time()
        before = len(traces.completed_steps(4))
        baseline = (before - baseline_before) / (start - baseline_start)
        next_kill = start + args.chaos_every
        while time.time() < start + args.chaos_seconds:
            traces.poll()
            if time.time() >= next_kill:
                gen = max(g for g, _ in traces.rank_of.values())
                pid = traces.pid_of(gen, rng.randrange(4))
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
                next_kill += args.chaos_every
            if proc.poll() is not None:
                raise RuntimeError("Chorus: the job ended during the chaos: "
                                   + open(os.path.join(tmp, "ours-chaos.err")).read()[-500:])
            time.sleep(POLL)
        traces.poll()
        steps = len(traces.completed_steps(4)) - before
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
    return {"steps_per_second": steps / args.chaos_seconds, "kills": kills,
            "undisturbed_steps_per_second": baseline}


# ------------------------------------------------------------------- peer





def start_peer(args, tmp, name, steps, max_restarts, epochs=KILL_EPOCHS):
    ckpt = os.path.join(tmp, f"{name}.ckpt")
    os.makedirs(ckpt)
    progress = os.path.join(tmp, f"{name}.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    # --redirects 1 --tee 1: Debian's torch 1.13 under Python 3.11 cannot parse
    # the default "0" (see tests/bench/e2e_bench.sh).
    command = [args.torch_python, "-m", "torch.distributed.run", "--nnodes", "1:2",
               "--nproc_per_node", "4", "--max_restarts", str(max_restarts),
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
               "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(tmp, f"{name}.logs"),
               os.path.join(HERE, "torchrun_elastic_peer.py"), "--ckpt_dir", ckpt,
               "--ckpt_every", str(args.ckpt_every), "--steps", str(steps), "--epochs", str(epochs),
               "--progress", progress]
    out = open(os.path.join(tmp, f"{name}.out"), "w")
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    return proc, Progress(progress)


def peer_kill_run(args, tmp):
    proc, progress = start_peer(args, tmp, "peer-kill", args.steps, 3)
    try:
        def ready():
            progress.poll()
            return len(progress.of("step", restart=0)) >= args.kill_step
        wait_until(ready, 300, "peer: step reaching the kill step")
        pids = {e["rank"]: e["pid"] for e in progress.of("pid", restart=0)}
        steps0 = progress.of("step", restart=0)
        rate = len(steps0) / max(1e-9, steps0[-1]["t"] - progress.of("start", restart=0)[0]["t"])
        os.kill(pids[1], signal.SIGKILL)
        killed = time.time()

        def recovered():
            progress.poll()
            return progress.of("step", restart=1)
        first = wait_until(recovered, 600, "peer: a step after the restart")[0]
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    progress.poll()
    last_old = max(e["step"] for e in progress.of("step", restart=0))
    resumed = progress.of("start", restart=1)[0]["resumed_step"]
    final = progress.of("final")
    if proc.returncode != 0 or not final:
        raise RuntimeError(f"peer: torchrun exited {proc.returncode} without finishing")
    return {
        "recovery_seconds": first["t"] - killed,
        "killed_at_step": last_old,
        "steps_redone": max(0, last_old - resumed),
        "steps_per_second": rate,
        "test_accuracy": final[-1]["test_accuracy"],
    }


def peer_chaos_run(args, tmp):
    proc, progress = start_peer(args, tmp, "peer-chaos", 1000000, 1000, CHAOS_EPOCHS)
    rng = random.Random(1)
    kills = 0
    try:
        wait_until(lambda: progress.poll() or len(progress.of("step")) >= 50, 300,
                   "peer: 50 steps before the chaos")
        baseline_start = time.time()
        while time.time() < baseline_start + args.baseline_seconds:
            progress.poll()
            time.sleep(POLL)
        progress.poll()
        start = time.time()
        in_baseline = [e["step"] for e in progress.of("step") if baseline_start <= e["t"] < start]
        baseline = ((max(in_baseline) - min(in_baseline)) / (start - baseline_start)
                    if in_baseline else 0.0)
        next_kill = start + args.chaos_every
        while time.time() < start + args.chaos_seconds:
            progress.poll()
            if time.time() >= next_kill:
                restart = max(e["restart"] for e in progress.of("pid"))
                pids = [e["pid"] for e in progress.of("pid", restart=restart)]
                try:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass  # that incarnation is already gone
                next_kill += args.chaos_every
            time.sleep(POLL)
        progress.poll()
        end = start + args.chaos_seconds
        # Steps trained in the window that count: the newest incarnation's
        # progress past what an earlier one had reached is new work.
        best = 0
        reached_before = max((e["step"] for e in progress.of("step") if e["t"] < start), default=0)
        for e in progress.of("step"):
            if start <= e["t"] < end:
                best = max(best, e["step"])
        steps = max(0, best - reached_before)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    return {"steps_per_second": steps / args.chaos_seconds, "kills": kills,
            "undisturbed_steps_per_second": baseline}


# ------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chorus", default=os.path.join(ROOT, "bazel-bin/client/chorus"))
    ap.add_argument("--torch_python", default="/usr/bin/python3")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--kill_step", type=int, default=230)
    ap.add_argument("--ckpt_every", type=int, default=50)
    ap.add_argument("--chaos_seconds", type=float, default=60)
    ap.add_argument("--baseline_seconds", type=float, default=15,
                    help="undisturbed window of the chaos run, just before the chaos")
    ap.add_argument("--chaos_every", type=float, default=10)
    ap.add_argument("--skip_chaos", action="store_true")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="chorus-elastic-bench.")
    log(f"elastic_bench: scratch in {tmp}")
    ours = chorus_kill_run(args, tmp)
    log("ours:", json.dumps(ours))
    peer = peer_kill_run(args, tmp)
    log("peer:", json.dumps(peer))
    chaos = {}
    if not args.skip_chaos:
        chaos["ours"] = chorus_chaos_run(args, tmp)
        log("ours under chaos:", json.dumps(chaos["ours"]))
        chaos["peer"] = peer_chaos_run(args, tmp)
        log("peer under chaos:", json.dumps(chaos["peer"]))

    peer_name = (f"torchrun --nnodes 1:2 --max_restarts 3 (c10d) + PyTorch DDP, "
                 f"checkpoint every {args.ckpt_every} steps")

    def line(metric, unit, a, b, **extra):
        ratio = round(a / b, 4) if a is not None and b else None
        print(json.dumps(dict({"bench": "elastic_bench", "metric": metric, "unit": unit,
                               "ours": round(a, 4), "peer": round(b, 4), "peer_name": peer_name,
                               "ratio": ratio}, **extra)), flush=True)

    print(json.dumps({"bench": "elastic_bench", "metric": "steps_redone", "unit": "steps",
                      "ours": ours["steps_redone"], "peer": peer["steps_redone"],
                      "peer_name": peer_name, "ratio": None}), flush=True)
    if chaos:
        line("throughput_under_chaos_fraction", "fraction of undisturbed steps/s",
             chaos["ours"]["steps_per_second"] / chaos["ours"]["undisturbed_steps_per_second"],
             chaos["peer"]["steps_per_second"] / chaos["peer"]["undisturbed_steps_per_second"],
             kill_every_seconds=args.chaos_every, window_seconds=args.chaos_seconds)
    line("recovery_seconds", "s", ours["recovery_seconds"], peer["recovery_seconds"],
         kill_step=args.kill_step)


if __name__ == "__main__":
    main()
