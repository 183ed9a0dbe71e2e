#!/usr/bin/env bash
# A coordinator killed with SIGKILL mid-job and restarted on the same address
# and state directory takes the job back: the agent keeps its ranks running,
# reconnects with them, the ranks' heartbeats and final reports resume, and
# the job succeeds with every step done. If the ranks are gone too, the job
# fails after the recovery grace period, saying why.
#
# Usage (from Bazel): restart_e2e_test.sh COORDINATOR CHORUS WORKER
set -uo pipefail

COORDINATOR=$1
CHORUS=$2
WORKER=$3
TMP=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
pids=()
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
cleanup() { for p in "${pids[@]}"; do kill -KILL "${p}" 2>/dev/null; done; }
trap cleanup EXIT
wait_for_file() { for _ in $(seq 1 200); do [[ -s "$1" ]] && return 0; sleep 0.1; done; return 1; }

start_coordinator() {  # $1 = listen address
  rm -f "${TMP}/port"
  "${COORDINATOR}" --listen "$1" --state_dir "${TMP}/state" --port_file "${TMP}/port" \
    --recovery_grace_seconds 4 2>>"${TMP}/coordinator.log" &
  coordinator_pid=$!
  pids+=("${coordinator_pid}")
  wait_for_file "${TMP}/port" || { cat "${TMP}/coordinator.log" >&2; echo "FAIL: coordinator did not start" >&2; exit 1; }
}
state_of() { "${CHORUS}" --coordinator "${addr}" status "$1" 2>/dev/null | head -1 | sed -n 's/^[^:]*: \([A-Z]*\).*/\1/p'; }
wait_state() {  # $1 job, $2 state, $3 tenths of a second
  for _ in $(seq 1 "$3"); do [[ "$(state_of "$1")" == "$2" ]] && return 0; sleep 0.1; done
  return 1
}
steps_of() { "${CHORUS}" --coordinator "${addr}" status "$1" --json 2>/dev/null | sed -n 's/.*"step": "\([0-9]*\)".*/\1/p' | head -1; }

start_coordinator 127.0.0.1:0
port=$(cat "${TMP}/port")
addr="127.0.0.1:${port}"
"${WORKER}" --coordinator "${addr}" --slots 2 2>"${TMP}/worker.log" &
worker_pid=$!
pids+=("${worker_pid}")

cat > "${TMP}/job.textproto" <<'SPEC'
name: "survivor"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 2048 input_shape: [16] num_classes: 4 seed: 5 } }
training { batch_size_per_rank: 16 max_steps: 300 log_every_steps: 10 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
fault_injection { faults { kind: SLOW rank: 0 at_step: 1 duration_seconds: 0.02 } }
SPEC

# --- job-000001: the coordinator is killed at step ~50 and comes back
job=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/job.textproto" 2>/dev/null)
for _ in $(seq 1 200); do [[ "$(steps_of "${job}")" -gt 50 ]] 2>/dev/null && break; sleep 0.1; done
before=$(steps_of "${job}")
kill -KILL "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
sleep 1
start_coordinator "127.0.0.1:${port}"
[[ "$(state_of "${job}")" == "RUNNING" ]] && pass "after the restart the job is still RUNNING (was at step ${before})" \
  || fail "state after restart: $(state_of "${job}")"
if wait_state "${job}" SUCCEEDED 400; then
  pass "the job survived the coordinator's SIGKILL and succeeded"
else
  fail "job ended as '$(state_of "${job}")': $("${CHORUS}" --coordinator "${addr}" status "${job}" 2>&1 | head -3)"
fi
final=$("${CHORUS}" --coordinator "${addr}" jobs --json 2>/dev/null | tr -d '\n ' | grep -o '"step":"[0-9]*"' | head -1)
[[ "${final}" == '"step":"300"' ]] && pass "every step was trained and reported (${final})" || fail "final metrics: ${final}"
events=$(timeout 10 "${CHORUS}" --coordinator "${addr}" watch "${job}" 2>/dev/null)
[[ "${events}" == *"the coordinator restarted; waiting up to 4s"* && "${events}" == *"every rank is back"* ]] \
  && pass "events say the job was taken back" || fail "events: ${events}"

# --- job-000002: coordinator and ranks gone; the job fails after the grace period
job2=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/job.textproto" 2>/dev/null)
for _ in $(seq 1 200); do [[ "$(steps_of "${job2}")" -gt 20 ]] 2>/dev/null && break; sleep 0.1; done
kill -KILL "${coordinator_pid}" "${worker_pid}"
pkill -KILL -P "${worker_pid}" 2>/dev/null
pkill -KILL -f "chorus-rank" -P "${worker_pid}" 2>/dev/null
wait "${coordinator_pid}" "${worker_pid}" 2>/dev/null
sleep 0.5
start_coordinator "127.0.0.1:${port}"
t0=$(date +%s)
if wait_state "${job2}" FAILED 150; then
  reason=$("${CHORUS}" --coordinator "${addr}" status "${job2}" 2>&1 | head -1)
  [[ "${reason}" == *"2 of 2 rank(s) did not come back after the coordinator restarted"* ]] \
    && pass "ranks that never came back fail the job after $(( $(date +%s) - t0 )) s: ${reason}" \
    || fail "reason: ${reason}"
else
  fail "job2 is '$(state_of "${job2}")'"
fi

kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
echo "${failures} failure(s)"
[[ ${failures} -eq 0 ]]
