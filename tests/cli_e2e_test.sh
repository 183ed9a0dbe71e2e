#!/usr/bin/env bash
# End to end: a real chorus-coordinator process on an ephemeral loopback port,
# driven by the chorus CLI and chorus-worker as a user would.
#
# Usage (from Bazel): cli_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$1
CHORUS=$2
WORKER=$3

# --- start the coordinator on port 0
if ! start_coordinator -s "${TMP}/state" -p "${TMP}/port"; then
  fail "coordinator did not write its port within 20 s"
  finish
fi
coordinator_pid=${COORDINATOR_PID}
port=${COORDINATOR_PORT}
addr=${COORDINATOR_ADDR}
[[ "${port}" =~ ^[0-9]+$ && "${port}" -gt 0 ]] && pass "coordinator bound port ${port}" \
  || fail "port file holds '${port}'"

# --- ping prints SERVING and exits 0
out=$("${CHORUS}" ping --coordinator "${addr}" 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == "${addr}: SERVING" ]] && pass "ping: ${out}" \
  || fail "ping rc=${rc} out='${out}'"

# --- the address also comes from CHORUS_COORDINATOR
out=$(CHORUS_COORDINATOR="${addr}" "${CHORUS}" ping 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *SERVING ]] && pass "ping via CHORUS_COORDINATOR" \
  || fail "env ping rc=${rc} out='${out}'"

# --- a second coordinator on the same state dir is refused, naming the owner
out=$("${COORDINATOR}" --listen 127.0.0.1:0 --state_dir "${TMP}/state" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"in use by another coordinator (pid ${coordinator_pid})"* ]] \
  && pass "state dir lock" || fail "second coordinator rc=${rc} out='${out}'"

# --- a non-loopback address without tokens is refused, saying what to pass
out=$("${COORDINATOR}" --listen 0.0.0.0:0 --state_dir "${TMP}/state2" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"Pass --token_file FILE"* ]] && pass "non-loopback needs tokens" \
  || fail "0.0.0.0 rc=${rc} out='${out}'"

# --- the worker registers with the coordinator and stops cleanly on SIGTERM
"${WORKER}" --coordinator "${addr}" --slots 2 2>"${TMP}/worker.log" &
worker_pid=$!
track_pid "${worker_pid}"
wait_for 'grep -q "connected to ${addr} as agent-" "${TMP}/worker.log"' 10 && pass "worker registers its slots" \
  || fail "worker did not connect: $(tail -3 "${TMP}/worker.log")"
kill -TERM "${worker_pid}"
if ! wait_exit "${worker_pid}" 10; then
  fail "worker still running 10 s after SIGTERM"
  kill -KILL "${worker_pid}"
else
  wait "${worker_pid}"; rc=$?
  [[ ${rc} -eq 0 ]] && pass "worker exits 0 on SIGTERM" || fail "worker exit code ${rc} after SIGTERM"
fi
out=$("${WORKER}" --coordinator 127.0.0.1:1 --connect_timeout 1 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"no coordinator answered at 127.0.0.1:1"* ]] \
  && pass "worker without a coordinator says so" || fail "worker rc=${rc} out='${out}'"

# --- an agent asked for CUDA slots where there is no GPU (or no CUDA in the
# build) exits at once saying which, before it offers anything
out=$("${WORKER}" --coordinator 127.0.0.1:1 --device cuda --slots 1 2>&1); rc=$?
[[ ${rc} -eq 2 && ( "${out}" == "chorus-worker: this binary was built without CUDA; rebuild with \`bazel build --config=cuda\`"* \
    || "${out}" == *"chorus-worker: CUDA reports no usable GPU"* ) ]] \
  && pass "a CUDA agent without a GPU says why: ${out}" || fail "--device cuda rc=${rc} out='${out}'"

# --- validate: a bad spec exits 2 and names every field
cat > "${TMP}/bad.yaml" <<'SPEC'
model: {mlp: {}}
data: {synthetic: {}}
strategy: {ddp: {bucket_cap_mb: -3}}
training: {batch_size_per_rank: 0.5}
SPEC
out=$("${CHORUS}" validate "${TMP}/bad.yaml" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"batch_size_per_rank"* ]] && pass "validate rejects non-integer" \
  || fail "validate bad rc=${rc} out='${out}'"
sed -i 's/batch_size_per_rank: 0.5/batch_size_per_rank: -1/' "${TMP}/bad.yaml"
out=$("${CHORUS}" validate "${TMP}/bad.yaml" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"strategy.ddp.bucket_cap_mb: must be > 0, got -3"* \
   && "${out}" == *"training.batch_size_per_rank: must be > 0, got -1"* ]] \
  && pass "validate names both fields" || fail "validate bad rc=${rc} out='${out}'"

