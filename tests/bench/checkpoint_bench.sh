#!/usr/bin/env bash
# Checkpoint benchmark: Chorus' asynchronous checkpoints against torch.save in a
# PyTorch training loop, and Chorus' upload+commit throughput against dd, in the
# same invocation, on the same disk.
#
# What it measures
#   The job, on both sides: MLP 1024 -> 5000 -> ReLU -> 4000 -> ReLU -> 10
#   (~25.2M float32 parameters, ~100 MB) trained with SGD, momentum 0.9 (the
#   momentum buffers are another ~100 MB), 1 rank, 2 intra-op threads, batches
#   of 32, 40 steps, a checkpoint every 10 steps plus one at the end (Chorus;
#   the peer's 4th save is at step 40 too), keep_last 2. ~200 MB of state.
#   (a) Training stall per checkpoint, seconds.
#       Chorus (ours): the job's `checkpoint_stall_seconds` metric, the time the
#         training loop was blocked copying the state; serialization and upload
#         run in the background. The figure is that of the LAST checkpoint of
#         each run (the final one, taken when training ends) as the job's final
#         metrics report it; the stalls of the checkpoints at steps 10, 20, 30
#         (from the job's metrics events, `chorus watch --json`) are printed too.
#       PyTorch (peer): tests/bench/torch_save_peer.py under python3-torch: the
#         median duration of the torch.save({'model', 'optimizer', 'step'}) call
#         over its 4 saves (torch.save blocks the loop). The os.fsync that
#         follows each save is timed separately and printed, not counted.
#       ratio = ours / peer, lower is better. Target: ratio <= 0.2.
#   (b) Upload+commit throughput, MB/s (1 MB = 10^6 bytes).
#       Chorus (ours): checkpoint_bytes / checkpoint_store_seconds of the last
#         checkpoint; store = the background upload to the coordinator (over
#         its checkpoint data port, raw TCP beside gRPC), which
#         writes the files under its --state_dir, fsyncs, renames and commits
#         (files are serialized while they are uploaded; the CPU time spent
#         serializing is checkpoint_serialize_seconds, printed, not counted).
#         The job is also run with storage SHARED_DIR (a directory in the
#         temp dir): the rank writes and fsyncs the files, the coordinator
#         checks and commits them; same figure, held to the same 0.8 bar
#         (the issue's target names upload+commit; both verdicts are printed).
#       dd (peer): `dd if=/dev/zero of=TMP/dd.bin bs=1M count=N conv=fsync`,
#         N = the checkpoint's size in MiB rounded, on the state dir's
#         filesystem, and the same size with bs=256K (count=4N); bytes /
#         wall-clock seconds of dd. Both run 4 times per run, in turns
#         first, interleaved with the jobs (before the upload job, between
#         the two jobs, after the SHARED_DIR job, after the PyTorch peer), so
#         that they meet the disk and the host in the states the jobs met.
#         The peer figure is the faster of the two medians. (On the
#         development VM, Linux 6.18 on ext4, write()s of 1 MB or more into
#         a new file were 5-7x slower than writes of 64-512 KB, in a C loop
#         as in dd; Chorus writes in 256 KB pieces, so dd gets the small
#         block size too. The fsync after the writes is steadier, 0.1-0.15 s.)
#       ratio = ours / peer, HIGHER is better (unlike the time metrics).
#       Target: ratio >= 0.8.
#   Order in each run: dd x2, Chorus job, dd x2, SHARED_DIR job, dd x2,
#   PyTorch peer, dd x2 (a `sync` before each).
#   Every figure is the median over the runs.
#   Also printed, for information only: the training time Chorus' background
#   serialization+upload takes from the steps that follow a checkpoint (they
#   share the rank's CPUs): the excess of steps 11-40 over steps 6-10, per
#   periodic checkpoint, from the job's per-interval step times.
#
# How to run (from any directory; the script changes to the repository root)
#   tests/bench/checkpoint_bench.sh [--runs N]
#     --runs N   number of runs (default 1, at most 5); ~60 s each.
#   Environment:
#     CHORUS_BIN_DIR  where the binaries are: either bazel-bin's layout
#                     (coordinator/chorus-coordinator, worker/chorus-worker,
#                     client/chorus; default bazel-bin, relative to the
#                     repository root) or one flat directory holding all three.
#     TORCH_PYTHON    a python with torch (default /usr/bin/python3, Debian's
#                     python3-torch). JSON is parsed with plain python3.
#     TMPDIR          where the temp dir (state dir, peer files, dd file) goes.
#     CHORUS_BENCH_KEEP  when set, the temp dir (logs, watch/status output) is
#                     kept and its path printed.
#
# Output
#   Per run: Chorus stall / serialize / store seconds, bytes, MB/s, checkpoints
#   stored / skipped because an upload was still running; torch.save seconds
#   (+ fsync), bytes; dd MB/s. Then the medians, the target verdicts and two
#   JSON lines (docs/benchmarks.md), the stall one LAST:
#     {"bench": "checkpoint_bench", "metric": "upload_commit_MBps_vs_dd", "unit": "MB/s",
#      "ours": X, "peer": Y, "peer_name": "dd conv=fsync (bs=1M or bs=256K, ...)", "ratio": X/Y}
#     {"bench": "checkpoint_bench", "metric": "training_stall_seconds_per_checkpoint",
#      "unit": "s", "ours": X, "peer": Y, "peer_name": "torch.save (python3-torch)", "ratio": X/Y}
#   Exit status 1 when a measurement failed (job not SUCCEEDED, missing metric,
#   peer or dd failure) or processes were left behind; a missed target alone
#   does not change the exit status (the verdict lines say it).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

