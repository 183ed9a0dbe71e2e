#!/usr/bin/env python3
"""Python package bench: PyTorch scripts on the `chorus` package against PyTorch's own.

What it measures (--parts, all by default; each side run in this invocation)
    ddp      DDP step time, examples/programs/python_ddp.py with 2 ranks as
             Chorus program jobs (`chorus up --local 2`), on the `chorus`
             backend and on PyTorch's `gloo` backend (env://, as torchrun
             scripts do), for two MLPs (32-H-10, H = 256 and 2048), 300 steps
             of 64 samples per rank; rank 0 times each step after 20 of warm-up
             and the median is taken. The sides alternate, --reps times each.
             ratio = median chorus / median gloo (the larger of the two MLPs'
             is the line's ratio).
    hang     a rank that never joins: tests/bench/torch_hang_peer.py
             --fault never_joined (rank 1 sleeps before its step 10 while
             rank 0 waits in DDP's all-reduce). Ours: the script with
             --backend chorus as a program job, hang_detection { action: REPORT
             stall_after_seconds: 2 }; `chorus status --json` is polled every
             100 ms for a NEVER_JOINED diagnosis naming rank 1; the time is its
             first_seen_us minus the fault's unix_us. Peer: the same script
             under torchrun on gloo with TORCH_DISTRIBUTED_DEBUG=DETAIL and a 60 s
             process-group timeout (PyTorch's default is 1800 s for Gloo): the
             time from the fault to the first rank's exception.
    elastic  recovery from kill -9 of rank 1's python: the time from the kill
             to the first step any rank completes in a later generation. Ours:
             examples/programs/python_elastic.py (in-process re-formation, a
             spare slot: `chorus up --local 3`, resources min_ranks 1
             max_ranks 2): the survivor forms the failure's generation alone
             and steps in it; the newcomer's python starts at once and joins
             the generation after it, which the survivor forms at its next step
             boundary once the newcomer waits (Note [Staged growth] in
             coordinator/scheduling/staged_growth.h). So ours is also timed from the
             kill to the newcomer's first step ("newcomer" in the JSON line,
             against the same peer figure). Peer: torchrun --max_restarts 3
             (static rendezvous, --monitor_interval 5, its default) on
             tests/bench/torchrun_checkpointed_mlp.py, the same MLP trained the
             torchrun way (checkpoint every step, resume on restart): its
             first step after the kill is both ranks' (all restart). 100
             steps, the kill at step 20, 50 ms a step, --reps runs a side.
    churn    throughput of python_elastic.py with rank 1's python killed every
             10 s (6 kills over about 70 s), against the same job undisturbed:
             steps per second over the whole run.

What it prints
    Progress on stderr; one JSON line per part on stdout (docs/benchmarks.md).

How to run (from the repository root, after `bazel build //client:chorus
//python:_C.so`; the package is assembled from bazel-bin in a scratch dir)
    tests/bench/python_bench.py [--parts ddp,hang,elastic,churn] [--reps 3]
"""

import argparse
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import bench_util
import restart_all_bench
from bench_util import Progress, free_port, log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DDP_SCRIPT = os.path.join(ROOT, "examples/programs/python_ddp.py")
ELASTIC_SCRIPT = os.path.join(ROOT, "examples/programs/python_elastic.py")
HANG_SCRIPT = os.path.join(HERE, "torch_hang_peer.py")
wait_until = functools.partial(bench_util.wait_until, poll=0.05)


def package(tmp):
    """The chorus package from this tree's build, in a scratch site dir."""
    site = os.path.join(tmp, "site")
    os.makedirs(os.path.join(site, "chorus"))
    shutil.copy(os.path.join(ROOT, "python/chorus/__init__.py"), os.path.join(site, "chorus"))
    shutil.copy(os.path.join(ROOT, "bazel-bin/python/_C.so"), os.path.join(site, "chorus"))
    return site


def spec_text(name, argv, site, extra="", min_ranks=2):
    args = ", ".join(json.dumps(a) for a in argv)
    return (f'name: "{name}"\nprogram {{\n  argv: [{args}]\n'
            f'  env {{ key: "PYTHONPATH" value: "{site}" }}\n'
            f'  env {{ key: "GLOO_SOCKET_IFNAME" value: "lo" }}\n}}\n'
            f"resources {{ min_ranks: {min_ranks} max_ranks: 2 threads_per_rank: 1 }}\n{extra}")


