#!/usr/bin/env python3
"""Reads the logs of tests/bench/perf_suite.sh and prints every figure against
its target, then one JSON line.

Usage: perf_summary.py OUT_DIR BENCHES FAILED
  OUT_DIR  the suite's --out folder: allreduce.log, ddp.log, gossip.log,
           checkpoint.log (each bench's whole output)
  BENCHES  comma-separated benches that were run (allreduce,ddp,gossip,checkpoint)
  FAILED   space-separated benches that exited non-zero ('' for none)

A figure a log lacks is printed as missing and counts as not met.
"""
import json
import sys

if len(sys.argv) != 4:
    sys.exit(__doc__)
out, only, failed = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split()


def bench_lines(name):
    """The JSON result lines (docs/benchmarks.md) of OUT_DIR/NAME.log."""
    try:
        with open(f"{out}/{name}.log") as f:
            text = f.read()
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        if line.startswith('{"bench"'):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    return lines


def find(lines, bench, metric_prefix=""):
    """The last JSON line of BENCH whose metric starts with METRIC_PREFIX."""
    found = [o for o in lines
             if o.get("bench") == bench and str(o.get("metric", "")).startswith(metric_prefix)]
    return found[-1] if found else None


def field(obj, key):
    value = obj.get(key) if obj else None
    return value if isinstance(value, (int, float)) else None


rows = []  # (figure, value, target, met)


def check(figure, value, op, bound):
    if value is None:
        rows.append((figure, "missing", f"{op} {bound}", False))
        return
    met = value <= bound if op == "<=" else value >= bound
    rows.append((figure, f"{value:.3f}", f"{op} {bound}", met))


if "allreduce" in only:
    lines = bench_lines("allreduce")
    for size, bound in (("1MB", 1.0), ("25MB", 0.5), ("100MB", 0.5)):
        obj = find(lines, f"allreduce_{size}")
        check(f"all-reduce {size}: ours / raw gloo", field(obj, "ratio"), "<=", bound)
        check(f"all-reduce {size}: our page faults per op",
              field(obj, "ours_page_faults_per_op"), "<=", 0.5)
if "ddp" in only:
    lines = bench_lines("ddp")
    for model, bound in (("mlp_small", 0.9), ("mlp_big", 0.75)):
        obj = find(lines, f"ddp_{model}")
        check(f"DDP {model}: ours / PyTorch DDP", field(obj, "ratio"), "<=", bound)
    # The step over compute timed in the same minutes (ddp_bench's Note
    # [Interleaved compute]) where the bench gives it; else over one process
    # computing alone, timed separately.
    for model in ("mlp_small", "mlp_big"):
        obj = find(lines, f"ddp_{model}")
        step, compute = field(obj, "interleaved_step_ms"), field(obj, "interleaved_compute_ms")
        if not (step and compute):
            step, compute = field(obj, "ours"), field(obj, "compute_only_ms")
        check(f"DDP {model}: step / compute only", step / compute if step and compute else None,
              "<=", 1.3)
if "gossip" in only:
    lines = bench_lines("gossip")
    check("gossip: step / DDP step on 1 Gbit/s",
          field(find(lines, "decentralized_bench"), "ratio"), "<=", 0.75)
if "checkpoint" in only:
    lines = bench_lines("checkpoint")
    check("checkpoint: stall / torch.save",
          field(find(lines, "checkpoint_bench", "training_stall"), "ratio"), "<=", 0.2)
    check("checkpoint: upload+commit / dd",
          field(find(lines, "checkpoint_bench", "upload_commit"), "ratio"), ">=", 0.8)
    check("checkpoint: SHARED_DIR write+commit / dd",
          field(find(lines, "checkpoint_bench", "shared_dir"), "ratio"), ">=", 0.8)

width = max(len(r[0]) for r in rows) if rows else 10
print(f"{'figure':<{width}}  {'value':>8}  {'target':<8}  verdict")
for figure, value, target, met in rows:
    print(f"{figure:<{width}}  {value:>8}  {target:<8}  {'MET' if met else 'NOT MET'}")
print(f"full output: {out}")
print(json.dumps({"suite": "perf", "targets": len(rows), "met": sum(r[3] for r in rows),
                  "not_met": [r[0] for r in rows if not r[3]], "failed": failed}))