BIN_DIR=${CHORUS_BIN_DIR:-bazel-bin}
if [[ -x "${BIN_DIR}/coordinator/chorus-coordinator" ]]; then
  COORD="${BIN_DIR}/coordinator/chorus-coordinator"
  WORKER="${BIN_DIR}/worker/chorus-worker"
  CHORUS="${BIN_DIR}/client/chorus"
else
  COORD="${BIN_DIR}/chorus-coordinator"
  WORKER="${BIN_DIR}/chorus-worker"
  CHORUS="${BIN_DIR}/chorus"
fi
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
PY=python3
PEER_SCRIPT=tests/bench/torch_save_peer.py
MAX_RUNS=5
CMD_TIMEOUT_S=300     # every command that could hang
STEPS=40
EVERY=10
LOG_EVERY=5           # must divide EVERY (the per-checkpoint figures read the log events)

usage() { sed -n '/^# How to run/,/^#                     python3-torch). JSON/p' "$0" | sed 's/^# \{0,1\}//'; }

runs=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; runs=$2; shift 2 ;;
    --runs=*) runs=${1#--runs=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "checkpoint_bench: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if ! [[ "${runs}" =~ ^[0-9]+$ ]] || (( runs < 1 || runs > MAX_RUNS )); then
  echo "checkpoint_bench: --runs must be an integer in 1..${MAX_RUNS}, got '${runs}'" >&2
  exit 2
fi

# --- preconditions
for b in "${COORD}" "${WORKER}" "${CHORUS}"; do
  [[ -x "${b}" ]] || { echo "checkpoint_bench: '${b}' not found or not executable (set CHORUS_BIN_DIR)" >&2; exit 1; }
done
[[ -r "${PEER_SCRIPT}" ]] || { echo "checkpoint_bench: missing ${PEER_SCRIPT}" >&2; exit 1; }
# What changes the result on this machine (bazel build //common:machine-facts).
if [[ -x "${BIN_DIR}/common/machine-facts" ]]; then
  echo "checkpoint_bench: machine: $("${BIN_DIR}/common/machine-facts")" >&2
fi
command -v "${PY}" >/dev/null || { echo "checkpoint_bench: python3 not found" >&2; exit 1; }
"${TORCH_PYTHON}" -c 'import torch' 2>/dev/null \
  || { echo "checkpoint_bench: ${TORCH_PYTHON} cannot import torch (set TORCH_PYTHON)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/checkpoint_bench.XXXXXX")
COORD_PID=""
WORKER_PID=""
ADDR=""
RANK_PIDS=""            # "pid:starttime" of the rank processes seen under the worker
failed=0

now_s() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", b - a }'; }
# median [-i] VALUES...: "null" for none; -i prints an integer (bytes).
median() {
  local fmt="%.6g"
  if [[ "${1:-}" == -i ]]; then fmt="%.0f"; shift; fi
  printf '%s\n' "$@" | sort -g | awk -v f="${fmt}" 'NF { v[++n] = $1 } END {
    if (n == 0) { print "null"; exit }
    if (n % 2) printf f, v[(n + 1) / 2]; else printf f, (v[n / 2] + v[n / 2 + 1]) / 2 }'
}
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null" || b == "null" || b + 0 <= 0) print "null"; else printf "%.4f", a / b }'; }
mbps() { awk -v bytes="$1" -v s="$2" 'BEGIN { if (s + 0 <= 0) print "null"; else printf "%.1f", bytes / 1e6 / s }'; }