def start_up(args, tmp, name, text, slots=2):
    spec = os.path.join(tmp, f"{name}.textproto")
    with open(spec, "w") as f:
        f.write(text)
    out = open(os.path.join(tmp, f"{name}.out"), "w")
    err = open(os.path.join(tmp, f"{name}.err"), "w")
    state = os.path.join(tmp, f"{name}.state")
    proc = subprocess.Popen([args.chorus, "up", "--local", str(slots), "--state_dir", state, spec,
                             "--json"], stdout=out, stderr=err, cwd=tmp, start_new_session=True)
    return proc, state


def finish(proc, timeout=300):
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


# ---- ddp

def ddp_run(args, tmp, site, name, backend, hidden):
    timing = os.path.join(tmp, f"{name}.json")
    argv = [args.torch_python, DDP_SCRIPT, f"--backend={backend}", "--steps=300",
            f"--hidden={hidden}", f"--timing={timing}"]
    proc, _ = start_up(args, tmp, name, spec_text(name, argv, site))
    finish(proc)
    if proc.returncode != 0 or not os.path.exists(timing):
        raise RuntimeError(f"{name}: exited {proc.returncode} without timings (scratch {tmp})")
    with open(timing) as f:
        return json.load(f)["median_step_seconds"]


def ddp_part(args, tmp, site):
    figures = {}
    for hidden in (256, 2048):
        runs = {"chorus": [], "gloo": []}
        for rep in range(args.reps):
            for backend in ("chorus", "gloo"):
                name = f"ddp-{hidden}-{backend}-{rep}"
                runs[backend].append(ddp_run(args, tmp, site, name, backend, hidden))
                log(name, f"median step {runs[backend][-1] * 1e3:.3f} ms")
        ours, theirs = statistics.median(runs["chorus"]), statistics.median(runs["gloo"])
        figures[hidden] = {"ours": ours, "peer": theirs, "ratio": ours / theirs,
                           "ours_runs": [round(r * 1e3, 3) for r in runs["chorus"]],
                           "peer_runs": [round(r * 1e3, 3) for r in runs["gloo"]]}
    worst = max(figures, key=lambda h: figures[h]["ratio"])
    return {"bench": "python_bench", "metric": "ddp_step_seconds", "unit": "s",
            "ours": round(figures[worst]["ours"], 6), "peer": round(figures[worst]["peer"], 6),
            "peer_name": "PyTorch DDP on the gloo backend (same script, same launcher)",
            "ratio": round(figures[worst]["ratio"], 4), "reps": args.reps,
            "mlps": {f"32-{h}-10": {k: (round(v, 4) if k == "ratio" else v)
                                    for k, v in f.items() if k in ("ratio", "ours_runs",
                                                                   "peer_runs")}
                     for h, f in figures.items()}}


# ---- hang

def hang_ours(args, tmp, site, name):
    argv = [args.torch_python, HANG_SCRIPT, "--fault=never_joined", "--backend=chorus",
            "--sleep_seconds=60"]
    proc, state = start_up(args, tmp, name, spec_text(
        name, argv, site, "hang_detection { action: REPORT stall_after_seconds: 2 }\n"))
    try:
        port_file = os.path.join(state, "port")
        wait_until(lambda: os.path.exists(port_file) and open(port_file).read().strip(), 60,
                   f"{name}: the coordinator's port")
        addr = f"127.0.0.1:{open(port_file).read().strip()}"

        def diagnosed():
            out = subprocess.run([args.chorus, "--coordinator", addr, "status", "job-000001",
                                  "--json"], capture_output=True, text=True).stdout
            try:
                status = json.loads(out)
            except ValueError:
                return None
            for d in status.get("diagnoses", []):
                if d.get("kind") == "NEVER_JOINED" and 1 in d.get("ranks", []):
                    return d
            return None
        found = wait_until(diagnosed, 60, f"{name}: a NEVER_JOINED diagnosis of rank 1")
        with open(os.path.join(state, "worker.log")) as f:
            fault = re.search(r"FAULT unix_us=(\d+)", f.read())
        if fault is None:
            raise RuntimeError(f"{name}: no FAULT line in the rank logs (scratch {tmp})")
        return (int(found["first_seen_us"]) - int(fault.group(1))) / 1e6, found.get("message", "")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        finish(proc, 60)


def hang_peer(args, tmp, name):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               TORCH_DISTRIBUTED_DEBUG="DETAIL")
    command = [args.torch_python, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
               str(free_port()), "--redirects", "1", "--tee", "1", "--log_dir",
               os.path.join(tmp, f"{name}.logs"), HANG_SCRIPT, "--fault=never_joined",
               "--timeout_seconds=60", "--sleep_seconds=90"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300).stdout
    fault = re.search(r"FAULT unix_us=(\d+)", out)
    detected = [int(m) for m in re.findall(r"DETECTED unix_us=(\d+)", out)]
    if fault is None or not detected:
        raise RuntimeError(f"{name}: no FAULT/DETECTED lines in torchrun's output: {out[-2000:]}")
    return (min(detected) - int(fault.group(1))) / 1e6


