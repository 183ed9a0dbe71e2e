#!/usr/bin/env bash
# Fault injection end to end: a rank that hangs is named (NEVER_JOINED) in
# `chorus status` within seconds, ABORT fails the job with that diagnosis
# long before the hang would end, and a crashed rank fails the job naming
# the signal.
#
# Usage (from Bazel): hang_e2e_test.sh CHORUS
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
# The reason of the job `chorus up --json` printed as its last line ($1).
reason_of() { json_get - reason <<<"$1"; }

spec() {  # $1 = fault, $2 = hang_detection
  cat <<SPEC
name: "faulty"
model { mlp { hidden_sizes: [16] } }
data { synthetic { num_samples: 4096 input_shape: [8] num_classes: 2 } }
training { batch_size_per_rank: 16 epochs: 1000 log_every_steps: 5 }
resources { min_ranks: 2 max_ranks: 2 }
fault_injection { faults { $1 } }
hang_detection { $2 }
SPEC
}

# `chorus up` writes the coordinator's port before it submits the job; a
# watch started in between would find no job and end at once.
wait_for_job() {
  local addr=$1
  wait_for '"${CHORUS}" --coordinator "${addr}" status job-000001 >/dev/null 2>&1' 60
}

# --- REPORT: the hanging rank is named while the job hangs
spec "kind: HANG rank: 1 at_step: 10 duration_seconds: 25" "action: REPORT stall_after_seconds: 2" > "${TMP}/report.textproto"
"${CHORUS}" up --local 2 --state_dir "${TMP}/report" "${TMP}/report.textproto" 2>"${TMP}/report.err" &
up_pid=$!
wait_for_file "${TMP}/report/port" 30
addr="127.0.0.1:$(cat "${TMP}/report/port" 2>/dev/null)"
wait_for_job "${addr}"
# A watcher from the start sees the job's events, the diagnosis among them.
"${CHORUS}" --coordinator "${addr}" watch job-000001 >"${TMP}/watch.out" 2>"${TMP}/watch.err" &
watch_pid=$!
found=""
wait_for 'status=$("${CHORUS}" --coordinator "${addr}" status job-000001 2>/dev/null)
          found=$(grep "NEVER_JOINED" <<<"${status}"); [[ -n "${found}" ]]' 40
if [[ "${found}" == *"NEVER_JOINED rank 1 has not entered collective #"*"ranks 0 have waited"* || \
      "${found}" == *"NEVER_JOINED rank 1 has not entered collective #"*"rank 0 has waited"* ]] \
   && [[ "${found}" == *"rank 1 is in DATA at step 10"* ]]; then
  pass "status names the hanging rank: ${found}"
else
  fail "no NEVER_JOINED for rank 1 in: ${status}"
fi
# Diagnoses become job events on the coordinator's next tick (100 ms).
wait_for 'grep -q "NEVER_JOINED" "${TMP}/watch.out"' 5
out=$("${CHORUS}" --coordinator "${addr}" logs job-000001 --rank 1 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"[rank 1] "*"job-000001: rank 1 of 2"* && "${out}" != *"[rank 0]"* ]] \
  && pass "logs --rank 1 shows rank 1's output only" || fail "logs rc=${rc} out='${out}'"
kill -INT "${up_pid}"; wait "${up_pid}"
if ! wait_exit "${watch_pid}" 10; then
  fail "watch still running 10 s after the job ended"; kill -KILL "${watch_pid}"
else
  wait "${watch_pid}"; rc=$?
  w=$(cat "${TMP}/watch.out")
  [[ ${rc} -eq 1 && "${w}" == *"#1  state PENDING: submitted"* && "${w}" == *"state RUNNING"* \
     && "${w}" == *"metrics step 5 "* && "${w}" == *"problem NEVER_JOINED rank 1 has not entered collective"* \
     && "${w}" == *"state CANCELLED"* ]] \
    && pass "watch streamed states, metrics and the diagnosis, and ended with the job" \
    || fail "watch rc=${rc} out='${w}' err=$(cat "${TMP}/watch.err")"
fi

