#!/usr/bin/env python3
"""Soak benchmark: a long-running cluster stays flat.

What it does
  Starts a coordinator (HTTP port on) and one agent with --slots slots, all on
  127.0.0.1, then
    1. runs --jobs short program jobs (one rank: `sh -c 'echo ...'`), then
       --noisy program jobs whose rank prints 2 MB of base64 text, one 100 kB
       line and a last line that is an HTML comment;
    2. while they run, every --every seconds, samples the agent's and the
       coordinator's resident memory (VmRSS), threads, open descriptors and
       memory maps from /proc, with the number of jobs finished so far
       (chorus_jobs{state="SUCCEEDED"} from /metrics);
    3. fills the history to --history jobs (submitted and cancelled at once,
       through the CLI) and times `chorus jobs` (the default listing: the newest
       50) and `chorus jobs --limit 1000` --listings times each.
  Every loop is bounded in count and time (--timeout for the whole run).

Output
  The samples, then one line per process with the least-squares slope of
  each measure per 1,000 finished jobs (after the first --warmup jobs, which
  fill caches and pools): over the short jobs alone (*_per_1000_short_jobs)
  and over all jobs (the noisy ones step the coordinator up to its log
  store's bound), then the listing times, and as the LAST line one JSON
  object:
    {"bench": "soak_bench", "jobs": N, "agent": {...slopes}, "coordinator":
     {...slopes}, "history": H, "jobs_p99_ms": X, "jobs_1000_p99_ms": Y,
     "slowest_cli_call_s": S}
  The goals (docs/benchmarks.md, "Soak"): 0 threads and descriptors and
  under 1 MB of RSS per 1,000 jobs; `chorus jobs` p99 under 100 ms with
  20,000 jobs in the history. There is no peer to run: torchrun and
  TorchElastic keep no cluster between jobs.

How to run (from the repository root, after
  `bazel build //coordinator:chorus-coordinator //worker:chorus-worker //client:chorus`)
  tests/bench/soak_bench.py [--jobs 2000] [--noisy 200] [--history 20000]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = {
    "coordinator": "bazel-bin/coordinator/chorus-coordinator",
    "worker": "bazel-bin/worker/chorus-worker",
    "chorus": "bazel-bin/client/chorus",
}


def proc_sample(pid):
    """RSS in MB, threads, descriptors and memory maps of `pid`."""
    status = open(f"/proc/{pid}/status").read()
    rss_kb = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/maps") as maps:
        map_count = sum(1 for _ in maps)
    return {"rss_mb": rss_kb / 1024.0, "threads": threads, "fds": fds, "maps": map_count}


def slope_per_thousand(points):
    """Least-squares slope of (jobs, value) pairs, per 1,000 jobs."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return None
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    return 1000.0 * sxy / sxx


