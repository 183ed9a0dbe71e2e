#!/usr/bin/env bash
# A coordinator that dies while a checkpoint is being uploaded, and comes back
# on the same address and state directory, does not fail the job.
#
# The coordinator is killed inside an upload deterministically: it is
# restarted with CHORUS_TEST_FAILPOINT=checkpoint:STAGE armed, which ends it
# (as abruptly as kill -9) at that stage of the next upload it serves.
#   1. periodic checkpoints every 20 steps; SIGKILL and restart with
#      mid_chunk armed: the next upload dies half sent; the coordinator stays
#      away longer than checkpoint.unreachable_retry_seconds, so rank 0 skips
#      that checkpoint (metric and warning event), keeps training, and the
#      later checkpoints are stored. Every checkpoint listed before is still
#      listed and downloadable; nothing half-uploaded is left or listed.
#   2. the final checkpoint dies half sent; it waits for the coordinator to
#      come back (longer than the periodic bound) and is stored.
#   3. the coordinator dies right after committing a checkpoint, before
#      answering: the rank's retry finds it committed, nothing is skipped.
# Each job ends SUCCEEDED with every step trained.
#
# Usage (from Bazel): checkpoint_restart_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$1
CHORUS=$2
WORKER=$3
STATE="${TMP}/state"
# Each coordinator starts on this port (Note [Ports that stay free] in lib.sh).
port=$(free_ports 1)

# coordinator [FAILPOINT]: starts one on ${port} over ${STATE}, with
# CHORUS_TEST_FAILPOINT=FAILPOINT if given.
coordinator() {
  CHORUS_TEST_FAILPOINT="${1:-}" start_coordinator -l "127.0.0.1:${port}" -s "${STATE}" \
    -- --recovery_grace_seconds 30 || { fail "coordinator did not start"; finish; }
  coordinator_pid=${COORDINATOR_PID}
  port=${COORDINATOR_PORT}
  addr="127.0.0.1:${port}"
}
cli() { timeout 20 "${CHORUS}" --coordinator "${addr}" "$@"; }
status_json() { cli status "$1" --json 2>/dev/null; }
state_of() { status_json "$1" | json_get - job.state 2>/dev/null; }
metric() { status_json "$1" | json_get - "job.latest_metrics.values.$2" 2>/dev/null; }
steps_listed() { cli checkpoints "$1" --json 2>/dev/null | json_get - 'checkpoints[*].step' 2>/dev/null | sort -n | tr '\n' ' '; }
# waits (up to 30 s) for the armed coordinator to end itself at its failpoint
died_at_failpoint() {
  wait_exit "${coordinator_pid}" 30 || return 1
  wait "${coordinator_pid}"
  [[ $? == 75 ]]
}
# finished JOB STEPS: the job SUCCEEDED (within 90 s) after STEPS steps.
finished() {
  finished_job=$1  # seen by wait_for's condition
  if wait_for 'state=$(state_of "${finished_job}"); [[ "${state}" == SUCCEEDED || "${state}" == FAILED ]]' 90 \
    && [[ "${state}" == SUCCEEDED ]]; then
    local steps
    steps=$(status_json "$1" | json_get - job.latest_metrics.step)
    [[ "${steps}" == "$2" ]] && pass "$1 SUCCEEDED after all ${steps} steps" \
      || fail "$1 SUCCEEDED after ${steps} steps, not $2"
  else
    fail "$1 ended '$(state_of "$1")': $(cli status "$1" 2>&1 | head -3)"
  fi
}
no_staging_left() {
  local left
  left=$(find "${STATE}/checkpoints/$1" -name '.staging-*' 2>/dev/null)
  [[ -z "${left}" ]] && pass "$1: no half-uploaded checkpoint left in the store" \
    || fail "$1: staging left behind: ${left}"
}

coordinator
"${WORKER}" --coordinator "${addr}" --slots 2 2>"${TMP}/worker.log" &
track_pid $!

