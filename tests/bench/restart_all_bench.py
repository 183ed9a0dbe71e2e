#!/usr/bin/env python3
"""Restart-all bench: recovery of an unmodified torchrun script, Chorus vs. torchrun.

What it measures
    One script, tests/bench/torchrun_checkpointed_mlp.py (an MLP trained with
    PyTorch DDP over gloo, a checkpoint after every step, resumed from when
    TORCHELASTIC_RESTART_COUNT > 0), runs with 2 ranks
      ours: as a Chorus program job with `elastic { max_restarts: 3 }`
            (`chorus up --local 2`): restart-all (Note [Restart-all] in
            coordinator/scheduling/running_job.h);
      peer: under torchrun, `python3 -m torch.distributed.run --nnodes 1
            --nproc_per_node 2 --max_restarts 3` (its defaults otherwise:
            static rendezvous, --monitor_interval 5), and, unless
            --tuned_monitor_interval is 0, once more with that
            --monitor_interval.
    Once rank 1 has reported --kill_step steps, its python is killed with
    SIGKILL. Recovery is the time from the kill to the first step the script
    reports in its next incarnation (TORCHELASTIC_RESTART_COUNT 1): the time
    to notice, stop the survivor, start every process again, form the
    process group and load the checkpoint. Every run must then finish all
    --steps steps. The sides alternate, --reps times each, in one invocation.

What it prints
    Progress and each run's figures on stderr; on stdout one JSON line per
    result (docs/benchmarks.md): the median recovery against each peer, the last
    line against torchrun as the brief's command runs it. ratio < 1: Chorus
    recovers faster.

How to run (from the repository root, after `bazel build //client:chorus`)
    tests/bench/restart_all_bench.py [--reps 3]
"""

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


import bench_util
from bench_util import Progress, free_port, log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "torchrun_checkpointed_mlp.py")
POLL = 0.01  # seconds between looks at the progress file
wait_until = functools.partial(bench_util.wait_until, poll=POLL)





def script_args(args, ckpt, progress):
    return [SCRIPT, "--ckpt", ckpt, "--steps", str(args.steps), "--step_sleep",
            str(args.step_sleep), "--progress", progress]


def start_ours(args, tmp, name, ckpt, progress):
    spec = os.path.join(tmp, f"{name}.textproto")
    argv = ", ".join(json.dumps(a) for a in [args.torch_python] + script_args(args, ckpt, progress))
    with open(spec, "w") as f:
        f.write(f"""name: "restart-all-bench"
program {{
  argv: [{argv}]
  env {{ key: "GLOO_SOCKET_IFNAME" value: "lo" }}
}}
resources {{ min_ranks: 2 max_ranks: 2 threads_per_rank: 1 }}
elastic {{ max_restarts: 3 }}
""")
    out = open(os.path.join(tmp, f"{name}.out"), "w")
    err = open(os.path.join(tmp, f"{name}.err"), "w")
    return subprocess.Popen([args.chorus, "up", "--local", "2", "--state_dir",
                             os.path.join(tmp, f"{name}.state"), spec, "--json"],
                            stdout=out, stderr=err, cwd=tmp, start_new_session=True)




