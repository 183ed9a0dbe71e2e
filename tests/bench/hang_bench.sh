#!/usr/bin/env bash
# Hang-diagnosis benchmark: Chorus against torchrun + PyTorch DDP (gloo) on the
# same injected faults, in the same invocation.
#
# What it measures
#   For two fault classes, the seconds from the moment the fault happens to a
#   diagnosis that names the culprit rank (rank 1), and whether it does name it:
#     NEVER_JOINED  rank 1 stalls (sleeps) before its step 10 while rank 0
#                   waits in the gradient all-reduce. Chorus: a 60 s HANG fault;
#                   PyTorch: rank 1 sleeps 150 s, longer than its 60 s timeout.
#     MISMATCH      at step 10 both ranks issue two extra all-reduces, first
#                   (4 floats) then second (8 floats); rank 1 issues them in the
#                   opposite order.
#   Job on both sides: MLP 32-64-ReLU-4 on 8192 synthetic samples, 2 CPU ranks,
#   32 samples per rank per step, SGD.
#   Chorus (ours): `chorus up --local 2` with fault_injection and
#     hang_detection { action: REPORT } (stall_after 3 s, dead_after 5 s). The
#     faulty rank logs "fault injection: ... (unix_us N)" when the fault starts;
#     `chorus status --json` is polled every 100 ms until `diagnoses` holds the
#     expected kind with rank 1 in `ranks`; the time is the diagnosis'
#     first_seen_us (set by the coordinator) minus N. The run is then stopped
#     with SIGINT. A healthy run (no fault, 3 epochs, to completion) is also
#     watched with `chorus watch` and its " problem " events are counted: false
#     diagnoses, which must be 0.
#   PyTorch (peer): tests/bench/torch_hang_peer.py under torchrun. Rank 1 prints
#     "FAULT unix_us=N" when the fault starts; a rank that catches an exception
#     prints "DETECTED unix_us=M rank=R ERROR=<message>" and exits 1. The time is
#     the earliest M minus N; the culprit counts as named when the error of the
#     OTHER rank (rank 0) contains "rank 1", "Rank 1", "ranks 1", "Ranks 1" or
#     "[1]" (the message is printed as is, so the reader can judge).
#   Per class and system the median over the runs is reported.
#
# How to run (from any directory; the script changes to the repository root)
#   tests/bench/hang_bench.sh [--runs N] [--peer_runs M]
#     --runs N        repeat each Chorus class N times (default 1, at most 10).
#     --peer_runs M   repeat each PyTorch class M times (default 1, at most 10;
#                     a NEVER_JOINED run takes ~70 s, all of it the timeout).
#   Environment:
#     CHORUS        chorus CLI binary (default bazel-bin/client/chorus, relative
#                   to the repository root).
#     TORCH_PYTHON  a python with torch.distributed (default /usr/bin/python3).
#
# Peer flags
#   python3 -m torch.distributed.run   is torchrun.
#   --standalone            single-node rendezvous on a local C10d store
#                           (localhost:29400); no external rendezvous.
#   --nproc_per_node 2      two worker processes, ranks 0 and 1.
#   --redirects 1 --tee 1   worker stdout goes to a log file and is echoed by
#                           torchrun prefixed "[default<rank>]:". Required here:
#                           Debian's torch 1.13 under Python 3.11 crashes on the
#                           default "--redirects 0 --tee 0" (Std.NONE lookup).
#   GLOO_SOCKET_IFNAME=lo   gloo traffic on loopback.
#   OMP_NUM_THREADS=1       one compute thread per rank, as Chorus' ranks.
#   TORCH_DISTRIBUTED_DEBUG=DETAIL  PyTorch's most helpful (and most expensive)
#                           mode: every collective is first checked across ranks
#                           (fingerprint: op, shapes, dtypes) with a
#                           monitoredBarrier, so a missing rank or a mismatched
#                           collective raises an error naming ranks. Without it,
#                           gloo only reports a timeout without rank.
#   init_process_group("gloo", timeout=60 s)  the collective timeout; the
#                           default is 30 min. The monitoredBarrier raises when
#                           it expires, so NEVER_JOINED takes >= 60 s by design.
#
# Output
#   One row per run (class, system, seconds, culprit named, message truncated to
#   200 chars), medians, the healthy-run false-diagnosis count, then two JSON
#   lines (docs/benchmarks.md); the MISMATCH one first, the NEVER_JOINED one LAST:
#     {"bench": "hang_bench", "metric": "seconds_to_name_mismatch", ...}
#     {"bench": "hang_bench", "metric": "seconds_to_name_never_joined_rank",
#      "unit": "s", "ours": X, "peer": Y,
#      "peer_name": "torchrun+pytorch_ddp(gloo,timeout=60s,DETAIL)", "ratio": X/Y}
#   A side's value is null if any of its runs failed to name rank 1 (then the
#   ratio is null too and the script exits 1); ratio < 1 means Chorus is faster.
#   The script also exits 1 when the healthy run had a false diagnosis or a run
#   left processes behind.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CHORUS=${CHORUS:-bazel-bin/client/chorus}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
PEER_SCRIPT=tests/bench/torch_hang_peer.py
PEER_NAME="torchrun+pytorch_ddp(gloo,timeout=60s,DETAIL)"
MAX_RUNS=10
CHORUS_HANG_S=60        # rank 1's sleep on the Chorus side
PEER_SLEEP_S=150        # rank 1's sleep on the PyTorch side (> its 60 s timeout)
PEER_TIMEOUT_S=60       # PyTorch's process-group timeout
PEER_HARD_TIMEOUT_S=240 # wall-clock limit for one torchrun
POLL_LIMIT=600          # 100 ms polls: 60 s for each wait on the Chorus side

