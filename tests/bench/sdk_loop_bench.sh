#!/usr/bin/env bash
# Per-step benchmark: a training loop written with the C++ SDK against the
# built-in trainer, on the same recipe.
#
# What it measures
#   Seconds per training step, on 2 CPU ranks x 1 thread through
#   `chorus up --local 2`, of
#     ours:  examples/programs/fashion_mnist_loop (a `program` job; its rank 0
#            prints train_seconds and steps: the loop from its first step to its
#            last, evaluation excluded)
#     peer:  the built-in trainer on examples/fashion_mnist_mlp_ddp.textproto
#            (final_metrics.wall_seconds / steps of `chorus up --json`: its
#            training loop, which includes its final evaluation over the 10k
#            test split)
#   Same model (MLP 784-256-128-10), data, batch 64 per rank, 5 epochs = 2340
#   steps, SGD momentum 0.9 with warmup + cosine, DDP with 25 MB buckets.
#   The two sides alternate (ours, peer, ours, peer, ...).
#
# How to run (from any directory; the script changes to the repository root)
#   bazel build //client:chorus //examples/programs:fashion_mnist_loop
#   tests/bench/sdk_loop_bench.sh [--runs N]      (default 1, at most 20)
#   Environment: CHORUS (default bazel-bin/client/chorus), BENCH_TIMEOUT
#   (seconds per command, default 600).
#
# Output
#   One line per run, then as the LAST line one JSON object:
#     {"bench": "sdk_loop_bench", "metric": "seconds_per_step_fashion_mnist_mlp",
#      "unit": "s", "ours": X, "peer": Y, "peer_name": "chorus_builtin_trainer",
#      "ratio": X/Y}            (medians; ratio < 1: the SDK loop is faster)
#   Either side failing prints null for it and exits 1.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CHORUS=$(realpath "${CHORUS:-bazel-bin/client/chorus}")
LOOP=$(realpath bazel-bin/examples/programs/fashion_mnist_loop)
BENCH_TIMEOUT=${BENCH_TIMEOUT:-600}
runs=1
case "${1:-}" in
  --runs) runs=${2:?--runs needs a number} ;;
  --runs=*) runs=${1#--runs=} ;;
  "") ;;
  *) echo "sdk_loop_bench: unknown argument '$1' (usage: $0 [--runs N])" >&2; exit 2 ;;
esac
if ! [[ "${runs}" =~ ^[0-9]+$ ]] || (( runs < 1 || runs > 20 )); then
  echo "sdk_loop_bench: --runs must be 1..20, got '${runs}'" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT
printf 'name: "sdk-loop-bench"\nprogram { argv: ["%s", "--epochs=5"] }\nresources { min_ranks: 2 max_ranks: 2 threads_per_rank: 1 device: CPU }\n' \
  "${LOOP}" > "${work}/loop.textproto"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "null"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
json_field() { python3 -c 'import json, sys; d = json.loads(sys.stdin.read().strip().splitlines()[-1]); print(eval("d" + sys.argv[1]))' "$1"; }

ours=()
peer=()
status=0
for ((i = 1; i <= runs; i++)); do
  state="${work}/ours${i}"
  if timeout "${BENCH_TIMEOUT}" "${CHORUS}" up --local 2 --state_dir "${state}" "${work}/loop.textproto" --json \
       >"${work}/ours${i}.json" 2>"${work}/ours${i}.err"; then
    line=$(grep -o "final: rank 0 .*" "${state}/worker.log" | tail -n 1)
    s=$(awk '{ for (i = 1; i < NF; i++) { if ($i == "train_seconds") t = $(i + 1); if ($i == "steps") n = $(i + 1) } } END { if (n > 0) printf "%.6f", t / n }' <<<"${line}")
    echo "run ${i} ours: ${s} s/step (${line})"
    ours+=("${s}")
  else
    echo "sdk_loop_bench: the SDK loop failed: $(tail -n 3 "${work}/ours${i}.err")" >&2
    status=1
    break
  fi
  if timeout "${BENCH_TIMEOUT}" "${CHORUS}" up --local 2 --state_dir "${work}/peer${i}" \
       examples/fashion_mnist_mlp_ddp.textproto --json >"${work}/peer${i}.json" 2>"${work}/peer${i}.err"; then
    wall=$(json_field '["final_metrics"]["wall_seconds"]' <"${work}/peer${i}.json")
    steps=$(json_field '["final_metrics"]["steps"]' <"${work}/peer${i}.json")
    s=$(awk -v w="${wall}" -v n="${steps}" 'BEGIN { printf "%.6f", w / n }')
    echo "run ${i} peer: ${s} s/step (${wall} s / ${steps} steps)"
    peer+=("${s}")
  else
    echo "sdk_loop_bench: the built-in trainer failed: $(tail -n 3 "${work}/peer${i}.err")" >&2
    status=1
    break
  fi
done

o=$(printf '%s\n' "${ours[@]}" | grep . | median || echo null)
p=$(printf '%s\n' "${peer[@]}" | grep . | median || echo null)
[[ ${status} -eq 0 ]] || { [[ ${#peer[@]} -eq ${runs} ]] || p=null; [[ ${#ours[@]} -eq ${runs} ]] || o=null; }
ratio=$(awk -v o="${o}" -v p="${p}" 'BEGIN { if (o == "null" || p == "null" || p == 0) print "null"; else printf "%.3f", o / p }')
echo "{\"bench\": \"sdk_loop_bench\", \"metric\": \"seconds_per_step_fashion_mnist_mlp\", \"unit\": \"s\", \"ours\": ${o}, \"peer\": ${p}, \"peer_name\": \"chorus_builtin_trainer\", \"ratio\": ${ratio}}"
exit "${status}"