# --- ABORT: the job fails with the diagnosis, long before the 25 s hang ends
spec "kind: HANG rank: 1 at_step: 10 duration_seconds: 25" "action: ABORT stall_after_seconds: 2" > "${TMP}/abort.textproto"
t0=$(date +%s)
out=$(timeout 60 "${CHORUS}" up --local 2 --state_dir "${TMP}/abort" "${TMP}/abort.textproto" --json 2>"${TMP}/abort.err"); rc=$?
t1=$(date +%s)
last=$(tail -n 1 <<<"${out}")
[[ ${rc} -eq 1 && "$(json_get - state <<<"${last}")" == FAILED \
   && "$(reason_of "${last}")" == *"hang detection: NEVER_JOINED rank 1 has not entered collective"* ]] \
  && pass "ABORT fails the job with the diagnosis" || fail "abort rc=${rc} out='${out}'"
(( t1 - t0 < 20 )) && pass "aborted after $((t1 - t0)) s, before the hang ended" || fail "abort took $((t1 - t0)) s"

# --- MISMATCH: rank 1 issues two collectives in the other order; the ranks
# wait instead of mixing data, and the diagnosis names both fingerprints.
spec "kind: MISMATCH_COLLECTIVE rank: 1 at_step: 10" "action: ABORT stall_after_seconds: 2" > "${TMP}/mismatch.textproto"
t0=$(date +%s)
out=$(timeout 60 "${CHORUS}" up --local 2 --state_dir "${TMP}/mismatch" "${TMP}/mismatch.textproto" --json 2>"${TMP}/mismatch.err"); rc=$?
t1=$(date +%s)
last=$(tail -n 1 <<<"${out}")
reason=$(reason_of "${last}")
[[ ${rc} -eq 1 && "${reason}" == *"hang detection: MISMATCH ranks 0 and 1 issued different collectives at #"* \
   && "${reason}" == *"rank 0 allreduce/sum fault/first (float32[4], 16 bytes), rank 1 allreduce/sum fault/second (float32[8], 32 bytes)"* ]] \
  && pass "MISMATCH names the ranks, the seq and both fingerprints" || fail "mismatch rc=${rc} out='${out}'"
(( t1 - t0 < 15 )) && pass "MISMATCH aborted the job after $((t1 - t0)) s" || fail "mismatch took $((t1 - t0)) s"

# --- SKIP_COLLECTIVE: rank 1 never joins a collective the others wait in
spec "kind: SKIP_COLLECTIVE rank: 1 at_step: 10 duration_seconds: 25" "action: ABORT stall_after_seconds: 2" > "${TMP}/skip.textproto"
t0=$(date +%s)
out=$(timeout 60 "${CHORUS}" up --local 2 --state_dir "${TMP}/skip" "${TMP}/skip.textproto" --json 2>"${TMP}/skip.err"); rc=$?
t1=$(date +%s)
last=$(tail -n 1 <<<"${out}")
[[ ${rc} -eq 1 && "$(reason_of "${last}")" == *"NEVER_JOINED rank 1 has not entered collective #"*"allreduce/sum fault/skipped (float32[1], 4 bytes); rank 0 has waited"* ]] \
  && pass "a skipped collective is NEVER_JOINED naming it" || fail "skip rc=${rc} out='${out}'"
(( t1 - t0 < 15 )) && pass "skip aborted after $((t1 - t0)) s" || fail "skip took $((t1 - t0)) s"

# --- STOP: a rank stopped with SIGSTOP is DEAD (not NEVER_JOINED), and the
# message says its process still exists
spec "kind: STOP rank: 1 at_step: 10" "action: ABORT stall_after_seconds: 2 dead_after_seconds: 5" > "${TMP}/stop.textproto"
t0=$(date +%s)
out=$(timeout 60 "${CHORUS}" up --local 2 --state_dir "${TMP}/stop" "${TMP}/stop.textproto" --json 2>"${TMP}/stop.err"); rc=$?
t1=$(date +%s)
last=$(tail -n 1 <<<"${out}")
[[ ${rc} -eq 1 && "$(reason_of "${last}")" == *"hang detection: DEAD rank 1 has sent no heartbeat for"*"its process has not exited"* ]] \
  && pass "SIGSTOP is DEAD with the process named as not responding" || fail "stop rc=${rc} out='${out}'"