def hang_part(args, tmp, site):
    ours, peer, message = [], [], ""
    for rep in range(args.reps):
        seconds, message = hang_ours(args, tmp, site, f"hang-ours-{rep}")
        ours.append(seconds)
        log(f"hang-ours-{rep}", f"{seconds:.2f} s: {message}")
    for rep in range(args.peer_reps):
        peer.append(hang_peer(args, tmp, f"hang-peer-{rep}"))
        log(f"hang-peer-{rep}", f"{peer[-1]:.2f} s")
    o, p = statistics.median(ours), statistics.median(peer)
    return {"bench": "python_bench", "metric": "never_joined_named_seconds", "unit": "s",
            "ours": round(o, 3), "peer": round(p, 3),
            "peer_name": "torchrun + gloo, TORCH_DISTRIBUTED_DEBUG=DETAIL, 60 s timeout",
            "ratio": round(o / p, 4), "ours_runs": [round(r, 2) for r in ours],
            "peer_runs": [round(r, 2) for r in peer], "diagnosis": message}


# ---- elastic

def start_elastic(args, tmp, site, name, steps, progress, sleep_ms, max_restarts=3):
    argv = [args.torch_python, ELASTIC_SCRIPT, f"--steps={steps}",
            f"--step_sleep_ms={sleep_ms}", f"--progress={progress}"]
    extra = (f"elastic {{ max_restarts: {max_restarts} wait_seconds: 60 }}\n"
             "hang_detection { action: RESTART dead_after_seconds: 5 stall_after_seconds: 3 }\n")
    # min_ranks 1: the survivor goes on alone until its replacement is up.
    proc, _ = start_up(args, tmp, name, spec_text(name, argv, site, extra, min_ranks=1), slots=3)
    return proc


def elastic_kill_run(args, tmp, site, name, knobs):
    """Ours: kill -9 of rank 1's python; the survivor's first step in a later
    generation and the newcomer's first step, both from the kill."""
    progress = Progress(os.path.join(tmp, f"{name}.jsonl"))
    proc = start_elastic(args, tmp, site, name, knobs.steps, progress.path, 50)
    try:
        killed = progress.kill_rank_at(1, knobs.kill_step, name)

        def later(event):
            progress.poll()
            return [e for e in progress.of(event) if e["restart"] >= 1]
        first = min(e["t"] for e in wait_until(lambda: later("step"), 120,
                                                 f"{name}: a step after the kill"))
        newcomer = wait_until(lambda: later("pid"), 120, f"{name}: the newcomer's start")[0]

        def newcomer_steps():
            progress.poll()
            return progress.of("step", restart=newcomer["restart"], rank=newcomer["rank"])
        newcomer_first = min(e["t"] for e in wait_until(newcomer_steps, 120,
                                                          f"{name}: the newcomer's first step"))
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    progress.poll()
    finals = progress.of("final")
    if (proc.returncode != 0 or len(finals) != 2 or any(f["step"] != knobs.steps for f in finals)
            or len({f["restart"] for f in finals}) != 1):
        raise RuntimeError(f"{name}: exited {proc.returncode} with finals {finals} "
                           f"(scratch in {tmp})")
    if len(progress.of("pid")) != 3:
        raise RuntimeError(f"{name}: {len(progress.of('pid'))} python processes started, not 3 "
                           f"(2 and the newcomer; scratch in {tmp})")
    last_old = max(e["step"] for e in progress.of("step", restart=0))
    resumed = min(later("start"), key=lambda e: e["t"])["resumed_step"]
    return {"recovery_seconds": first - killed, "newcomer_seconds": newcomer_first - killed,
            "killed_at_step": last_old, "resumed_step": resumed,
            "steps_redone": max(0, last_old - resumed), "generations": 1 + finals[0]["restart"]}