def start_peer(args, tmp, name, ckpt, progress, monitor_interval):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    # --redirects 1 --tee 1: Debian's torch 1.13 under Python 3.11 cannot parse
    # the default "0" (see tests/bench/e2e_bench.sh). An explicit loopback
    # master address and a free port: the default port (29500) may be taken.
    command = [args.torch_python, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", "2", "--max_restarts", "3", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "--redirects", "1", "--tee", "1",
               "--log_dir", os.path.join(tmp, f"{name}.logs")]
    if monitor_interval is not None:
        command += ["--monitor_interval", str(monitor_interval)]
    out = open(os.path.join(tmp, f"{name}.out"), "w")
    return subprocess.Popen(command + script_args(args, ckpt, progress), stdout=out,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def kill_run(args, tmp, name, start):
    """Runs one side with a SIGKILL of rank 1's python; returns its figures."""
    ckpt = os.path.join(tmp, f"{name}.pt")
    progress = Progress(os.path.join(tmp, f"{name}.jsonl"))
    proc = start(ckpt, progress.path)
    try:
        killed = progress.kill_rank_at(1, args.kill_step, name)

        def recovered():
            progress.poll()
            return progress.of("step", restart=1)
        first = min(e["t"] for e in wait_until(recovered, 120, f"{name}: a step after the kill"))
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    progress.poll()
    finals = progress.of("final", restart=1)
    if proc.returncode != 0 or len(finals) != 2 or any(f["step"] != args.steps for f in finals):
        raise RuntimeError(f"{name}: exited {proc.returncode} with finals {finals} "
                           f"(scratch in {tmp})")
    if progress.of("pid", restart=2):
        raise RuntimeError(f"{name}: one kill restarted the script twice (scratch in {tmp})")
    last_old = max(e["step"] for e in progress.of("step", restart=0))
    resumed = progress.of("start", restart=1)[0]["resumed_step"]
    return {"recovery_seconds": first - killed, "killed_at_step": last_old,
            "resumed_step": resumed, "steps_redone": max(0, last_old - resumed)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chorus", default=os.path.join(ROOT, "bazel-bin/client/chorus"))
    ap.add_argument("--torch_python", default="/usr/bin/python3")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill_step", type=int, default=20)
    ap.add_argument("--step_sleep", type=float, default=0.05)
    ap.add_argument("--tuned_monitor_interval", type=float, default=0.5,
                    help="also run torchrun with this --monitor_interval (0: do not)")
    args = ap.parse_args()
    if not os.access(args.chorus, os.X_OK):
        sys.exit(f"{args.chorus} is not there: bazel build //client:chorus first")

    tmp = tempfile.mkdtemp(prefix="chorus-restart-all-bench.")
    log(f"restart_all_bench: scratch in {tmp}")
    peers = {"torchrun": None}
    if args.tuned_monitor_interval > 0:
        peers["tuned"] = args.tuned_monitor_interval
    runs = {"ours": [], **{p: [] for p in peers}}
    for rep in range(args.reps):
        name = f"ours-{rep}"
        runs["ours"].append(kill_run(args, tmp, name,
                                     lambda c, p, n=name: start_ours(args, tmp, n, c, p)))
        log(name, json.dumps(runs["ours"][-1]))
        for peer, interval in peers.items():
            name = f"{peer}-{rep}"
            runs[peer].append(kill_run(
                args, tmp, name,
                lambda c, p, n=name, i=interval: start_peer(args, tmp, n, c, p, i)))
            log(name, json.dumps(runs[peer][-1]))

    def median(side, key):
        return statistics.median(r[key] for r in runs[side])

    ours = median("ours", "recovery_seconds")
    command = ("torchrun --nnodes 1 --nproc_per_node 2 --max_restarts 3 "
               "(static rendezvous, --monitor_interval {})")
    lines = []
    for peer, interval in reversed(list(peers.items())):
        theirs = median(peer, "recovery_seconds")
        lines.append({
            "bench": "restart_all_bench", "metric": "recovery_seconds", "unit": "s",
            "ours": round(ours, 4), "peer": round(theirs, 4),
            "peer_name": command.format(interval if interval is not None else "5 (default)"),
            "ratio": round(ours / theirs, 4),
            "reps": args.reps, "kill_step": args.kill_step,
            "ours_runs": [round(r["recovery_seconds"], 3) for r in runs["ours"]],
            "peer_runs": [round(r["recovery_seconds"], 3) for r in runs[peer]],
            "steps_redone": {"ours": median("ours", "steps_redone"),
                             "peer": median(peer, "steps_redone")}})
    for line in lines:
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
