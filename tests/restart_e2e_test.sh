#!/usr/bin/env bash
# A coordinator killed with SIGKILL mid-job and restarted on the same address
# and state directory takes the job back: the agent keeps its ranks running,
# reconnects with them, the ranks' heartbeats and final reports resume, and
# the job succeeds with every step done. If the ranks are gone too, the job
# fails after the recovery grace period, saying why.
#
# Usage (from Bazel): restart_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$1
CHORUS=$2
WORKER=$3

coordinator() {  # $1 = listen address
  start_coordinator -l "$1" -s "${TMP}/state" -- --recovery_grace_seconds 8 \
    || { fail "coordinator did not start"; finish; }
  coordinator_pid=${COORDINATOR_PID}
}
status_json() { "${CHORUS}" --coordinator "${addr}" status "$1" --json 2>/dev/null; }
state_of() { status_json "$1" | json_get - job.state 2>/dev/null; }
wait_state() {  # $1 job, $2 state, $3 seconds
  local job=$1 state=$2
  wait_for '[[ "$(state_of "${job}")" == "${state}" ]]' "$3"
}
# The job's latest reported step (its first rank's while it has reported none).
steps_of() {
  local status
  status=$(status_json "$1")
  json_get - job.latest_metrics.step <<<"${status}" 2>/dev/null || json_get - 'ranks[0].step' <<<"${status}" 2>/dev/null
}

# Started again on this port below (Note [Ports that stay free] in lib.sh).
coordinator "127.0.0.1:$(free_ports 1)"
port=${COORDINATOR_PORT}
addr="127.0.0.1:${port}"
"${WORKER}" --coordinator "${addr}" --slots 2 2>"${TMP}/worker.log" &
worker_pid=$!
track_pid "${worker_pid}"

cat > "${TMP}/job.textproto" <<'SPEC'
name: "survivor"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 2048 input_shape: [16] num_classes: 4 seed: 5 } }
training { batch_size_per_rank: 16 max_steps: 600 log_every_steps: 10 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
fault_injection { faults { kind: SLOW rank: 0 at_step: 1 duration_seconds: 0.02 } }
SPEC

# --- job-000001: the coordinator is killed at step ~50 and comes back. The
# job trains ~15 s in all, so its ranks still run when their agent is back
# (within a few seconds under load) and the coordinator can say so.
job=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/job.textproto" 2>/dev/null)
wait_for '[[ "$(steps_of "${job}")" -gt 50 ]] 2>/dev/null' 40
before=$(steps_of "${job}")
kill -KILL "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
sleep 1
coordinator "127.0.0.1:${port}"
[[ "$(state_of "${job}")" == "RUNNING" ]] && pass "after the restart the job is still RUNNING (was at step ${before})" \
  || fail "state after restart: $(state_of "${job}")"
if wait_state "${job}" SUCCEEDED 80; then
  pass "the job survived the coordinator's SIGKILL and succeeded"
else
  fail "job ended as '$(state_of "${job}")': $("${CHORUS}" --coordinator "${addr}" status "${job}" 2>&1 | head -3)"
fi
final=$("${CHORUS}" --coordinator "${addr}" jobs --json 2>/dev/null | json_get - 'jobs[0].latest_metrics.step')
[[ "${final}" == 600 ]] && pass "every step was trained and reported (step ${final})" || fail "final metrics: step '${final}'"
events=$(timeout 10 "${CHORUS}" --coordinator "${addr}" watch "${job}" 2>/dev/null)
[[ "${events}" == *"the coordinator restarted; waiting up to 8s"* && "${events}" == *"every rank is back"* ]] \
  && pass "events say the job was taken back" || fail "events: ${events}"

# --- job-000002: coordinator and ranks gone; the job fails after the grace period
job2=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/job.textproto" 2>/dev/null)
wait_for '[[ "$(steps_of "${job2}")" -gt 20 ]] 2>/dev/null' 40
kill -KILL "${coordinator_pid}" "${worker_pid}"
pkill -KILL -P "${worker_pid}" 2>/dev/null
pkill -KILL -f "chorus-rank" -P "${worker_pid}" 2>/dev/null
wait "${coordinator_pid}" "${worker_pid}" 2>/dev/null
sleep 0.5
coordinator "127.0.0.1:${port}"
t0=$(date +%s)
if wait_state "${job2}" FAILED 30; then
  reason=$("${CHORUS}" --coordinator "${addr}" status "${job2}" 2>&1 | head -1)
  [[ "${reason}" == *"2 of 2 rank(s) did not come back after the coordinator restarted"* ]] \
    && pass "ranks that never came back fail the job after $(( $(date +%s) - t0 )) s: ${reason}" \
    || fail "reason: ${reason}"
else
  fail "job2 is '$(state_of "${job2}")'"
fi

kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
finish