def elastic_part(args, tmp, site):
    class Knobs:  # what restart_all_bench's runs read
        steps, kill_step, step_sleep = 100, 20, 0.05
        torch_python = args.torch_python
    knobs = Knobs()
    runs = {"ours": [], "peer": []}
    for rep in range(args.reps):
        name = f"elastic-ours-{rep}"
        runs["ours"].append(elastic_kill_run(args, tmp, site, name, knobs))
        log(name, json.dumps(runs["ours"][-1]))
        name = f"elastic-peer-{rep}"
        runs["peer"].append(restart_all_bench.kill_run(
            knobs, tmp, name,
            lambda c, p, n=name: restart_all_bench.start_peer(knobs, tmp, n, c, p, None)))
        log(name, json.dumps(runs["peer"][-1]))
    o = statistics.median(r["recovery_seconds"] for r in runs["ours"])
    n = statistics.median(r["newcomer_seconds"] for r in runs["ours"])
    p = statistics.median(r["recovery_seconds"] for r in runs["peer"])
    return {"bench": "python_bench", "metric": "elastic_recovery_seconds", "unit": "s",
            "ours": round(o, 3), "peer": round(p, 3),
            "peer_name": "torchrun --max_restarts 3 (--monitor_interval 5, its default), "
                         "checkpoint every step",
            "ratio": round(o / p, 4),
            "ours_runs": [round(r["recovery_seconds"], 3) for r in runs["ours"]],
            "peer_runs": [round(r["recovery_seconds"], 3) for r in runs["peer"]],
            "newcomer": {"seconds": round(n, 3), "ratio": round(n / p, 4),
                         "runs": [round(r["newcomer_seconds"], 3) for r in runs["ours"]]},
            "generations": [r["generations"] for r in runs["ours"]],
            "steps_redone": {"ours": max(r["steps_redone"] for r in runs["ours"]),
                             "peer": max(r["steps_redone"] for r in runs["peer"])}}


# ---- churn

def churn_run(args, tmp, site, name, kills):
    progress = Progress(os.path.join(tmp, f"{name}.jsonl"))
    steps = args.churn_steps
    proc = start_elastic(args, tmp, site, name, steps, progress.path, 10, max_restarts=kills + 1)
    try:
        def step_of(rank):
            progress.poll()
            return progress.of("step", rank=rank)
        wait_until(lambda: step_of(0), 120, f"{name}: a first step")
        began = min(e["t"] for e in step_of(0))
        done = 0
        while done < kills and proc.poll() is None:
            time.sleep(args.kill_every)
            progress.poll()
            victims = [e for e in progress.of("pid") if e["rank"] == 1]
            newest = max(victims, key=lambda e: e["t"]) if victims else None
            # The newest rank 1's python, once it has stepped (a newcomer
            # still joining is not killed again).
            if newest and progress.of("step", rank=1, restart=newest["restart"]):
                os.kill(newest["pid"], signal.SIGKILL)
                done += 1
        finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    progress.poll()
    finals = progress.of("final")
    if proc.returncode != 0 or len(finals) != 2:
        raise RuntimeError(f"{name}: exited {proc.returncode}, finals {finals} (scratch {tmp})")
    ended = max(e["t"] for e in finals)
    return {"steps_per_second": steps / (ended - began), "kills": done,
            "generations": 1 + max(e["restart"] for e in finals)}


def churn_part(args, tmp, site):
    quiet = churn_run(args, tmp, site, "churn-quiet", 0)
    log("churn-quiet", json.dumps(quiet))
    killed = churn_run(args, tmp, site, "churn-killed", args.kills)
    log("churn-killed", json.dumps(killed))
    return {"bench": "python_bench", "metric": "steps_per_second_with_kills", "unit": "steps/s",
            "ours": round(killed["steps_per_second"], 2),
            "peer": round(quiet["steps_per_second"], 2),
            "peer_name": "the same job undisturbed",
            "ratio": round(killed["steps_per_second"] / quiet["steps_per_second"], 4),
            "kills": killed["kills"], "kill_every_seconds": args.kill_every,
            "generations": killed["generations"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chorus", default=os.path.join(ROOT, "bazel-bin/client/chorus"))
    ap.add_argument("--torch_python", default="/usr/bin/python3")
    ap.add_argument("--parts", default="ddp,hang,elastic,churn")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peer_reps", type=int, default=1, help="hang: torchrun runs (~70 s each)")
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--kill_every", type=float, default=10.0)
    ap.add_argument("--churn_steps", type=int, default=5000)
    args = ap.parse_args()
    for binary in (args.chorus, os.path.join(ROOT, "bazel-bin/python/_C.so")):
        if not os.path.exists(binary):
            sys.exit(f"{binary} is not there: bazel build //client:chorus //python:_C.so first")
    parts = {"ddp": ddp_part, "hang": hang_part, "elastic": elastic_part, "churn": churn_part}
    chosen = args.parts.split(",")
    for part in chosen:
        if part not in parts:
            sys.exit(f"--parts: unknown part '{part}'; one of {', '.join(parts)}")
    tmp = tempfile.mkdtemp(prefix="chorus-python-bench.")
    log(f"python_bench: scratch in {tmp}")
    site = package(tmp)
    for part in chosen:
        print(json.dumps(parts[part](args, tmp, site)), flush=True)


if __name__ == "__main__":
    main()
