#!/usr/bin/env bash
# Program-job benchmark: an unmodified torchrun script run as a Chorus program
# job against the same script under torchrun.
#
# What it measures
#   Wall-clock seconds of the whole command, startup and teardown included, for
#     ours:  chorus up --local 2 SPEC --json, SPEC a program job running
#            /usr/bin/python3 tests/bench/torchrun_fashion_mnist.py ARGS on each rank
#     peer:  python3 -m torch.distributed.run --standalone --nproc_per_node 2
#            tests/bench/torchrun_fashion_mnist.py ARGS
#   Same script, same arguments (its defaults: MLP on Fashion-MNIST, 5 epochs,
#   2 ranks x 1 thread, gloo over loopback), same machine, alternating runs
#   (chorus, torchrun, chorus, ...). A side counts only if it exits 0 and rank
#   0 prints its FINAL line; both accuracies are printed (they should agree
#   within noise: the same seeds, sampler and world size).
#
# How to run (from any directory; the script changes to the repository root)
#   tests/bench/program_bench.sh [--runs N] [-- SCRIPT_ARGS...]
#     --runs N   repeat both sides N times (default 1, at most 20) and report
#                the median wall time of each side.
#   Environment:
#     CHORUS        chorus CLI (default bazel-bin/client/chorus; build it with
#                   `bazel build //client:chorus`).
#     TORCH_PYTHON  python with torch.distributed (default /usr/bin/python3).
#     BENCH_TIMEOUT seconds allowed for each command (default 600).
#
# Output
#   One line per run, then as the LAST line one JSON object (docs/benchmarks.md):
#     {"bench": "program_bench", "metric": "wall_seconds_torchrun_fashion_mnist",
#      "unit": "s", "ours": X, "peer": Y, "peer_name": "torchrun", "ratio": X/Y}
#   ratio < 1 means the program job is faster. A side that fails is null, and
#   the script exits 1.
#
# Notes on the peer command: Debian's torch 1.13 under Python 3.11 needs
# "--redirects 1 --tee 1" (see tests/bench/e2e_bench.sh); torchrun's default
# 5 s --monitor_interval is left as users run it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CHORUS=${CHORUS:-bazel-bin/client/chorus}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-600}
SCRIPT=tests/bench/torchrun_fashion_mnist.py

runs=1
script_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) [[ $# -ge 2 ]] || { echo "program_bench: --runs needs a value" >&2; exit 2; }; runs=$2; shift 2 ;;
    --) shift; script_args=("$@"); break ;;
    -h|--help) sed -n '/^# How to run/,/^#     BENCH_TIMEOUT/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "program_bench: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if ! [[ "${runs}" =~ ^[0-9]+$ ]] || (( runs < 1 || runs > 20 )); then
  echo "program_bench: --runs must be an integer in 1..20, got '${runs}'" >&2
  exit 2
fi
[[ -x "${CHORUS}" ]] || { echo "program_bench: chorus binary '${CHORUS}' not found (set CHORUS)" >&2; exit 1; }
"${TORCH_PYTHON}" -c 'import numpy, torch.distributed as d; assert d.is_available()' 2>/dev/null \
  || { echo "program_bench: ${TORCH_PYTHON} cannot import torch.distributed and numpy" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/program_bench.XXXXXX")
trap 'rm -rf -- "${TMP}"' EXIT

# The program job: the script by absolute path, the same arguments.
{
  echo "name: program-bench"
  echo "program:"
  printf '  argv: [%s, %s' "${TORCH_PYTHON}" "$(pwd)/${SCRIPT}"
  for a in "${script_args[@]+"${script_args[@]}"}"; do printf ', "%s"' "${a}"; done
  echo "]"
  echo "  env: {GLOO_SOCKET_IFNAME: lo}"
  echo "resources: {min_ranks: 2}"
} >"${TMP}/spec.yaml"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
accuracy() { sed -n 's/^.*FINAL {.*"test_accuracy": \([0-9.]*\).*$/\1/p' "$1" | head -n 1; }
median() { printf '%s\n' "$@" | sort -g | awk 'NF { v[++n] = $1 } END {
  if (n == 0) { print "null"; exit }
  if (n % 2) printf "%.3f", v[(n + 1) / 2]; else printf "%.3f", (v[n / 2] + v[n / 2 + 1]) / 2 }'; }

ours_times=(); peer_times=(); ours_ok=1; peer_ok=1

run_chorus() {
  local dir="${TMP}/ours.$1" t0 t1 rc=0 acc
  t0=$(now)
  timeout --kill-after=30 "${BENCH_TIMEOUT}" "${CHORUS}" up --local 2 --state_dir "${dir}" \
    "${TMP}/spec.yaml" --json >"${TMP}/ours.$1.out" 2>"${TMP}/ours.$1.err" || rc=$?
  t1=$(now)
  acc=$(accuracy "${dir}/worker.log" 2>/dev/null || true)
  echo "run $1/${runs} program job: wall $(elapsed "${t0}" "${t1}") s  test_accuracy ${acc:-n/a}  exit ${rc}"
  if [[ ${rc} -ne 0 || -z "${acc}" ]]; then
    echo "program_bench: the program job FAILED in run $1:" >&2; tail -n 5 "${TMP}/ours.$1.err" >&2 || true
    ours_ok=0
  fi
  ours_times+=("$(elapsed "${t0}" "${t1}")")
}

run_peer() {
  local t0 t1 rc=0 acc
  mkdir -p "${TMP}/peer.$1.logs"
  t0=$(now)
  OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo timeout --kill-after=30 "${BENCH_TIMEOUT}" \
    "${TORCH_PYTHON}" -m torch.distributed.run --standalone --nproc_per_node 2 \
    --redirects 1 --tee 1 --log_dir "${TMP}/peer.$1.logs" \
    "${SCRIPT}" "${script_args[@]+"${script_args[@]}"}" >"${TMP}/peer.$1.out" 2>"${TMP}/peer.$1.err" || rc=$?
  t1=$(now)
  acc=$(accuracy "${TMP}/peer.$1.out")
  echo "run $1/${runs} torchrun:    wall $(elapsed "${t0}" "${t1}") s  test_accuracy ${acc:-n/a}  exit ${rc}"
  if [[ ${rc} -ne 0 || -z "${acc}" ]]; then
    echo "program_bench: torchrun FAILED in run $1:" >&2; tail -n 5 "${TMP}/peer.$1.err" >&2 || true
    peer_ok=0
  fi
  peer_times+=("$(elapsed "${t0}" "${t1}")")
}

echo "program_bench: ${SCRIPT}${script_args[*]+" ${script_args[*]}"}, ${runs} run(s), $(nproc) CPU(s)"
for ((i = 1; i <= runs; i++)); do
  run_chorus "${i}"
  run_peer "${i}"
  (( ours_ok && peer_ok )) || break
done

ours=null; peer=null; ratio=null
(( ours_ok )) && ours=$(median "${ours_times[@]}")
(( peer_ok )) && peer=$(median "${peer_times[@]}")
if [[ "${ours}" != null && "${peer}" != null ]]; then
  ratio=$(awk -v a="${ours}" -v b="${peer}" 'BEGIN { printf "%.4f", a / b }')
fi
echo "program job: median ${ours} s; torchrun: median ${peer} s"
printf '{"bench": "program_bench", "metric": "wall_seconds_torchrun_fashion_mnist", "unit": "s", "ours": %s, "peer": %s, "peer_name": "torchrun", "ratio": %s}\n' \
  "${ours}" "${peer}" "${ratio}"
(( ours_ok && peer_ok )) || exit 1
