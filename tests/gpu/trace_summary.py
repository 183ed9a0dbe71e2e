#!/usr/bin/env python3
"""Summarizes the Chrome traces of `ddp_cuda_bench --trace DIR` side by side.

Usage: trace_summary.py DIR MODEL [STEPS]

Reads DIR/{chorus,pytorch}_{plain,ddp}_MODEL.json (Kineto traces of STEPS
steps, default 10) and prints, per trace and per step: the GPU's span, the
busy time and kernel count of each stream, the idle time of the busiest
stream (the training stream) and its longest gaps with the kernels around
them, the GPU work by kernel, and the CUDA runtime calls by name. Then the
differences in GPU work and runtime calls: Chorus DDP against PyTorch DDP,
and each DDP against its loop without DDP. Standard library only.
"""
import collections
import json
import os
import sys

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")


def short(name, width=110):
    name = name.replace("void ", "").replace("at::native::", "").replace("(anonymous namespace)::", "")
    if name.endswith(")") and "(" in name:
        name = name[:name.rfind("(")]
    return name[:width]


def load(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def busy(intervals):
    """Total length of the union of [start, end) intervals, and their gaps."""
    total, gaps, end = 0.0, [], None
    for start, stop, name in sorted(intervals):
        if end is None or start >= end[0]:
            if end is not None:
                gaps.append((start - end[0], end[1], name))
            total += stop - start
            end = (stop, name)
        elif stop > end[0]:
            total += stop - end[0]
            end = (stop, name)
    return total, gaps


def summarize(path, steps):
    events = load(path)
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES]
    out = {"gpu": collections.Counter(), "gpu_n": collections.Counter(),
           "host": collections.Counter(), "host_n": collections.Counter()}
    print("== %s" % os.path.basename(path))
    if not gpu:
        print("   no GPU events (was the profiler built with CUDA?)")
        return out
    first = min(e["ts"] for e in gpu)
    last = max(e["ts"] + e["dur"] for e in gpu)
    print("   GPU span %.1f us/step over %d steps" % ((last - first) / steps, steps))
    streams = collections.defaultdict(list)
    for e in gpu:
        stream = e.get("args", {}).get("stream", e.get("tid"))
        streams[stream].append((e["ts"], e["ts"] + e["dur"], short(e["name"])))
        key = "%s %s" % (e["cat"], short(e["name"]))
        out["gpu"][key] += e["dur"] / steps
        out["gpu_n"][key] += 1.0 / steps
    ranked = sorted(streams.items(), key=lambda kv: -busy(kv[1])[0])
    for stream, intervals in ranked:
        total, gaps = busy(intervals)
        print("   stream %s: %d ops/step, busy %.1f us/step, idle between its ops %.1f us/step"
              % (stream, len(intervals) / steps, total / steps, sum(g[0] for g in gaps) / steps))
    _, gaps = busy(ranked[0][1])
    print("   longest gaps on stream %s (us: the op before -> the op after):" % ranked[0][0])
    for length, before, after in sorted(gaps, reverse=True)[:8]:
        print("     %8.1f  %s -> %s" % (length, before, after))
    print("   GPU work per step (us, count):")
    for key, us in out["gpu"].most_common(25):
        print("     %8.1f %6.1f  %s" % (us, out["gpu_n"][key], key))
    threads = collections.Counter()
    for e in host:
        out["host"][e["name"]] += e["dur"] / steps
        out["host_n"][e["name"]] += 1.0 / steps
        threads[e.get("tid")] += 1
    print("   CUDA runtime calls per step (us, count), from %d thread(s):" % len(threads))
    for name, us in out["host"].most_common(15):
        print("     %8.1f %6.1f  %s" % (us, out["host_n"][name], name))
    return out


def diff(title, ours, theirs):
    print("== %s (per step: us, count; + means more on the first)" % title)
    for part, count in (("gpu", "gpu_n"), ("host", "host_n")):
        keys = set(ours[part]) | set(theirs[part])
        rows = sorted(keys, key=lambda k: -abs(ours[part][k] - theirs[part][k]))
        for key in rows[:15]:
            du = ours[part][key] - theirs[part][key]
            dn = ours[count][key] - theirs[count][key]
            if abs(du) < 0.5 and abs(dn) < 0.05:
                continue
            print("   %s %+9.1f %+6.1f  %s" % (part, du, dn, key))


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    folder, model = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    got = {}
    for side in ("chorus_plain", "chorus_ddp", "pytorch_plain", "pytorch_ddp"):
        path = os.path.join(folder, "%s_%s.json" % (side, model))
        if os.path.exists(path):
            got[side] = summarize(path, steps)
        else:
            print("== %s: missing" % path)
    for a, b in (("chorus_ddp", "pytorch_ddp"), ("chorus_ddp", "chorus_plain"),
                 ("pytorch_ddp", "pytorch_plain")):
        if a in got and b in got:
            diff("%s - %s" % (a, b), got[a], got[b])
    return 0


if __name__ == "__main__":
    sys.exit(main())