(( t1 - t0 < 25 )) && pass "stopped rank detected and the job torn down in $((t1 - t0)) s" || fail "stop took $((t1 - t0)) s"

# --- a healthy run with evaluation pauses and a slow first step: no problems
cat > "${TMP}/healthy.textproto" <<'SPEC'
name: "healthy"
model { mlp { hidden_sizes: [64] } }
data { synthetic { num_samples: 4096 input_shape: [32] num_classes: 4 } }
training { batch_size_per_rank: 32 epochs: 6 log_every_steps: 16 }
eval { every_steps: 64 }
resources { min_ranks: 2 max_ranks: 2 }
hang_detection { action: ABORT }
SPEC
"${CHORUS}" up --local 2 --state_dir "${TMP}/healthy" "${TMP}/healthy.textproto" --json >"${TMP}/healthy.out" 2>"${TMP}/healthy.err" &
up_pid=$!
wait_for_file "${TMP}/healthy/port" 30
haddr="127.0.0.1:$(cat "${TMP}/healthy/port" 2>/dev/null)"
wait_for_job "${haddr}"
timeout 120 "${CHORUS}" --coordinator "${haddr}" watch job-000001 >"${TMP}/healthy.watch" 2>/dev/null
wait "${up_pid}"; rc=$?
[[ ${rc} -eq 0 ]] && pass "healthy job succeeded" || fail "healthy rc=${rc} $(tail -2 "${TMP}/healthy.err")"
problems=$(grep -c " problem " "${TMP}/healthy.watch")
[[ "${problems}" -eq 0 && $(grep -c "state SUCCEEDED" "${TMP}/healthy.watch") -eq 1 ]] \
  && pass "healthy run: zero diagnoses in $(grep -c metrics "${TMP}/healthy.watch") metrics events" \
  || fail "healthy run had ${problems} problem(s): $(grep " problem " "${TMP}/healthy.watch")"

# --- a hang that ends clears its diagnosis; a rank that then computes 50 ms
# longer every step is a STRAGGLER (both as watch events)
spec "kind: HANG rank: 1 at_step: 10 duration_seconds: 4 } faults { kind: SLOW rank: 1 at_step: 40 duration_seconds: 0.05" \
  "action: REPORT stall_after_seconds: 2" > "${TMP}/slow.textproto"
"${CHORUS}" up --local 2 --state_dir "${TMP}/slow" "${TMP}/slow.textproto" >/dev/null 2>"${TMP}/slow.err" &
up_pid=$!
wait_for_file "${TMP}/slow/port" 30
saddr="127.0.0.1:$(cat "${TMP}/slow/port" 2>/dev/null)"
wait_for_job "${saddr}"
"${CHORUS}" --coordinator "${saddr}" watch job-000001 >"${TMP}/slow.watch" 2>/dev/null &
watch_pid=$!
wait_for 'grep -q "problem STRAGGLER" "${TMP}/slow.watch"' 30
kill -INT "${up_pid}"; wait "${up_pid}"; wait "${watch_pid}"
w=$(cat "${TMP}/slow.watch")
[[ "${w}" == *"problem NEVER_JOINED rank 1 has not entered collective"* && "${w}" == *"cleared: NEVER_JOINED rank 1 at #"* ]] \
  && pass "a hang that ends is reported, then cleared" || fail "no NEVER_JOINED + cleared in: ${w}"
[[ "${w}" == *"problem STRAGGLER rank 1 computes for"*"the others wait for it"* ]] \
  && pass "the slow rank is named STRAGGLER" || fail "no STRAGGLER in: ${w}"

# --- CRASH: the rank's signal is the job's reason
spec "kind: CRASH rank: 1 at_step: 5" "action: REPORT" > "${TMP}/crash.textproto"
out=$(timeout 60 "${CHORUS}" up --local 2 --state_dir "${TMP}/crash" "${TMP}/crash.textproto" --json 2>"${TMP}/crash.err"); rc=$?
last=$(tail -n 1 <<<"${out}")
[[ ${rc} -eq 1 && "$(reason_of "${last}")" == *"rank 1 ("*"was killed by signal 9"* ]] && pass "crash names rank and signal" \
  || fail "crash rc=${rc} out='${out}'"

assert_no_leftovers "every run"
finish
