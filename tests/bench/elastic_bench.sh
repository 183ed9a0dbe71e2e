#!/usr/bin/env bash
# Elastic benchmark: how a 4-rank DDP job gets over a rank killed with SIGKILL,
# Chorus' elastic generations against torchrun's restart-everything, on the
# same job in the same invocation.
#
# The job, on both sides: the Fashion-MNIST MLP of
# examples/fashion_mnist_mlp_ddp.textproto (784 -> 256 -> 128 -> 10, SGD lr 0.05
# momentum 0.9, cosine schedule with 100 warmup steps, batches of 64 per rank),
# 4 CPU ranks of 1 thread, 600 steps.
#   ours: `chorus up --local 5` (one spare slot) with `elastic { max_restarts: 3 }`;
#         the survivors keep their processes, a newcomer takes the lost rank's
#         place and receives the state from a peer (docs/elastic.md).
#   peer: torchrun --nnodes 1:2 --nproc_per_node 4 --max_restarts 3, c10d
#         rendezvous on 127.0.0.1, running tests/bench/torchrun_elastic_peer.py:
#         PyTorch DDP (gloo) that saves a checkpoint every 50 steps and loads the
#         newest at start, as a torchrun user's script must (torchrun restarts
#         every worker when one dies).
#
# What it measures
#   1. Recovery: rank 1 is killed with SIGKILL once it has taken step 230's
#      batch; seconds from the kill to the first step finished after it (ours:
#      the first step of generation 2, finished when a rank takes the next
#      batch, seen in the ranks' sample traces, polled every 20 ms; peer: the
#      first step of restart 1 in its progress file). Target ratio <= 0.2.
#   2. Steps redone beyond the interrupted one: steps every rank had finished
#      before the kill that are trained again (ours: from the traces; peer: the
#      step reached minus the step of the checkpoint it resumed from).
#      Target: 0 for Chorus.
#   3. Throughput under chaos: a run of as many epochs as it takes trains
#      undisturbed for 15 s (--baseline_seconds), then a random rank is
#      killed every 10 s for 60 s; new steps finished per second in the chaos
#      window as a fraction of the same run's undisturbed window. Target >= 0.8.
#   Both sides must finish run 1 (SUCCEEDED / exit 0 with a test accuracy).
#
# How to run (after `bazel build -c opt //client:chorus //coordinator:chorus-coordinator
# //worker:chorus-worker //worker:chorus-rank`, or bazel build //...)
#   tests/bench/elastic_bench.sh [--kill_step S] [--chaos_seconds N] [--chaos_every N] [--baseline_seconds N]
#                                [--skip_chaos]
#   ~5 minutes. Progress and each side's figures go to stderr; stdout ends with
#   result lines (docs/benchmarks.md), the recovery figure last:
#     {"bench": "elastic_bench", "metric": "steps_redone", ...}
#     {"bench": "elastic_bench", "metric": "throughput_under_chaos_fraction", ...}
#     {"bench": "elastic_bench", "metric": "recovery_seconds", "unit": "s", "ours": X,
#      "peer": Y, "peer_name": "...", "ratio": X/Y}
#   Scratch files (traces, logs) stay under /tmp/chorus-elastic-bench.*.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec python3 tests/bench/elastic_bench.py "$@"
