#!/usr/bin/env bash
# End-to-end benchmark: Chorus against torchrun + PyTorch DDP on the same job.
#
# What it measures
#   Wall-clock seconds of the whole command, startup and teardown included, for
#     ours:  chorus up --local 2 examples/fashion_mnist_mlp_ddp.textproto --json
#     peer:  torchrun --standalone --nproc_per_node 2 tests/bench/torchrun_fashion_mnist.py
#   Both train the same model on the same files with the same recipe (MLP
#   784-256-128-10, Fashion-MNIST, 2 CPU ranks x 1 thread, batch 64 per rank,
#   5 epochs = 2340 steps, SGD lr 0.05 momentum 0.9, 100 warmup steps then
#   cosine, evaluation on the full 10k test split; the peer uses gloo over
#   loopback). A side counts only if it finishes and reaches test accuracy
#   >= 0.88, hence the metric name "wall_seconds_to_0.88_fashion_mnist_mlp".
#   Nothing is warmed up or cached beforehand by this script; the runs of the
#   two sides alternate (chorus, torchrun, chorus, torchrun, ...).
#
# How to run (from any directory; the script changes to the repository root)
#   tests/bench/e2e_bench.sh [--runs N]
#     --runs N   repeat both sides N times (default 1, at most 50), alternately,
#                and report the median wall time of each side.
#   Environment:
#     CHORUS        chorus CLI binary (default bazel-bin/client/chorus, relative
#                   to the repository root; build it with
#                   `bazel build //client:chorus`).
#     TORCH_PYTHON  a python with torch.distributed (default /usr/bin/python3).
#     BENCH_TIMEOUT seconds allowed for each command (default 600).
#     TORCHRUN_EXTRA_ARGS  extra torchrun options, e.g. "--monitor_interval 1"
#                   (default none: torchrun as users run it).
#
# Output
#   Human-readable lines per run and a summary with both accuracies and times,
#   then, as the LAST line, one JSON object:
#     {"bench": "e2e_bench", "metric": "wall_seconds_to_0.88_fashion_mnist_mlp",
#      "unit": "s", "ours": X, "peer": Y, "peer_name": "torchrun+pytorch_ddp",
#      "ratio": X/Y}
#   ratio < 1 means Chorus is faster.
#
# Failure
#   If either side fails (nonzero exit, timeout, no result) or ends below test
#   accuracy 0.88, a message naming the side and its accuracy goes to stderr,
#   no further runs start, the JSON line is still printed as the last stdout
#   line with null for that side (and null ratio), and the script exits 1.
#
# Notes on the peer command
#   Debian's torch 1.13 under Python 3.11 cannot parse torchrun's default
#   "--redirects 0 --tee 0" (Python 3.11 no longer lists the zero-valued
#   IntFlag member Std.NONE, so the launcher crashes with "'NoneType' object
#   has no attribute 'get'"). The peer is therefore launched with
#   "--redirects 1 --tee 1": each worker's stdout goes to a log file under this
#   script's temporary directory and is echoed to the console by torchrun.
#   torchrun's agent looks at its workers every --monitor_interval seconds
#   (default 5 in torch 1.13), so the peer's wall time includes 0..5 s between
#   the workers' exit and torchrun's; it is left at the default, as users run
#   it (TORCHRUN_EXTRA_ARGS="--monitor_interval 1" shortens it).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CHORUS=${CHORUS:-bazel-bin/client/chorus}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-600}
read -r -a TORCHRUN_EXTRA <<<"${TORCHRUN_EXTRA_ARGS:-}"
SPEC=examples/fashion_mnist_mlp_ddp.textproto
PEER_SCRIPT=tests/bench/torchrun_fashion_mnist.py
DATA_DIR=/usr/share/datasets/fashion-mnist
TARGET=0.88
MAX_RUNS=50

usage() { sed -n '/^# How to run/,/^#                   (default none/p' "$0" | sed 's/^# \{0,1\}//'; }