spec() {  # $1 name, $2 max_steps, $3 checkpoint { ... } fields
  cat <<SPEC
name: "$1"
model { mlp { hidden_sizes: [256, 256] } }
data { synthetic { num_samples: 4096 input_shape: [64] num_classes: 4 seed: 5 } }
training { batch_size_per_rank: 16 max_steps: $2 log_every_steps: 10 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
checkpoint { keep_last: 0 $3 }
fault_injection { faults { kind: SLOW rank: 0 at_step: 1 duration_seconds: 0.03 } }
SPEC
}

# --- 1. a periodic upload cut half way; the coordinator away for longer than the bound
spec periodic 400 'every_steps: 20 unreachable_retry_seconds: 2' >"${TMP}/periodic.textproto"
job=$(cli submit "${TMP}/periodic.textproto" 2>/dev/null)
wait_for '[[ "$(steps_listed "${job}" | wc -w)" -ge 2 ]]' 40 || fail "${job}: no checkpoints before the kill"
before=$(steps_listed "${job}")
kill -KILL "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
coordinator checkpoint:mid_chunk
died_at_failpoint && pass "the coordinator died in the middle of an upload of ${job}" \
  || fail "the armed coordinator did not die in an upload"
sleep 4
coordinator
finished "${job}" 400
after=$(steps_listed "${job}")
lost=""
for s in ${before}; do [[ " ${after} " == *" ${s} "* ]] || lost+=" ${s}"; done
[[ -n "${before}" && -z "${lost}" && " ${after} " == *" 400 "* ]] \
  && pass "checkpoints listed before the kill (${before}) are still listed, and the final one: ${after}" \
  || fail "listed before: '${before}', after: '${after}' (lost:${lost})"
first=${before%% *}
cli export "${job}" --step "${first}" -o "${TMP}/first.pt" 2>"${TMP}/export.err" && [[ -s "${TMP}/first.pt" ]] \
  && pass "checkpoint step ${first} (committed before the kill) downloads" \
  || fail "export of step ${first}: $(cat "${TMP}/export.err")"
no_staging_left "${job}"
skipped=$(metric "${job}" checkpoints_skipped_unreachable)
[[ "${skipped}" =~ ^[0-9.]+$ ]] && awk -v n="${skipped}" 'BEGIN { exit !(n >= 1) }' \
  && pass "rank 0 skipped ${skipped} checkpoint(s) while the coordinator was away for 4 s (bound 2 s)" \
  || fail "checkpoints_skipped_unreachable: '${skipped}'"
events=$(timeout 10 "${CHORUS}" --coordinator "${addr}" watch "${job}" 2>/dev/null)
[[ "${events}" == *"warning: rank 0 skipped "*"checkpoint"*"could not reach the coordinator"* ]] \
  && pass "a warning event says so" || fail "events: ${events}"

# --- 2. the final checkpoint cut half way: it waits for the coordinator
spec final 100 'every_steps: 0 unreachable_retry_seconds: 1' >"${TMP}/final.textproto"
kill -KILL "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
coordinator checkpoint:mid_chunk
job=$(cli submit "${TMP}/final.textproto" 2>/dev/null)
died_at_failpoint && pass "the coordinator died in the middle of ${job}'s final checkpoint" \
  || fail "the armed coordinator did not die in the final upload"
sleep 3
coordinator
finished "${job}" 100
[[ "$(steps_listed "${job}")" == "100 " ]] && pass "the final checkpoint was stored after the restart" \
  || fail "${job} checkpoints: '$(steps_listed "${job}")'"
no_staging_left "${job}"

# --- 3. the coordinator dies after committing, before answering
spec committed 60 'every_steps: 20' >"${TMP}/committed.textproto"
kill -KILL "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
coordinator checkpoint:after_manifest
job=$(cli submit "${TMP}/committed.textproto" 2>/dev/null)
died_at_failpoint && pass "the coordinator died right after committing ${job}'s first checkpoint" \
  || fail "the armed coordinator did not die after a commit"
sleep 1
coordinator
finished "${job}" 60
after=$(steps_listed "${job}")
[[ " ${after}" == *" 20 "* && " ${after}" == *" 60 "* ]] && pass "step 20 (committed, never answered) and the final step 60 are listed: ${after}" \
  || fail "${job} checkpoints: '${after}'"
skipped=$(metric "${job}" checkpoints_skipped_unreachable)
[[ "${skipped}" == 0 ]] && pass "nothing was skipped: the retry found step 20 committed" \
  || fail "checkpoints_skipped_unreachable: '${skipped}'"

kill -KILL "${coordinator_pid}"; wait "${coordinator_pid}" 2>/dev/null
finish
