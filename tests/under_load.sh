#!/usr/bin/env bash
# Runs test targets (or any command) beside CPU-bound busy loops, so that
# anyone can reproduce what a loaded machine does to the suite: a laptop with
# a browser open, a CI runner shared with other jobs (docs/building.md,
# "Testing on a busy machine").
#
# Usage:
#   tests/under_load.sh [--loops N] [--max_seconds S] TARGET... [-- BAZEL_FLAG...]
#   tests/under_load.sh [--loops N] [--max_seconds S] --command 'SHELL COMMAND'
#
#   --loops N          busy loops beside the tests (default 2: load >= 4 on 2
#                      cores together with the tests' own processes)
#   --max_seconds S    no loop outlives S seconds (default 5400), whatever
#                      happens to this script; they also end with the tests
#   --command CMD      run CMD (bash -c) instead of `bazel test`, e.g.
#                      'CI=true bash .ci/run' (CHORUS_UNDER_LOAD_PID: this
#                      script's pid, the last argument of each of its loops)
# Targets are run with `bazel test --nocache_test_results TARGET... FLAG...`.
# Prints the load average every minute while the tests run, then the line
# "under load: N loop(s), load A..B, T s" and, last, the command's own last
# line (.ci/run's counts stay last); exits with the command's status.
#
# Example: tests/under_load.sh //tests:ha_e2e_test //tests:lib_test -- --runs_per_test=3
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "under_load.sh: $*" >&2; exit 2; }

loops=2
max_seconds=5400
command=""
targets=()
bazel_flags=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --loops) [[ $# -ge 2 ]] || die "--loops needs a count"; loops=$2; shift 2 ;;
    --max_seconds) [[ $# -ge 2 ]] || die "--max_seconds needs a number"; max_seconds=$2; shift 2 ;;
    --command) [[ $# -ge 2 ]] || die "--command needs a shell command"; command=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; bazel_flags=("$@"); break ;;
    -*) die "unknown flag '$1' (targets first, bazel flags after --; see --help)" ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "${loops}" =~ ^[0-9]+$ ]] || die "--loops must be a whole number, got '${loops}'"
[[ "${max_seconds}" =~ ^[1-9][0-9]*$ ]] || die "--max_seconds must be a whole number > 0, got '${max_seconds}'"
if [[ -n "${command}" ]]; then
  ((${#targets[@]} == 0)) || die "give targets or --command, not both"
else
  ((${#targets[@]} > 0)) || die "no test targets given (e.g. //tests:lib_test), nor --command"
fi

# The loops: each a process group of its own, spinning in a shell loop that
# checks its own deadline and that this script still runs (a script killed
# with SIGKILL runs no trap: its loops must not spin on for hours), under
# `timeout` as well.
loop_pids=()
stop_loops() {
  local pid
  for pid in "${loop_pids[@]}"; do kill -TERM -- "-${pid}" 2>/dev/null; done
  for pid in "${loop_pids[@]}"; do wait "${pid}" 2>/dev/null; done
  loop_pids=()
}
trap stop_loops EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < loops; i++)); do
  setsid timeout "${max_seconds}" bash -c \
    'end=$((SECONDS + $1)); while ((SECONDS < end)) && kill -0 "$2" 2>/dev/null; do
       for ((i = 0; i < 100000; i++)); do :; done
     done' busy "${max_seconds}" "$$" &
  loop_pids+=($!)
done

load() { cut -d' ' -f1 /proc/loadavg; }
started=${SECONDS}
# Samples the load once a minute into a file while the command runs (the
# first minute's average still counts the quiet time before the loops).
# Its own process group, so that its sleep ends with it; like the loops, it
# stops when this script is gone.
samples=$(mktemp)
export -f load
setsid bash -c 'while sleep 1 && kill -0 "$2" 2>/dev/null; do
    ((SECONDS % 60 == 0)) || continue
    echo "under load: $(load) after ${SECONDS} s" >&2
    load >>"$1"
  done' sampler "${samples}" "$$" &
sampler=$!

# The command (and the tests) can tell this harness's loops from those of
# another one running beside it: each loop's last argument is this pid.
export CHORUS_UNDER_LOAD_PID=$$
out=$(mktemp)
if [[ -n "${command}" ]]; then
  bash -c "${command}" 2>&1 | tee "${out}"
  status=${PIPESTATUS[0]}
else
  bazel test --nocache_test_results "${targets[@]}" "${bazel_flags[@]}" 2>&1 | tee "${out}"
  status=${PIPESTATUS[0]}
fi
load >>"${samples}"  # with the loops still running
kill -TERM -- "-${sampler}" 2>/dev/null
wait "${sampler}" 2>/dev/null
stop_loops
min_load=$(sort -g "${samples}" | head -n 1)
max_load=$(sort -g "${samples}" | tail -n 1)
rm -f "${samples}"
last=$(tail -n 1 "${out}")
rm -f "${out}"
echo "under load: ${loops} loop(s), load ${min_load:-n/a}..${max_load:-n/a} (1-min averages, once a minute and at the end), $((SECONDS - started)) s"
echo "${last}"
exit "${status}"