starttime_of() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null || true; }
# Record the worker's children (the rank processes) as "pid:starttime".
note_ranks() {
  local c
  [[ -n "${WORKER_PID}" ]] || return 0
  for c in $(ps -o pid= --ppid "${WORKER_PID}" 2>/dev/null); do
    case " ${RANK_PIDS} " in *" ${c}:"*) ;; *) RANK_PIDS+=" ${c}:$(starttime_of "${c}")" ;; esac
  done
  return 0
}
# Processes of this invocation still alive: coordinator, worker, rank
# processes seen, any process whose command line holds the temp dir or the
# coordinator address, or whose environment names the coordinator address
# (the rank processes get CHORUS_COORDINATOR=ADDR).
leftovers() {
  local e p st f found=""
  for p in ${COORD_PID} ${WORKER_PID}; do
    if kill -0 "${p}" 2>/dev/null; then found+=" ${p}"; fi
  done
  for e in ${RANK_PIDS}; do
    p=${e%%:*}; st=${e#*:}
    if [[ -r /proc/${p}/stat && "$(starttime_of "${p}")" == "${st}" ]]; then found+=" ${p}"; fi
  done
  found+=" $(pgrep -f -- "${TMP}" || true)"
  if [[ -n "${ADDR}" ]]; then
    found+=" $(pgrep -f -- "${ADDR//./\\.}([^0-9]|\$)" || true)"
    for f in /proc/[0-9]*/environ; do
      if { tr '\0' '\n' <"${f}"; } 2>/dev/null | grep -x -- "CHORUS_COORDINATOR=${ADDR}" >/dev/null; then
        p=${f#/proc/}; found+=" ${p%/environ}"
      fi
    done
  fi
  # One pid a line, without this shell and its subshells.
  tr ' ' '\n' <<<"${found}" | awk -v a="$$" -v b="${BASHPID}" 'NF && $1 != a && $1 != b' | sort -un
}
# Stop worker then coordinator with SIGTERM (bounded waits), SIGKILL what is
# left after 10 s each. Sets LEFT to the number of processes found afterwards.
stop_services() {
  local p left
  note_ranks
  for p in ${WORKER_PID} ${COORD_PID}; do
    kill -TERM "${p}" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "${p}" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "${p}" 2>/dev/null; then
      echo "checkpoint_bench: pid ${p} still running 10 s after SIGTERM; SIGKILL" >&2
      kill -KILL "${p}" 2>/dev/null || true
      failed=1
    fi
    wait "${p}" 2>/dev/null || true
  done
  sleep 0.3
  left=$(leftovers)
  LEFT=$(grep -c . <<<"${left}" || true)
  if [[ -n "${left}" ]]; then
    echo "checkpoint_bench: processes left after SIGTERM: $(ps -o pid=,args= -p "$(paste -sd, <<<"${left}")" 2>/dev/null | tr '\n' ';'); SIGKILL" >&2
    # shellcheck disable=SC2086
    kill -KILL ${left} 2>/dev/null || true
    failed=1
  fi
  COORD_PID=""
  WORKER_PID=""
}
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  if [[ -n "${COORD_PID}${WORKER_PID}" ]]; then stop_services >/dev/null 2>&1 || true; fi
  if [[ -n "${CHORUS_BENCH_KEEP:-}" ]]; then
    echo "checkpoint_bench: kept ${TMP} (CHORUS_BENCH_KEEP)" >&2
  else
    rm -rf -- "${TMP}"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"${TMP}/spec.textproto" <<SPEC
name: "ckptbench"
model { mlp { hidden_sizes: [5000, 4000] } }
data { synthetic { num_samples: 2048 input_shape: [1024] num_classes: 10 } }
training { batch_size_per_rank: 32 max_steps: ${STEPS} log_every_steps: ${LOG_EVERY} }
optimizer { kind: SGD lr: 0.01 momentum: 0.9 }
checkpoint { every_steps: ${EVERY} keep_last: 2 }
eval { disabled: true }
resources { min_ranks: 1 max_ranks: 1 threads_per_rank: 2 }
SPEC
# The same job with storage SHARED_DIR: the rank writes the files into a
# directory (here on the same filesystem as dd's file) and the coordinator
# checks and commits them.
mkdir -p "${TMP}/shared"
sed "s|checkpoint { every_steps: ${EVERY} keep_last: 2 }|checkpoint { every_steps: ${EVERY} keep_last: 2 storage: SHARED_DIR shared_dir: '${TMP}/shared' }|" \
  "${TMP}/spec.textproto" >"${TMP}/spec_shared.textproto"
grep -q SHARED_DIR "${TMP}/spec_shared.textproto" || { echo "checkpoint_bench: could not write the SHARED_DIR spec" >&2; exit 1; }

# --- services: one coordinator and one worker (1 slot) for the whole invocation
"${COORD}" --listen 127.0.0.1:0 --state_dir "${TMP}/state" --port_file "${TMP}/port" \
  >"${TMP}/coordinator.log" 2>&1 &
COORD_PID=$!
for _ in $(seq 1 300); do [[ -s "${TMP}/port" ]] && break; kill -0 "${COORD_PID}" 2>/dev/null || break; sleep 0.1; done
if ! [[ -s "${TMP}/port" ]]; then
  echo "checkpoint_bench: coordinator wrote no port file within 30 s: $(tail -n 3 "${TMP}/coordinator.log" | tr '\n' ' ')" >&2
  exit 1
fi
ADDR="127.0.0.1:$(cat "${TMP}/port")"
"${WORKER}" --coordinator "${ADDR}" --slots 1 --threads_per_rank 2 >"${TMP}/worker.log" 2>&1 &
WORKER_PID=$!

# Same filesystem for the coordinator's checkpoints, the peer's files and dd.
fs_of() { df -PT "$1" | awk 'NR == 2 { print $1 " (" $2 ") on " $7 }'; }
mkdir -p "${TMP}/state/checkpoints"
echo "checkpoint_bench: ${runs} run(s); coordinator ${ADDR}, binaries ${BIN_DIR}, peer ${TORCH_PYTHON} torch $("${TORCH_PYTHON}" -c 'import torch; print(torch.__version__)'), $(nproc) CPU(s)"
echo "checkpoint_bench: temp dir ${TMP}; state dir fs: $(fs_of "${TMP}/state/checkpoints"); peer/dd fs: $(fs_of "${TMP}")"
if [[ "$(stat -c %d "${TMP}/state/checkpoints")" != "$(stat -c %d "${TMP}")" ]]; then
  echo "checkpoint_bench: the state dir and the temp dir are on different filesystems" >&2
  failed=1
fi

# Extract from `status --json` (file $1) and `watch --json` (file $2) the
# values the bench needs, one "key=value" per line.
extract_chorus() {
  "${PY}" - "$1" "$2" "${EVERY}" "${STEPS}" <<'PY'
import json, sys
out = {}
try:
    job = json.load(open(sys.argv[1]))["job"]
    out["state"] = job.get("state", "?")
    v = job.get("latest_metrics", {}).get("values", {})
    for k in ("checkpoint_stall_seconds", "checkpoint_serialize_seconds", "checkpoint_store_seconds",
              "checkpoint_bytes", "checkpoints_stored", "checkpoints_skipped_busy", "wall_seconds"):
        out[k] = v.get(k, "null")
except Exception as e:
    out["state"] = "unparsable(%s)" % type(e).__name__
every, total = int(sys.argv[3]), int(sys.argv[4])
# Stalls of the periodic checkpoints: the metrics event logged at a checkpoint
# step (logged right after the checkpoint; the last step's checkpoint is the
# final one, taken after the event of that step), then the last event's (the
# job's final metrics, reported again after the final checkpoint).
stalls, times, final, intervals = [], [], None, []
try:
    for line in open(sys.argv[2]):
        line = line.strip()
        if not line:
            continue
        m = json.loads(line).get("metrics")
        if not m:
            continue
        step, vals = int(m.get("step", 0)), m.get("values", {})
        # The last event is the final report (after the final checkpoint);
        # the events of later reports repeat the last step: counted once.
        final = vals.get("checkpoint_stall_seconds", final)
        if intervals and step <= intervals[-1][0]:
            continue
        times.append("%s:%.3f" % (step, m.get("step_time_seconds", 0)))
        intervals.append((step, m.get("step_time_seconds", 0.0)))
        if 0 < step < total and step % every == 0 and "checkpoint_stall_seconds" in vals:
            stalls.append("%s:%.4f" % (step, vals["checkpoint_stall_seconds"]))
except Exception:
    pass
# Training time the background serialization+upload takes from the steps that
# follow a periodic checkpoint (both share the rank's CPUs): the time of the
# steps after the first checkpoint in excess of the steps just before it (the
# log interval that ends at the first checkpoint step), per periodic checkpoint.
base = [t for s, t in intervals if s == every]
n_periodic = (total - 1) // every
if base and n_periodic > 0:
    extra, prev = 0.0, 0
    for s, t in intervals:
        if every < s <= total:
            extra += (t - base[0]) * (s - prev)
        prev = s
    out["overlap_cost"] = "%.3f" % (extra / n_periodic)
    out["base_step"] = "%.3f" % base[0]
if final is not None:
    stalls.append("final:%.4f" % final)
out["periodic_stalls"] = " ".join(stalls) or "none"
out["step_times"] = " ".join(times) or "none"
for k, v in out.items():
    print("%s=%s" % (k, v))
PY
}

declare -a C_OVERLAP=() C_STALL=() C_STORE=() C_MBPS=() C_BYTES=() T_SAVE=() T_FSYNC=() T_BYTES=() D_MBPS=() D256_MBPS=()
DD_TURN=0
declare -a S_OVERLAP=() S_STALL=() S_STORE=() S_MBPS=() S_BYTES=()
skipped_total=0

run_chorus() {  # $1 = run index, $2 = spec, $3 = C (checkpoints uploaded to the coordinator) or S (SHARED_DIR)
  local i=$1 spec=$2 dir="${TMP}/chorus.$3.$1" sub_pid rc=0 job k v
  local -n a_overlap="$3_OVERLAP" a_stall="$3_STALL" a_store="$3_STORE" a_mbps="$3_MBPS" a_bytes="$3_BYTES"
  local what="chorus  "
  [[ "$3" == S ]] && what="shared  "
  mkdir -p "${dir}"
  timeout "${CMD_TIMEOUT_S}" sync || true
  timeout --kill-after=10 "${CMD_TIMEOUT_S}" "${CHORUS}" --coordinator "${ADDR}" submit --wait \
    "${spec}" >"${dir}/submit.out" 2>"${dir}/submit.err" &
  sub_pid=$!
  for _ in $(seq 1 $((CMD_TIMEOUT_S * 5 + 100))); do
    kill -0 "${sub_pid}" 2>/dev/null || break
    note_ranks
    sleep 0.2
  done
  wait "${sub_pid}" || rc=$?
  job=$(grep -m 1 -E '^job-[0-9]+$' "${dir}/submit.out" || true)
  if [[ -z "${job}" ]]; then
    echo "run ${i}/${runs} ${what}: submit printed no job id (exit ${rc}): $(tail -n 3 "${dir}/submit.err" | tr '\n' ' ')" >&2
    failed=1
    return
  fi
  timeout 60 "${CHORUS}" --coordinator "${ADDR}" status "${job}" --json >"${dir}/status.json" 2>"${dir}/status.err" || true
  timeout 60 "${CHORUS}" --coordinator "${ADDR}" watch "${job}" --json >"${dir}/watch.json" 2>/dev/null || true
  timeout 60 "${CHORUS}" --coordinator "${ADDR}" checkpoints "${job}" >"${dir}/checkpoints.txt" 2>&1 || true
  if (( i == 1 )) && [[ "$3" == C ]]; then
    echo "run 1 status --json latest_metrics (as printed by chorus):"
    "${PY}" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["job"].get("latest_metrics"), sort_keys=True))' \
      "${dir}/status.json" 2>/dev/null | sed 's/^/    /' || true
  fi
  declare -A m=()
  while IFS='=' read -r k v; do [[ -n "${k}" ]] && m["${k}"]=${v}; done < <(extract_chorus "${dir}/status.json" "${dir}/watch.json")
  local committed steps
  committed=$(awk 'NR > 1 && $1 ~ /^[0-9]+$/' "${dir}/checkpoints.txt" | grep -c . || true)
  steps=$(awk 'NR > 1 && $1 ~ /^[0-9]+$/ { printf "%s%s", sep, $1; sep = "," }' "${dir}/checkpoints.txt")
  local mb
  mb=$(mbps "${m[checkpoint_bytes]:-0}" "${m[checkpoint_store_seconds]:-0}")
  echo "run ${i}/${runs} ${what} ${job} ${m[state]:-?} (submit exit ${rc}): last (final) checkpoint: stall ${m[checkpoint_stall_seconds]:-null} s, serialize ${m[checkpoint_serialize_seconds]:-null} s, store ${m[checkpoint_store_seconds]:-null} s, ${m[checkpoint_bytes]:-null} bytes, ${mb} MB/s $([[ "$3" == S ]] && echo "write+commit in the shared directory" || echo "upload+commit")"
  echo "    checkpoints stored ${m[checkpoints_stored]:-null}, skipped_busy ${m[checkpoints_skipped_busy]:-null}; committed now (keep_last 2): ${committed} at step(s) ${steps:-none}; job wall ${m[wall_seconds]:-null} s"
  echo "    stall of every checkpoint (step:s, from the metrics events): ${m[periodic_stalls]:-none}"
  echo "    step time per ${LOG_EVERY}-step interval (step:s, background upload overlaps training): ${m[step_times]:-none}"
  echo "    training time lost to the background serialize+upload (not in the stall metric): ~${m[overlap_cost]:-null} s per periodic checkpoint (steps $((EVERY + 1))-${STEPS} vs the ${m[base_step]:-null} s/step of steps $((EVERY - LOG_EVERY + 1))-${EVERY})"
  a_overlap+=("${m[overlap_cost]:-}")
  if [[ "${m[state]:-}" != SUCCEEDED ]]; then
    echo "checkpoint_bench: run ${i} job state ${m[state]:-?}" >&2
    failed=1
  fi
  for k in checkpoint_stall_seconds checkpoint_store_seconds checkpoint_bytes; do
    if ! [[ "${m[${k}]:-null}" =~ ^[0-9.eE+-]+$ ]]; then
      echo "checkpoint_bench: run ${i}: metric ${k} missing" >&2
      failed=1
      return
    fi
  done
  if [[ "${m[checkpoints_skipped_busy]:-0}" != 0 ]]; then
    echo "    NOTE: ${m[checkpoints_skipped_busy]} checkpoint(s) skipped because the previous upload was still running"
    skipped_total=$((skipped_total + ${m[checkpoints_skipped_busy]%.*}))
  fi
  if (( committed < 2 )); then
    echo "checkpoint_bench: run ${i}: only ${committed} committed checkpoint(s) listed (expected 2 with keep_last 2)" >&2
    failed=1
  fi
  a_stall+=("${m[checkpoint_stall_seconds]}")
  a_store+=("${m[checkpoint_store_seconds]}")
  a_bytes+=("${m[checkpoint_bytes]%.*}")
  a_mbps+=("${mb}")
}

run_peer() {  # $1 = run index
  local i=$1 dir="${TMP}/peer.$1" rc=0 js k v
  mkdir -p "${dir}"
  timeout "${CMD_TIMEOUT_S}" sync || true
  timeout --kill-after=10 "${CMD_TIMEOUT_S}" "${TORCH_PYTHON}" "${PEER_SCRIPT}" --dir "${dir}" \
    --steps "${STEPS}" --every "${EVERY}" >"${dir}/out" 2>"${dir}/err" || rc=$?
  js=$(grep '^{' "${dir}/out" | tail -n 1 || true)
  if (( rc != 0 )) || [[ -z "${js}" ]]; then
    echo "run ${i}/${runs} torch: peer failed (exit ${rc}): $(tail -n 3 "${dir}/err" | tr '\n' ' ')" >&2
    failed=1
    rm -rf -- "${dir}"
    return
  fi
  declare -A m=()
  while IFS='=' read -r k v; do [[ -n "${k}" ]] && m["${k}"]=${v}; done < <("${PY}" -c '
import json, sys
d = json.loads(sys.argv[1])
for k in ("torch_save_median_s", "fsync_median_s", "save_plus_fsync_median_s", "bytes", "step_time_median_s"):
    print("%s=%s" % (k, d[k]))
print("saves=%s" % " ".join("%.4f" % v for v in d["torch_save_s"]))
print("fsyncs=%s" % " ".join("%.4f" % v for v in d["fsync_s"]))
' "${js}")
  echo "run ${i}/${runs} torch    torch.save median ${m[torch_save_median_s]} s (+ fsync median ${m[fsync_median_s]} s; save+fsync median ${m[save_plus_fsync_median_s]} s), ${m[bytes]} bytes; saves: ${m[saves]} s; fsyncs: ${m[fsyncs]} s; median step ${m[step_time_median_s]} s"
  T_SAVE+=("${m[torch_save_median_s]}")
  T_FSYNC+=("${m[fsync_median_s]}")
  T_BYTES+=("${m[bytes]}")
  rm -rf -- "${dir}"
}

run_dd() {  # $1 = run index, $2 = bytes of the checkpoint, $3 = when (printed)
  # Both block sizes, in turns first: bs=1M (what people type) and bs=256K.
  local i=$1 mib
  mib=$(awk -v b="${2:-201326592}" 'BEGIN { printf "%d", b / 1048576 + 0.5 }')
  if (( DD_TURN % 2 == 0 )); then
    dd_once "${i}" 1024 "${mib}" "$3"; dd_once "${i}" 256 "${mib}" "$3"
  else
    dd_once "${i}" 256 "${mib}" "$3"; dd_once "${i}" 1024 "${mib}" "$3"
  fi
  DD_TURN=$((DD_TURN + 1))
}

dd_once() {  # $1 = run index, $2 = block size in KiB, $3 = MiB to write, $4 = when (printed)
  local i=$1 kib=$2 count t0 t1 rc=0 s mb
  count=$(( $3 * 1024 / kib ))
  timeout "${CMD_TIMEOUT_S}" sync || true
  t0=$(now_s)
  timeout --kill-after=10 "${CMD_TIMEOUT_S}" dd if=/dev/zero of="${TMP}/dd.bin" bs="${kib}K" count="${count}" conv=fsync \
    2>"${TMP}/dd.err" || rc=$?
  t1=$(now_s)
  rm -f -- "${TMP}/dd.bin"
  if (( rc != 0 )); then
    echo "run ${i}/${runs} dd: failed (exit ${rc}): $(tr '\n' ' ' <"${TMP}/dd.err")" >&2
    failed=1
    return
  fi
  s=$(elapsed "${t0}" "${t1}")
  mb=$(mbps "$(($3 * 1048576))" "${s}")
  echo "run ${i}/${runs} dd       ${3} MiB bs=${kib}K conv=fsync, $4: ${s} s wall, ${mb} MB/s (dd says: $(tail -n 1 "${TMP}/dd.err"))"
  if (( kib == 1024 )); then D_MBPS+=("${mb}"); else D256_MBPS+=("${mb}"); fi
}

last_bytes() { (( ${#C_BYTES[@]} > 0 )) && echo "${C_BYTES[${#C_BYTES[@]} - 1]}" || true; }
for ((i = 1; i <= runs; i++)); do
  run_dd "${i}" "$(last_bytes)" "before the upload job"
  run_chorus "${i}" "${TMP}/spec.textproto" C
  run_dd "${i}" "$(last_bytes)" "between the jobs"
  run_chorus "${i}" "${TMP}/spec_shared.textproto" S
  run_dd "${i}" "$(last_bytes)" "after the SHARED_DIR job"
  run_peer "${i}"
  run_dd "${i}" "$(last_bytes)" "after the peer"
done

# --- teardown and process check
before=$(leftovers | grep -c . || true)
echo "teardown: processes of this invocation alive before it: ${before} (coordinator + worker expected; rank processes seen during the jobs: $(wc -w <<<"${RANK_PIDS}"))"
stop_services
echo "teardown: coordinator and worker stopped with SIGTERM; leftover processes: ${LEFT}"

# --- medians
med_c_stall=$(median "${C_STALL[@]}")
med_c_store=$(median "${C_STORE[@]}")
med_c_mbps=$(median "${C_MBPS[@]}")
med_c_bytes=$(median -i "${C_BYTES[@]}")
med_t_save=$(median "${T_SAVE[@]}")
med_t_fsync=$(median "${T_FSYNC[@]}")
med_t_bytes=$(median -i "${T_BYTES[@]}")
med_d1m_mbps=$(median "${D_MBPS[@]}")
med_d256_mbps=$(median "${D256_MBPS[@]}")
# The peer is the faster of the two dd medians.
med_d_mbps=$(awk -v a="${med_d1m_mbps}" -v b="${med_d256_mbps}" 'BEGIN { if (a == "null") print b; else if (b == "null" || a + 0 >= b + 0) print a; else print b }')
med_s_stall=$(median "${S_STALL[@]}")
med_s_store=$(median "${S_STORE[@]}")
med_s_mbps=$(median "${S_MBPS[@]}")
(( ${#C_STALL[@]} == runs && ${#S_STALL[@]} == runs && ${#T_SAVE[@]} == runs && ${#D_MBPS[@]} == 4 * runs && ${#D256_MBPS[@]} == 4 * runs )) || failed=1
stall_ratio=$(div "${med_c_stall}" "${med_t_save}")
tput_ratio=$(div "${med_c_mbps}" "${med_d_mbps}")
shared_ratio=$(div "${med_s_mbps}" "${med_d_mbps}")

echo
echo "medians over ${runs} run(s):"
echo "  chorus stall (last checkpoint)   ${med_c_stall} s    over: ${C_STALL[*]:-none}"
echo "  torch.save                       ${med_t_save} s    over: ${T_SAVE[*]:-none} (fsync after it, not counted: ${med_t_fsync} s)"
echo "  chorus store (last checkpoint)   ${med_c_store} s    over: ${C_STORE[*]:-none}"
echo "  chorus upload+commit             ${med_c_mbps} MB/s over: ${C_MBPS[*]:-none} (checkpoint ${med_c_bytes} bytes)"
echo "  SHARED_DIR stall (last)          ${med_s_stall} s    over: ${S_STALL[*]:-none}"
echo "  SHARED_DIR store (last)          ${med_s_store} s    over: ${S_STORE[*]:-none}"
echo "  SHARED_DIR write+commit          ${med_s_mbps} MB/s over: ${S_MBPS[*]:-none}"
echo "  dd bs=1M conv=fsync              ${med_d1m_mbps} MB/s over: ${D_MBPS[*]:-none}"
echo "  dd bs=256K conv=fsync            ${med_d256_mbps} MB/s over: ${D256_MBPS[*]:-none}"
echo "  dd (peer: the faster median)     ${med_d_mbps} MB/s"
echo "  torch.save file                  ${med_t_bytes} bytes"
echo "  chorus background cost (info)   ~$(median "${C_OVERLAP[@]}") s of training time per periodic checkpoint, over: ${C_OVERLAP[*]:-none} (serialize+upload share the rank's CPUs; not part of the stall metric)"
echo "  checkpoints skipped (upload still running), all runs: ${skipped_total}"
verdict() { awk -v r="$1" -v t="$2" -v op="$3" 'BEGIN { if (r == "null") print "n/a"; else if ((op == "le" && r + 0 <= t) || (op == "ge" && r + 0 >= t)) print "MET"; else print "NOT MET" }'; }
echo "target stall ratio <= 0.2: ratio ${stall_ratio} -> $(verdict "${stall_ratio}" 0.2 le)"
echo "target throughput ratio >= 0.8 of dd: upload to the coordinator ${tput_ratio} -> $(verdict "${tput_ratio}" 0.8 ge); storage SHARED_DIR ${shared_ratio} -> $(verdict "${shared_ratio}" 0.8 ge)"

printf '{"bench": "checkpoint_bench", "metric": "upload_commit_MBps_vs_dd", "unit": "MB/s", "ours": %s, "peer": %s, "peer_name": "dd conv=fsync (bs=1M or bs=256K, the faster median)", "ratio": %s}\n' \
  "${med_c_mbps}" "${med_d_mbps}" "${tput_ratio}"
printf '{"bench": "checkpoint_bench", "metric": "shared_dir_write_commit_MBps_vs_dd", "unit": "MB/s", "ours": %s, "peer": %s, "peer_name": "dd conv=fsync (bs=1M or bs=256K, the faster median)", "ratio": %s}\n' \
  "${med_s_mbps}" "${med_d_mbps}" "${shared_ratio}"
printf '{"bench": "checkpoint_bench", "metric": "training_stall_seconds_per_checkpoint", "unit": "s", "ours": %s, "peer": %s, "peer_name": "torch.save (python3-torch)", "ratio": %s}\n' \
  "${med_c_stall}" "${med_t_save}" "${stall_ratio}"
exit "${failed}"