usage() { sed -n '/^# How to run/,/^#                   to the repository root)/p' "$0" | sed 's/^# \{0,1\}//'; }

runs=1
peer_runs=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; runs=$2; shift 2 ;;
    --runs=*) runs=${1#--runs=}; shift ;;
    --peer_runs) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; peer_runs=$2; shift 2 ;;
    --peer_runs=*) peer_runs=${1#--peer_runs=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "hang_bench: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in runs peer_runs; do
  if ! [[ "${!v}" =~ ^[0-9]+$ ]] || (( ${!v} < 1 || ${!v} > MAX_RUNS )); then
    echo "hang_bench: --${v} must be an integer in 1..${MAX_RUNS}, got '${!v}'" >&2
    exit 2
  fi
done

# --- preconditions
[[ -x "${CHORUS}" ]] || { echo "hang_bench: chorus binary '${CHORUS}' not found or not executable (set CHORUS)" >&2; exit 1; }
[[ -r "${PEER_SCRIPT}" ]] || { echo "hang_bench: missing ${PEER_SCRIPT}" >&2; exit 1; }
"${TORCH_PYTHON}" -c 'import torch, torch.distributed as d; assert d.is_available()' 2>/dev/null \
  || { echo "hang_bench: ${TORCH_PYTHON} cannot import torch.distributed (set TORCH_PYTHON)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/hang_bench.XXXXXX")
UP_PID=""
# kill_tree_of DIR: end the processes whose command line contains DIR (all of
# them were started by this script: DIR is this invocation's own temp dir),
# SIGTERM first, SIGKILL after 2 s. Prints how many there were.
kill_tree_of() {
  local pids n=0
  pids=$(pgrep -f -- "$1" | grep -vx "$$" || true)
  [[ -z "${pids}" ]] && { echo 0; return; }
  n=$(wc -w <<<"${pids}")
  # shellcheck disable=SC2086
  kill -TERM ${pids} 2>/dev/null || true
  for _ in $(seq 1 20); do pgrep -f -- "$1" | grep -vqx "$$" || break; sleep 0.1; done
  pids=$(pgrep -f -- "$1" | grep -vx "$$" || true)
  # shellcheck disable=SC2086
  if [[ -n "${pids}" ]]; then kill -KILL ${pids} 2>/dev/null || true; fi
  echo "${n}"
}
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  if [[ -n "${UP_PID}" ]] && kill -0 "${UP_PID}" 2>/dev/null; then
    kill -INT "${UP_PID}" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "${UP_PID}" 2>/dev/null || break; sleep 0.1; done
  fi
  kill_tree_of "${TMP}" >/dev/null
  rm -rf -- "${TMP}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_us() { date +%s%6N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b - a) / 1e6 }'; }
median() { printf '%s\n' "$@" | sort -g | awk 'NF { v[++n] = $1 } END {
  if (n == 0) { print "null"; exit }
  if (n % 2) printf "%.3f", v[(n + 1) / 2]; else printf "%.3f", (v[n / 2] + v[n / 2 + 1]) / 2 }'; }
trunc() { local s=${1//$'\n'/ }; (( ${#s} > 200 )) && s="${s:0:197}..."; printf '%s' "${s}"; }

# diagnosis_of FILE KIND: from `status --json` output in FILE, the first
# diagnosis of KIND that lists rank 1, as "first_seen_us<TAB>ranks<TAB>message";
# empty if none. Also prints, on fd 3, the kinds of all diagnoses (for the record).
diagnosis_of() {
  "${TORCH_PYTHON}" - "$1" "$2" <<'PY' 2>/dev/null || true
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
for g in d.get("diagnoses", []):
    if g.get("kind") == sys.argv[2] and 1 in g.get("ranks", []):
        print("%s\t%s\t%s" % (g.get("first_seen_us", ""), ",".join(map(str, g.get("ranks", []))),
                              g.get("message", "").replace("\n", " ")))
        break
PY
}
all_kinds_of() {
  "${TORCH_PYTHON}" - "$1" <<'PY' 2>/dev/null || true
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(" ".join("%s%s" % (g.get("kind"), g.get("ranks", [])) for g in d.get("diagnoses", [])))
except Exception:
    pass
PY
}

failed=0
rows=()                                   # table rows, TAB separated
declare -A times=()                       # "system:class" -> space-separated seconds
declare -A bad=()                         # "system:class" -> 1 when a run failed to name rank 1

add_row() {  # class system run seconds named message
  rows+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4"$'\t'"$5"$'\t'"$(trunc "$6")")
  if [[ "$5" == yes && "$4" != n/a ]]; then
    times["$2:$1"]+="$4 "
  else
    bad["$2:$1"]=1
  fi
}

write_spec() {  # $1 = file, $2 = fault_injection line (may be empty), $3 = epochs
  cat >"$1" <<SPEC
name: "hangbench"
model { mlp { hidden_sizes: [64] } }
data { synthetic { num_samples: 8192 input_shape: [32] num_classes: 4 } }
training { batch_size_per_rank: 32 epochs: $3 log_every_steps: 5 }
resources { min_ranks: 2 max_ranks: 2 }
$2
hang_detection { action: REPORT }
SPEC
}

# descendants PID: "pid:starttime" of PID and every process below it (the
# coordinator, the worker agent and the ranks of `chorus up --local`).
descendants() {
  local todo=("$1") p c
  while [[ ${#todo[@]} -gt 0 ]]; do
    p=${todo[0]}; todo=("${todo[@]:1}")
    [[ -r /proc/${p}/stat ]] && echo "${p}:$(awk '{ print $22 }' "/proc/${p}/stat" 2>/dev/null)"
    for c in $(ps -o pid= --ppid "${p}" 2>/dev/null); do todo+=("${c}"); done
  done
}
# still_alive LIST: the entries of a descendants list whose process still runs.
still_alive() {
  local e p st
  for e in $1; do
    p=${e%%:*}; st=${e#*:}
    [[ -r /proc/${p}/stat && "$(awk '{ print $22 }' "/proc/${p}/stat" 2>/dev/null)" == "${st}" ]] && echo "${p}"
  done
  return 0
}

# stop_up DIR: SIGINT to `chorus up`, wait for it (bounded), then check that
# no process of its tree is left, nor any whose command line contains DIR.
stop_up() {
  local dir=$1 t0 left tree alive
  tree=$(descendants "${UP_PID}")
  TREE_N=$(wc -w <<<"${tree}")
  t0=$(now_us)
  kill -INT "${UP_PID}" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "${UP_PID}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${UP_PID}" 2>/dev/null; then
    echo "hang_bench: chorus up (pid ${UP_PID}) still running 30 s after SIGINT; killing it" >&2
    kill -KILL "${UP_PID}" 2>/dev/null || true
    failed=1
  fi
  wait "${UP_PID}" 2>/dev/null || true
  UP_PID=""
  TEARDOWN_S=$(secs "${t0}" "$(now_us)")
  sleep 0.5  # let the ranks' exits land
  alive=$(still_alive "${tree}")
  if [[ -n "${alive}" ]]; then
    echo "hang_bench: process(es) of chorus up's tree still running after it ended: $(ps -o pid=,args= -p "$(tr '\n' ',' <<<"${alive}" | sed 's/,$//')" 2>/dev/null | tr '\n' ';'); killing them" >&2
    # shellcheck disable=SC2086
    kill -KILL ${alive} 2>/dev/null || true
    failed=1
  fi
  left=$(kill_tree_of "${dir}")
  left=$((left + $(wc -w <<<"${alive}")))
  if [[ "${left}" != 0 ]]; then
    echo "hang_bench: ${left} process(es) with ${dir} in their command line were left after chorus up ended; killed" >&2
    failed=1
  fi
  LEFT=${left}
}

run_chorus() {  # $1 = NEVER_JOINED|MISMATCH, $2 = run index
  local class=$1 i=$2 dir="${TMP}/chorus.$1.$2" fault addr line fault_us="" diag="" first_us msg named=no s=n/a
  mkdir -p "${dir}"
  if [[ "${class}" == NEVER_JOINED ]]; then
    fault="fault_injection { faults { kind: HANG rank: 1 at_step: 10 duration_seconds: ${CHORUS_HANG_S} } }"
  else
    fault="fault_injection { faults { kind: MISMATCH_COLLECTIVE rank: 1 at_step: 10 } }"
  fi
  write_spec "${dir}/spec.textproto" "${fault}" 1000
  "${CHORUS}" up --local 2 --state_dir "${dir}/s" "${dir}/spec.textproto" >"${dir}/up.out" 2>"${dir}/up.err" &
  UP_PID=$!
  for _ in $(seq 1 300); do [[ -s "${dir}/s/port" ]] && break; sleep 0.1; done
  addr="127.0.0.1:$(cat "${dir}/s/port" 2>/dev/null || true)"
  # The fault time, as the faulty rank logged it.
  for _ in $(seq 1 "${POLL_LIMIT}"); do
    line=$("${CHORUS}" --coordinator "${addr}" logs job-000001 --rank 1 2>/dev/null | grep -m 1 'fault injection: rank 1 .*(unix_us [0-9]*)' || true)
    [[ -n "${line}" ]] && break
    sleep 0.1
  done
  fault_us=$(sed -n 's/.*(unix_us \([0-9]*\)).*/\1/p' <<<"${line}")
  # The diagnosis.
  if [[ -n "${fault_us}" ]]; then
    for _ in $(seq 1 "${POLL_LIMIT}"); do
      "${CHORUS}" --coordinator "${addr}" status job-000001 --json >"${dir}/status.json" 2>/dev/null || true
      diag=$(diagnosis_of "${dir}/status.json" "${class}")
      [[ -n "${diag}" ]] && break
      sleep 0.1
    done
  fi
  local seen_us kinds
  seen_us=$(now_us)
  kinds=$(all_kinds_of "${dir}/status.json")
  stop_up "${dir}"
  if [[ -z "${fault_us}" ]]; then
    msg="no fault line from rank 1 within $((POLL_LIMIT / 10)) s; up stderr: $(tail -n 3 "${dir}/up.err" | tr '\n' ' ')"
    failed=1
  elif [[ -z "${diag}" ]]; then
    msg="no ${class} diagnosis naming rank 1 within $((POLL_LIMIT / 10)) s of the fault; diagnoses seen: ${kinds:-none}"
    failed=1
  else
    first_us=$(cut -f1 <<<"${diag}")
    msg=$(cut -f3- <<<"${diag}")
    s=$(secs "${fault_us}" "${first_us}")
    named=yes
  fi
  echo "run ${i}/${runs} chorus   ${class}: ${s} s (first_seen_us - fault unix_us; status showed it $(secs "${fault_us:-${seen_us}}" "${seen_us}") s after the fault), named rank 1: ${named}, diagnoses: ${kinds:-none}, teardown ${TEARDOWN_S} s, leftover processes ${LEFT} (of ${TREE_N} in chorus up's tree)"
  add_row "${class}" chorus "${i}" "${s}" "${named}" "${msg}"
}

run_peer() {  # $1 = NEVER_JOINED|MISMATCH, $2 = run index
  local class=$1 i=$2 dir="${TMP}/peer.$1.$2" fault rc=0 t0 wall fault_us det det_us det_rank err0 err_first named=no s=n/a msg left
  mkdir -p "${dir}/logs"
  fault=$([[ "${class}" == NEVER_JOINED ]] && echo never_joined || echo mismatch)
  t0=$(now_us)
  GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 TORCH_DISTRIBUTED_DEBUG=DETAIL \
    timeout --kill-after=10 "${PEER_HARD_TIMEOUT_S}" "${TORCH_PYTHON}" -m torch.distributed.run \
      --standalone --nproc_per_node 2 --redirects 1 --tee 1 --log_dir "${dir}/logs" \
      "${PEER_SCRIPT}" --fault "${fault}" --sleep_seconds "${PEER_SLEEP_S}" \
      --timeout_seconds "${PEER_TIMEOUT_S}" --run_dir "${dir}" >"${dir}/out" 2>"${dir}/err" || rc=$?
  wall=$(secs "${t0}" "$(now_us)")
  left=$(kill_tree_of "${dir}")
  fault_us=$(sed -n 's/^.*FAULT unix_us=\([0-9]*\).*$/\1/p' "${dir}/out" | head -n 1)
  # DETECTED lines as "unix_us<TAB>rank<TAB>error", earliest first.
  sed -n 's/^.*DETECTED unix_us=\([0-9]*\) rank=\([0-9]*\) ERROR=\(.*\)$/\1\t\2\t\3/p' "${dir}/out" | sort -n >"${dir}/detected"
  det=$(head -n 1 "${dir}/detected")
  err0=$(awk -F'\t' '$2 == 0 { print $3; exit }' "${dir}/detected")
  if [[ -z "${fault_us}" ]]; then
    msg="no FAULT line (torchrun exit ${rc}); stderr: $(tail -n 3 "${dir}/err" | tr '\n' ' ')"
  elif [[ -z "${det}" ]]; then
    msg="no rank raised (torchrun exit ${rc}$([[ ${rc} -eq 124 || ${rc} -eq 137 ]] && echo ", killed after ${PEER_HARD_TIMEOUT_S} s"))"
  else
    det_us=$(cut -f1 <<<"${det}"); det_rank=$(cut -f2 <<<"${det}"); err_first=$(cut -f3- <<<"${det}")
    s=$(secs "${fault_us}" "${det_us}")
    # The culprit is named when the other rank's error names rank 1.
    if grep -Eq '([Rr]anks? 1([^0-9]|$))|\[1\]' <<<"${err0}"; then named=yes; fi
    msg="rank 0: ${err0:-<no error>}"
    [[ "${det_rank}" != 0 ]] && msg="first raised on rank ${det_rank}: ${err_first} | ${msg}"
  fi
  echo "run ${i}/${peer_runs} torchrun ${class}: ${s} s (earliest DETECTED - FAULT), named rank 1: ${named}, torchrun exit ${rc} after ${wall} s, leftover processes ${left}"
  # Every rank's full error line, verbatim, for the record.
  while IFS=$'\t' read -r u r e; do
    echo "    torchrun ${class} rank ${r} at +$(secs "${fault_us:-${u}}" "${u}") s: ${e}"
  done <"${dir}/detected"
  add_row "${class}" torchrun "${i}" "${s}" "${named}" "${msg}"
}

run_healthy() {
  local dir="${TMP}/chorus.healthy" addr rc=0 wrc=0 problems succeeded metrics watch_pid
  mkdir -p "${dir}"
  write_spec "${dir}/spec.textproto" "" 3
  "${CHORUS}" up --local 2 --state_dir "${dir}/s" "${dir}/spec.textproto" --json >"${dir}/up.out" 2>"${dir}/up.err" &
  UP_PID=$!
  for _ in $(seq 1 300); do [[ -s "${dir}/s/port" ]] && break; sleep 0.1; done
  addr="127.0.0.1:$(cat "${dir}/s/port" 2>/dev/null || true)"
  timeout 300 "${CHORUS}" --coordinator "${addr}" watch job-000001 >"${dir}/watch.out" 2>"${dir}/watch.err" &
  watch_pid=$!
  local tree="" n
  for n in $(seq 1 3000); do
    kill -0 "${UP_PID}" 2>/dev/null || break
    (( n % 5 == 1 )) && tree+=" $(descendants "${UP_PID}")"
    sleep 0.1
  done
  if kill -0 "${UP_PID}" 2>/dev/null; then
    echo "hang_bench: healthy chorus up still running after 300 s; stopping it" >&2
    failed=1
    stop_up "${dir}"
    rc=1
  else
    wait "${UP_PID}" || rc=$?
    UP_PID=""
  fi
  for _ in $(seq 1 100); do kill -0 "${watch_pid}" 2>/dev/null || break; sleep 0.1; done
  kill -0 "${watch_pid}" 2>/dev/null && kill -TERM "${watch_pid}" 2>/dev/null
  wait "${watch_pid}" || wrc=$?
  (( wrc == 0 || wrc == 1 )) || echo "hang_bench: healthy-run watch exited ${wrc}" >&2
  sleep 0.5  # let the ranks' exits land
  local alive
  alive=$(still_alive "$(tr ' ' '\n' <<<"${tree}" | sort -u)")
  if [[ -n "${alive}" ]]; then
    echo "hang_bench: process(es) of the healthy chorus up's tree still running after it ended; killing them" >&2
    # shellcheck disable=SC2086
    kill -KILL ${alive} 2>/dev/null || true
  fi
  LEFT=$(( $(kill_tree_of "${dir}") + $(wc -w <<<"${alive}") ))
  problems=$(grep -c ' problem ' "${dir}/watch.out" || true)
  succeeded=$(grep -c 'state SUCCEEDED' "${dir}/watch.out" || true)
  metrics=$(grep -c ' metrics ' "${dir}/watch.out" || true)
  HEALTHY_PROBLEMS=${problems}
  echo "healthy chorus run (no fault, 3 epochs): chorus up exit ${rc}, final state $(sed -n 's/.*"state": "\([A-Z_]*\)".*/\1/p' "${dir}/up.out" | tail -n 1), watch saw ${metrics} metrics events, SUCCEEDED ${succeeded}x, false diagnoses (' problem ' events): ${problems}, leftover processes ${LEFT} (of $(tr ' ' '\n' <<<"${tree}" | sort -u | grep -c . || true) seen in chorus up's tree)"
  (( problems > 0 )) && grep ' problem ' "${dir}/watch.out" | head -n 5 | sed 's/^/    /'
  if (( rc != 0 || problems != 0 || succeeded != 1 )) || [[ "${LEFT}" != 0 ]]; then
    failed=1
  fi
}

echo "hang_bench: ${runs} Chorus run(s) and ${peer_runs} PyTorch run(s) per class; chorus=${CHORUS}, peer=${TORCH_PYTHON} torch $("${TORCH_PYTHON}" -c 'import torch; print(torch.__version__)'), $(nproc) CPU(s)"
for ((i = 1; i <= runs; i++)); do
  run_chorus NEVER_JOINED "${i}"
  run_chorus MISMATCH "${i}"
  if (( i <= peer_runs )); then
    run_peer NEVER_JOINED "${i}"
    run_peer MISMATCH "${i}"
  fi
done
for ((i = runs + 1; i <= peer_runs; i++)); do
  run_peer NEVER_JOINED "${i}"
  run_peer MISMATCH "${i}"
done
run_healthy

# --- table
echo
printf '%-12s  %-8s  %3s  %9s  %-7s  %s\n' CLASS SYSTEM RUN DETECT_S CULPRIT MESSAGE
for r in "${rows[@]}"; do
  IFS=$'\t' read -r c sys n s named m <<<"${r}"
  printf '%-12s  %-8s  %3s  %9s  %-7s  %s\n' "${c}" "${sys}" "${n}" "${s}" "${named}" "${m}"
done
echo
declare -A med=()
for c in NEVER_JOINED MISMATCH; do
  for sys in chorus torchrun; do
    # shellcheck disable=SC2086
    m=$(median ${times["${sys}:${c}"]:-})
    [[ -n "${bad["${sys}:${c}"]:-}" ]] && m=null
    med["${sys}:${c}"]=${m}
    echo "median ${c} ${sys}: ${m} s over: ${times["${sys}:${c}"]:-none}$([[ -n "${bad["${sys}:${c}"]:-}" ]] && echo " (a run did not name rank 1)")"
  done
done
echo "healthy run false diagnoses: ${HEALTHY_PROBLEMS:-n/a}"

json_line() {  # metric class
  local o=${med["chorus:$2"]} p=${med["torchrun:$2"]} r=null
  if [[ "${o}" != null && "${p}" != null ]]; then
    r=$(awk -v a="${o}" -v b="${p}" 'BEGIN { if (b > 0) printf "%.4f", a / b; else print "null" }')
  fi
  printf '{"bench": "hang_bench", "metric": "%s", "unit": "s", "ours": %s, "peer": %s, "peer_name": "%s", "ratio": %s}\n' \
    "$1" "${o}" "${p}" "${PEER_NAME}" "${r}"
}
json_line seconds_to_name_mismatch MISMATCH
json_line seconds_to_name_never_joined_rank NEVER_JOINED
(( ${#bad[@]} == 0 )) || failed=1
exit "${failed}"