# --- validate: a good spec prints the normalized spec and exits 0
printf 'model { mlp {} }\ndata { synthetic {} }\n' > "${TMP}/good.textproto"
out=$("${CHORUS}" validate "${TMP}/good.textproto" 2>/dev/null); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"bucket_cap_mb: 25"* && "${out}" == *"dead_after_seconds: 5"* ]] \
  && pass "validate prints defaults" || fail "validate good rc=${rc} out='${out}'"
out=$("${CHORUS}" validate --output json "${TMP}/good.textproto" 2>/dev/null); rc=$?
[[ ${rc} -eq 0 && "$(json_get - strategy.ddp.bucket_cap_mb <<<"${out}")" == 25 ]] && pass "validate --output json" \
  || fail "validate json rc=${rc} out='${out}'"

# --- usage errors exit 2
"${CHORUS}" >/dev/null 2>&1; rc=$?
[[ ${rc} -eq 2 ]] && pass "no subcommand exits 2" || fail "no subcommand rc=${rc}"
"${CHORUS}" validate /nonexistent.yaml >/dev/null 2>&1; rc=$?
[[ ${rc} -eq 2 ]] && pass "missing spec exits 2" || fail "missing spec rc=${rc}"

# --- jobs: submit, list, status, cancel
out=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/good.textproto" 2>/dev/null); rc=$?
[[ ${rc} -eq 0 && "${out}" == "job-000001" ]] && pass "submit prints the job id" \
  || fail "submit rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/bad.yaml" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"bucket_cap_mb"* ]] && pass "submit refuses a bad spec" \
  || fail "bad submit rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${addr}" submit --resume_from job-000099 "${TMP}/good.textproto" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *'no job "job-000099"'* ]] && pass "submit names an unknown resume_from" \
  || fail "resume_from rc=${rc} out='${out}'"
"${CHORUS}" --coordinator "${addr}" submit "${TMP}/good.textproto" >/dev/null 2>&1
out=$("${CHORUS}" --coordinator "${addr}" jobs 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"job-000002"*"PENDING"* && "${out}" == *"job-000001"*"PENDING"* ]] \
  && pass "jobs lists both as PENDING" || fail "jobs rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${addr}" cancel job-000001 --reason "changed my mind" 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == "job-000001: CANCELLED (changed my mind)" ]] && pass "cancel" \
  || fail "cancel rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${addr}" cancel job-000001 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"already ended: CANCELLED"* ]] && pass "cancel twice is refused" \
  || fail "cancel twice rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${addr}" status job-000002 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"job-000002 (job): PENDING"* && "${out}" == *"Problems: none"* ]] \
  && pass "status" || fail "status rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${addr}" status job-000002 --json 2>&1); rc=$?
[[ ${rc} -eq 0 && "$(json_get - job.job_id <<<"${out}")" == job-000002 \
   && "$(json_get - job.state <<<"${out}")" == PENDING ]] \
  && pass "status --json" || fail "status json rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${addr}" status job-424242 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *'no job "job-424242"'* ]] && pass "status of an unknown job" \
  || fail "unknown status rc=${rc} out='${out}'"

# --- kill -9 and restart on the same state dir: every acknowledged job is back
kill -KILL "${coordinator_pid}"
wait "${coordinator_pid}" 2>/dev/null
if start_coordinator -s "${TMP}/state" -p "${TMP}/port" -o "${TMP}/coordinator2.log"; then
  coordinator_pid=${COORDINATOR_PID}
  addr=${COORDINATOR_ADDR}
  out=$("${CHORUS}" --coordinator "${addr}" jobs --json 2>&1); rc=$?
  [[ ${rc} -eq 0 ]] && json_has - 'jobs[*].job_id' job-000002 <<<"${out}" \
     && json_has - 'jobs[*].state' CANCELLED <<<"${out}" \
     && [[ "$(json_get - 'jobs[*].reason' <<<"${out}")" == *"changed my mind"* ]] && pass "jobs survive kill -9" \
    || fail "after restart rc=${rc} out='${out}'"
  out=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/good.textproto" 2>/dev/null)
  [[ "${out}" == "job-000003" ]] && pass "numbering continues after restart" \
    || fail "third job id '${out}'"
else
  fail "coordinator did not restart on its state dir: $(cat "${TMP}/coordinator2.log")"
fi

# --- SIGTERM stops the coordinator cleanly and promptly
kill -TERM "${coordinator_pid}"
if wait_exit "${coordinator_pid}" 10; then
  wait "${coordinator_pid}"; rc=$?
  [[ ${rc} -eq 0 ]] && pass "SIGTERM -> exit 0" || fail "coordinator exit code ${rc} after SIGTERM"
  grep -q "coordinator stopped" "${TMP}/coordinator2.log" && pass "logged clean stop" \
    || fail "no clean-stop log line"
else
  fail "coordinator still running 10 s after SIGTERM"
fi

# --- ping against nothing: exit 1 with a message that says what to do
out=$("${CHORUS}" ping --coordinator "${addr}" --timeout 1 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"no coordinator answered at ${addr}"* ]] \
  && pass "ping with no coordinator" || fail "dead ping rc=${rc} out='${out}'"

finish