def wait_file(path, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return open(path).read().strip()
        time.sleep(0.1)
    raise RuntimeError(f"{path} did not appear within {timeout} s")


class Cluster:
    def __init__(self, root, slots):
        self.root = root
        state = os.path.join(root, "state")
        port_file = os.path.join(root, "port")
        http_file = os.path.join(root, "http")
        self.log = open(os.path.join(root, "coordinator.log"), "w")
        self.coordinator = subprocess.Popen(
            [BIN["coordinator"], "--listen", "127.0.0.1:0", "--state_dir", state,
             "--port_file", port_file, "--http_listen", "127.0.0.1:0",
             "--http_port_file", http_file, "--max_pending_jobs", "5000"],
            stderr=self.log)
        self.address = "127.0.0.1:" + wait_file(port_file, 20)
        self.http = "http://127.0.0.1:" + wait_file(http_file, 20)
        self.agent_log = open(os.path.join(root, "agent.log"), "w")
        self.agent = subprocess.Popen(
            [BIN["worker"], "--coordinator", self.address, "--slots", str(slots)],
            stderr=self.agent_log, stdout=subprocess.DEVNULL)

    def chorus(self, *args, timeout=60):
        # --timeout: a loaded 2-core machine can take seconds to answer (a
        # synchronous commit waits for the disk); the bench measures memory,
        # and times listings on their own. The slowest call is reported.
        started = time.time()
        result = subprocess.run([BIN["chorus"], "--coordinator", self.address,
                                 "--timeout", str(timeout // 2), *args],
                                capture_output=True, text=True, timeout=timeout)
        self.slowest_call_s = max(getattr(self, "slowest_call_s", 0.0), time.time() - started)
        return result

    def finished(self):
        text = urllib.request.urlopen(self.http + "/metrics", timeout=10).read().decode()
        total = 0
        for state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            m = re.search(r'^chorus_jobs\{state="%s"\} (\S+)' % state, text, re.M)
            total += int(float(m.group(1))) if m else 0
        return total

    def stop(self):
        for p in (self.agent, self.coordinator):
            p.terminate()
        for p in (self.agent, self.coordinator):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def write_spec(path, command, device="CPU"):
    with open(path, "w") as f:
        f.write('name: "soak"\nprogram { argv: ["/bin/sh", "-c", %s] working_dir: "/tmp" }\n'
                % json.dumps(command))
        f.write("resources { min_ranks: 1 max_ranks: 1 device: %s }\n" % device)


def submit_all(cluster, spec, count, deadline):
    for i in range(count):
        if time.time() > deadline:
            raise RuntimeError("out of time while submitting")
        r = cluster.chorus("submit", spec)
        if r.returncode != 0:
            raise RuntimeError(f"submit {i}: {r.stderr.strip()}")


def run_jobs(cluster, args, deadline):
    short = os.path.join(cluster.root, "short.textproto")
    noisy = os.path.join(cluster.root, "noisy.textproto")
    write_spec(short, "echo soak job; exit 0")
    write_spec(noisy, "head -c 1500000 /dev/zero | base64; head -c 100000 /dev/zero | tr '\\\\0' x;"
                      " echo; echo '<!-- the end -->'")
    samples = []
    total = args.jobs + args.noisy
    # Submitted in batches so that the queue stays short, sampling between.
    submitted = 0
    while submitted < total or cluster.finished() < total:
        if time.time() > deadline:
            raise RuntimeError(f"out of time: {cluster.finished()} of {total} jobs finished")
        done = cluster.finished()
        if submitted < total and submitted - done < 2 * args.batch:
            n = min(args.batch, total - submitted)
            spec = short if submitted < args.jobs else noisy
            n = min(n, args.jobs - submitted) if submitted < args.jobs else n
            submit_all(cluster, spec, n, deadline)
            submitted += n
        sample = {"jobs": cluster.finished(), "t": time.time(),
                  "agent": proc_sample(cluster.agent.pid),
                  "coordinator": proc_sample(cluster.coordinator.pid)}
        samples.append(sample)
        print(json.dumps(sample), flush=True)
        time.sleep(args.every)
    return samples


def fill_history(cluster, args, deadline):
    """Submits and cancels jobs until the history holds args.history."""
    # Jobs for a device no agent has wait without holding up anything; each
    # is cancelled as soon as it is queued.
    spec = os.path.join(cluster.root, "parked.textproto")
    write_spec(spec, "sleep 600", device="CUDA")
    def one(_):
        if time.time() > deadline:
            raise RuntimeError("out of time filling the history")
        r = cluster.chorus("submit", spec)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        c = cluster.chorus("cancel", r.stdout.strip())
        if c.returncode != 0:
            raise RuntimeError(c.stderr)

    missing = max(0, args.history - cluster.finished())
    # A few clients at once, as a team's would be; each call is one CLI run.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for _ in pool.map(one, range(missing)):
            pass


def time_listing(cluster, args, extra):
    times = []
    for _ in range(args.listings):
        t0 = time.perf_counter()
        r = cluster.chorus("jobs", *extra)
        times.append((time.perf_counter() - t0) * 1000)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
    times.sort()
    return times[min(len(times) - 1, int(0.99 * len(times)))], times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--noisy", type=int, default=200)
    parser.add_argument("--history", type=int, default=20000)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--listings", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=5400)
    args = parser.parse_args()
    for name, path in BIN.items():
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: bazel build //coordinator:chorus-coordinator "
                     "//worker:chorus-worker //client:chorus")
    deadline = time.time() + args.timeout
    root = tempfile.mkdtemp(prefix="chorus-soak-")
    cluster = Cluster(root, args.slots)
    result = {"bench": "soak_bench", "jobs": args.jobs + args.noisy}
    try:
        t0 = time.time()
        samples = run_jobs(cluster, args, deadline)
        result["seconds"] = round(time.time() - t0, 1)
        for who in ("agent", "coordinator"):
            steady = [s for s in samples if s["jobs"] >= args.warmup]
            slopes = {}
            # The short jobs alone (the noisy ones fill the log store to its
            # bound, a step rather than a slope) and all of them.
            short = [s for s in steady if s["jobs"] <= args.jobs]
            for measure in ("rss_mb", "threads", "fds", "maps"):
                slope = slope_per_thousand([(s["jobs"], s[who][measure]) for s in short])
                slopes[measure + "_per_1000_short_jobs"] = None if slope is None else round(slope, 3)
                slope = slope_per_thousand([(s["jobs"], s[who][measure]) for s in steady])
                slopes[measure + "_per_1000_jobs"] = None if slope is None else round(slope, 3)
            slopes["first"] = samples[0][who]
            slopes["last"] = samples[-1][who]
            result[who] = slopes
            print(who, json.dumps(slopes), flush=True)
        fill_history(cluster, args, deadline)
        result["history"] = cluster.finished()
        p99, p50 = time_listing(cluster, args, [])
        result["jobs_p99_ms"], result["jobs_p50_ms"] = round(p99, 1), round(p50, 1)
        p99, p50 = time_listing(cluster, args, ["--limit", "1000"])
        result["jobs_1000_p99_ms"], result["jobs_1000_p50_ms"] = round(p99, 1), round(p50, 1)
        result["coordinator_after_history"] = proc_sample(cluster.coordinator.pid)
        result["slowest_cli_call_s"] = round(cluster.slowest_call_s, 2)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
