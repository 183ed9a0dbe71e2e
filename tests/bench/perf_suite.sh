#!/usr/bin/env bash
# The performance suite: the benchmarks behind the README's figures, one after
# the other, each running its peer in the same invocation, then one table of
# every ratio against its target.
#
#   allreduce   //bench:allreduce_bench             against raw gloo::allreduce
#   ddp         //bench:ddp_bench                   against PyTorch DDP 1.13 (gloo)
#   gossip      tests/bench/decentralized_bench.sh  against Chorus DDP on 1 Gbit/s links
#   checkpoint  tests/bench/checkpoint_bench.sh     against torch.save and dd conv=fsync
#
# Targets (docs/benchmarks.md says where each comes from):
#   all-reduce: ratio <= 0.5 at 25 MB and 100 MB, <= 1.0 at 1 MB, and no page
#     faults per op in steady state (<= 0.5 on average);
#   DDP: small MLP ratio <= 0.9, big MLP (14.2 M) <= 0.75, and each model's
#     step <= 1.3x its compute alone;
#   gossip: ratio <= 0.75;
#   checkpoint: stall ratio <= 0.2, upload+commit and SHARED_DIR >= 0.8 of dd.
#
# Nothing else should run on the machine meanwhile: the figures are ratios
# taken in the same run, but two cores shared with a build are not two cores.
#
# Usage (as root: the gossip bench makes network namespaces):
#   tests/bench/perf_suite.sh [--out DIR] [--no-build] [--only LIST]
#     --out DIR    keep each bench's full output as DIR/NAME.log (default: a
#                  new temp dir, printed at the end)
#     --no-build   use bazel-bin as it is; by default the bench targets are
#                  built first with `bazel build -c opt`
#     --only LIST  comma-separated subset of allreduce,ddp,gossip,checkpoint
#
# Output: the machine first (date, uptime, kernel, commit, and machine-facts:
# cores, page_reporting_order, the cost of a first touch of a page), then each
# bench's summary lines as it ends, then the table, and last one JSON line:
#   {"suite": "perf", "targets": N, "met": M, "not_met": [...], "failed": [...]}
# Exit status: 0 when every bench ran (a missed target is in the table and the
# JSON line, not in the status), 1 when a bench failed, 2 on bad usage.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

readonly ALL_BENCHES=allreduce,ddp,gossip,checkpoint
readonly BENCH_TIMEOUT_S=1200 # each bench; the slowest (ddp) takes ~4 min here

usage() { sed -n '/^# Usage/,/^#                  new temp dir/p' "$0" | sed 's/^# \{0,1\}//'; }

out=""
build=1
only=${ALL_BENCHES}
while (($#)); do
  case "$1" in
    --out) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --only) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; only=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "perf_suite: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
IFS=, read -r -a benches <<<"${only}"
for b in "${benches[@]}"; do
  [[ ",${ALL_BENCHES}," == *",${b},"* ]] \
    || { echo "perf_suite: --only: unknown bench '${b}' (choose from ${ALL_BENCHES})" >&2; exit 2; }
done
if [[ -z "${out}" ]]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/perf_suite.XXXXXX")
else
  mkdir -p "${out}" || { echo "perf_suite: cannot create --out '${out}'" >&2; exit 2; }
fi
out=$(realpath "${out}")

if ((build)); then
  echo "perf_suite: building the bench targets (bazel build -c opt)" >&2
  bazel build -c opt //bench:allreduce_bench //bench:ddp_bench \
    //worker/decentralized:decentralized_bench_rank //common:machine-facts \
    //coordinator:chorus-coordinator //worker:chorus-worker //client:chorus \
    >"${out}/build.log" 2>&1 \
    || { tail -20 "${out}/build.log" >&2; echo "perf_suite: build failed (${out}/build.log)" >&2; exit 1; }
fi
[[ -x bazel-bin/common/machine-facts ]] \
  || { echo "perf_suite: bazel-bin/common/machine-facts missing: run without --no-build" >&2; exit 1; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "uptime: $(awk '{ printf "%.0f min", $1 / 60 }' /proc/uptime)"
  echo "kernel: $(uname -r)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "machine: $(bazel-bin/common/machine-facts)"
} | tee "${out}/machine.txt"

# Runs one bench with a time limit; its full output goes to OUT/NAME.log.
run_bench() {
  local name=$1
  shift
  local start=${SECONDS}
  echo "perf_suite: ${name}: $*" >&2
  timeout --kill-after=30 "${BENCH_TIMEOUT_S}" "$@" >"${out}/${name}.log" 2>&1
  local rc=$?
  echo "perf_suite: ${name}: exit ${rc} after $((SECONDS - start)) s" >&2
  grep -E '^\{"bench"|target|^allreduce |: ratio|ratio [0-9]' "${out}/${name}.log" | tail -12 >&2
  return "${rc}"
}

failed=()
for b in "${benches[@]}"; do
  case "${b}" in
    allreduce) run_bench allreduce bazel-bin/bench/allreduce_bench || failed+=(allreduce) ;;
    ddp) run_bench ddp bazel-bin/bench/ddp_bench || failed+=(ddp) ;;
    gossip) run_bench gossip tests/bench/decentralized_bench.sh --runs 1 --steps 20 || failed+=(gossip) ;;
    checkpoint) run_bench checkpoint tests/bench/checkpoint_bench.sh --runs 1 || failed+=(checkpoint) ;;
  esac
done

python3 tests/bench/perf_summary.py "${out}" "${only}" "${failed[*]:-}"
((${#failed[@]} == 0))