runs=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; runs=$2; shift 2 ;;
    --runs=*) runs=${1#--runs=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "e2e_bench: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if ! [[ "${runs}" =~ ^[0-9]+$ ]] || (( runs < 1 || runs > MAX_RUNS )); then
  echo "e2e_bench: --runs must be an integer in 1..${MAX_RUNS}, got '${runs}'" >&2
  exit 2
fi

# --- preconditions
[[ -x "${CHORUS}" ]] || { echo "e2e_bench: chorus binary '${CHORUS}' not found or not executable (set CHORUS)" >&2; exit 1; }
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [[ -r "${DATA_DIR}/${f}" ]] || { echo "e2e_bench: missing data file ${DATA_DIR}/${f}" >&2; exit 1; }
done
"${TORCH_PYTHON}" -c 'import numpy, torch, torch.distributed as d; assert d.is_available()' 2>/dev/null \
  || { echo "e2e_bench: ${TORCH_PYTHON} cannot import torch.distributed and numpy (set TORCH_PYTHON)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/e2e_bench.XXXXXX")
trap 'rm -rf -- "${TMP}"' EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
# json_field FILE KEY...: the value at that key path of the JSON object in FILE, or empty.
json_field() {
  "${TORCH_PYTHON}" - "$@" <<'PY' 2>/dev/null || true
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for k in sys.argv[2:]:
        v = v[k]
    print(v)
except Exception:
    pass
PY
}
reached() { awk -v a="${1:-0}" -v t="${TARGET}" 'BEGIN { exit !(a + 0 >= t + 0) }'; }
median() { printf '%s\n' "$@" | sort -g | awk 'NF { v[++n] = $1 } END {
  if (n == 0) { print "null"; exit }
  if (n % 2) printf "%.3f", v[(n + 1) / 2]; else printf "%.3f", (v[n / 2] + v[n / 2 + 1]) / 2 }'; }

ours_times=(); peer_times=(); ours_accs=(); peer_accs=()
ours_ok=1; peer_ok=1

run_chorus() {  # $1 = run index
  local out="${TMP}/chorus.$1.out" err="${TMP}/chorus.$1.err" res="${TMP}/chorus.$1.json"
  local t0 t1 rc=0 wall state acc inner
  t0=$(now)
  timeout --kill-after=30 "${BENCH_TIMEOUT}" "${CHORUS}" up --local 2 "${SPEC}" --json >"${out}" 2>"${err}" || rc=$?
  t1=$(now)
  wall=$(elapsed "${t0}" "${t1}")
  tail -n 1 "${out}" >"${res}" || true
  state=$(json_field "${res}" state)
  acc=$(json_field "${res}" final_metrics test_accuracy)
  inner=$(json_field "${res}" final_metrics wall_seconds)
  echo "run $1/${runs} chorus:   wall ${wall} s  test_accuracy ${acc:-n/a}  state ${state:-n/a}  exit ${rc}  (job's own wall_seconds ${inner:-n/a})"
  if [[ ${rc} -ne 0 || "${state}" != "SUCCEEDED" || -z "${acc}" ]]; then
    echo "e2e_bench: chorus FAILED in run $1 (exit ${rc}$([[ ${rc} -eq 124 || ${rc} -eq 137 ]] && echo ", timed out after ${BENCH_TIMEOUT} s"), state '${state:-none}', test_accuracy ${acc:-n/a}); last output:" >&2
    tail -n 5 "${out}" >&2 || true; tail -n 10 "${err}" >&2 || true
    ours_ok=0
  elif ! reached "${acc}"; then
    echo "e2e_bench: chorus ended below the target in run $1: test_accuracy ${acc} < ${TARGET}" >&2
    ours_ok=0
  fi
  [[ -n "${acc}" ]] && ours_accs+=("${acc}")
  ours_times+=("${wall}")
}

run_peer() {  # $1 = run index
  local out="${TMP}/peer.$1.out" err="${TMP}/peer.$1.err" res="${TMP}/peer.$1.json"
  local logs="${TMP}/peer.$1.logs" t0 t1 rc=0 wall acc inner
  mkdir -p "${logs}"
  t0=$(now)
  OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo \
    timeout --kill-after=30 "${BENCH_TIMEOUT}" "${TORCH_PYTHON}" -m torch.distributed.run \
      --standalone --nproc_per_node 2 --redirects 1 --tee 1 --log_dir "${logs}" \
      "${TORCHRUN_EXTRA[@]+"${TORCHRUN_EXTRA[@]}"}" "${PEER_SCRIPT}" >"${out}" 2>"${err}" || rc=$?
  t1=$(now)
  wall=$(elapsed "${t0}" "${t1}")
  # torchrun echoes worker stdout with a "[default0]:" style prefix.
  { grep -m 1 'FINAL {' "${out}" || true; } | sed 's/^.*FINAL //' >"${res}"
  acc=$(json_field "${res}" test_accuracy)
  inner=$(json_field "${res}" wall_seconds)
  echo "run $1/${runs} torchrun: wall ${wall} s  test_accuracy ${acc:-n/a}  exit ${rc}  (rank 0's own wall_seconds after import torch ${inner:-n/a})"
  if [[ ${rc} -ne 0 || -z "${acc}" ]]; then
    echo "e2e_bench: torchrun+pytorch_ddp FAILED in run $1 (exit ${rc}$([[ ${rc} -eq 124 || ${rc} -eq 137 ]] && echo ", timed out after ${BENCH_TIMEOUT} s"), test_accuracy ${acc:-n/a}); last output:" >&2
    tail -n 5 "${out}" >&2 || true; tail -n 10 "${err}" >&2 || true
    peer_ok=0
  elif ! reached "${acc}"; then
    echo "e2e_bench: torchrun+pytorch_ddp ended below the target in run $1: test_accuracy ${acc} < ${TARGET}" >&2
    peer_ok=0
  fi
  [[ -n "${acc}" ]] && peer_accs+=("${acc}")
  peer_times+=("${wall}")
}

echo "e2e_bench: ${SPEC}, ${runs} run(s), chorus=${CHORUS}, peer=${TORCH_PYTHON} torch $("${TORCH_PYTHON}" -c 'import torch; print(torch.__version__)'), $(nproc) CPU(s)"
for ((i = 1; i <= runs; i++)); do
  run_chorus "${i}"
  run_peer "${i}"
  (( ours_ok && peer_ok )) || { echo "e2e_bench: stopping after run ${i} of ${runs}" >&2; break; }
done

ours_med=$(median "${ours_times[@]}"); peer_med=$(median "${peer_times[@]}")
echo "chorus   (ours): median wall ${ours_med} s over ${#ours_times[@]} run(s): ${ours_times[*]}; test_accuracy ${ours_accs[*]:-n/a}"
echo "torchrun (peer): median wall ${peer_med} s over ${#peer_times[@]} run(s): ${peer_times[*]}; test_accuracy ${peer_accs[*]:-n/a}"

ours_json=null; peer_json=null; ratio_json=null
(( ours_ok )) && ours_json=${ours_med}
(( peer_ok )) && peer_json=${peer_med}
if [[ "${ours_json}" != null && "${peer_json}" != null ]]; then
  ratio_json=$(awk -v a="${ours_json}" -v b="${peer_json}" 'BEGIN { printf "%.4f", a / b }')
  echo "ratio ours/peer = ${ratio_json} ($(awk -v r="${ratio_json}" 'BEGIN { if (r < 1) printf "Chorus %.2fx faster", 1 / r; else printf "Chorus %.2fx slower", r }'))"
fi
printf '{"bench": "e2e_bench", "metric": "wall_seconds_to_0.88_fashion_mnist_mlp", "unit": "s", "ours": %s, "peer": %s, "peer_name": "torchrun+pytorch_ddp", "ratio": %s}\n' \
  "${ours_json}" "${peer_json}" "${ratio_json}"
(( ours_ok && peer_ok )) || exit 1
