#!/usr/bin/env bash
# Tests of tests/lib.sh, the helpers every shell test is built on: the JSON
# reader, bounded waits, counts and exit status, coordinator start-up (with a
# stand-in coordinator) and the exit cleanup.
#
# Usage: lib_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LIB="$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# expect NAME EXPECTED ACTUAL
expect() {
  [[ "$3" == "$2" ]] && pass "$1" || fail "$1: expected '$2', got '$3'"
}

# --- json_get: paths, types, wildcards, errors
doc='{"job": {"job_id": "job-000002", "state": "FAILED", "reason": "it said \"no\"\nthen stopped",
      "latest_metrics": {"step": "300", "eval_accuracy": 0.9315, "values": {}}},
      "ranks": [{"rank": 0, "phase": "COLLECTIVE", "step": "17"}, {"rank": 1, "step": "16"}],
      "per_rank": true, "nothing": null, "list": [1, 2.5, "x"]}'
expect "a nested string prints as itself" job-000002 "$(json_get - job.job_id <<<"${doc}")"
expect "escapes are decoded" $'it said "no"\nthen stopped' "$(json_get - job.reason <<<"${doc}")"
expect "an int64 (a JSON string) prints as its digits" 300 "$(json_get - job.latest_metrics.step <<<"${doc}")"
expect "a float prints as in JSON" 0.9315 "$(json_get - job.latest_metrics.eval_accuracy <<<"${doc}")"
expect "true and null print as in JSON" "true null" \
  "$(json_get - per_rank <<<"${doc}") $(json_get - nothing <<<"${doc}")"
expect "an index" COLLECTIVE "$(json_get - 'ranks[0].phase' <<<"${doc}")"
expect "a negative index counts from the end" 16 "$(json_get - 'ranks[-1].step' <<<"${doc}")"
expect "[*] prints every element's value, skipping those without it" COLLECTIVE \
  "$(json_get - 'ranks[*].phase' <<<"${doc}")"
expect "[*] over a field every element has" $'17\n16' "$(json_get - 'ranks[*].step' <<<"${doc}")"
expect "objects and arrays print as compact JSON" '{} [1,2.5,"x"]' \
  "$(json_get - job.latest_metrics.values <<<"${doc}") $(json_get - list <<<"${doc}")"
expect "an empty path is the whole document" 2 "$(json_get - '' <<<"${doc}" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["ranks"]))')"
echo "${doc}" > "${TMP}/doc.json"
expect "reads a file" FAILED "$(json_get "${TMP}/doc.json" job.state)"

out=$(json_get - job.missing <<<"${doc}"); rc=$?
expect "a missing field: exit 1, nothing printed" "1 ''" "${rc} '${out}'"
out=$(json_get - 'ranks[5].step' <<<"${doc}"); rc=$?
expect "an index past the end: exit 1" "1 ''" "${rc} '${out}'"
out=$(json_get - 'ranks[*].missing' <<<"${doc}"); rc=$?
expect "[*] that finds nothing: exit 1" 1 "${rc}"
err=$(json_get - state <<<"{\"state\": \"FAILED\", \"reason\": \"the coordinator\\'s host\"}" 2>&1 >/dev/null); rc=$?
[[ ${rc} -eq 2 && "${err}" == *"is not a JSON document"* ]] && pass "an invalid escape is not JSON: exit 2, said on stderr" \
  || fail "invalid JSON: rc=${rc} err='${err}'"
json_get - state </dev/null 2>/dev/null; expect "empty input: exit 2" 2 $?
json_get "${TMP}/no-such-file" state 2>/dev/null; expect "a missing file: exit 2" 2 $?

json_has - 'ranks[*].step' 16 <<<"${doc}" && pass "json_has finds one of several values" || fail "json_has 16"
json_has - 'ranks[*].step' 1 <<<"${doc}" && fail "json_has matched a prefix" || pass "json_has compares whole values"
json_has - 'ranks[*].missing' x <<<"${doc}" && fail "json_has found a missing field" || pass "json_has of a missing field fails"

# --- wait_for, wait_for_file, wait_exit
expect "the slack is 3 unless CHORUS_TEST_SLACK says otherwise" "3 1.5" \
  "$(env -u CHORUS_TEST_SLACK bash -c "source '${LIB}'; echo \${TEST_SLACK}") $(CHORUS_TEST_SLACK=1.5 bash -c "source '${LIB}'; echo \${TEST_SLACK}")"
out=$(CHORUS_TEST_SLACK=soon bash -c "source '${LIB}'; echo sourced" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"CHORUS_TEST_SLACK must be a number >= 1, got 'soon'"* ]] \
  && pass "a slack that is not a number stops the test, naming the variable" || fail "bad slack: rc=${rc} out='${out}'"
out=$(CHORUS_TEST_SLACK=0.5 bash -c "source '${LIB}'; echo sourced" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"got '0.5'"* ]] && pass "a slack below 1 is refused" \
  || fail "slack 0.5: rc=${rc} out='${out}'"
expect "slack_seconds: whole seconds of S x the slack" "45 7" \
  "$(TEST_SLACK=3; slack_seconds 15) $(TEST_SLACK=1.5; slack_seconds 5)"
TEST_SLACK=1
start=${EPOCHREALTIME/./}
wait_for 'false' 0.5; rc=$?
took_ms=$(( (${EPOCHREALTIME/./} - start) / 1000 ))
[[ ${rc} -eq 1 ]] && (( took_ms >= 500 && took_ms < 2000 )) && pass "wait_for gives up after its timeout (${took_ms} ms)" \
  || fail "wait_for false 0.5: rc=${rc} after ${took_ms} ms"
TEST_SLACK=2
start=${EPOCHREALTIME/./}
wait_for 'false' 0.5; rc=$?
took_ms=$(( (${EPOCHREALTIME/./} - start) / 1000 ))
[[ ${rc} -eq 1 ]] && (( took_ms >= 1000 && took_ms < 2500 )) \
  && pass "wait_for allows its timeout times the slack (${took_ms} ms at slack 2)" \
  || fail "wait_for false 0.5 at slack 2: rc=${rc} after ${took_ms} ms"
TEST_SLACK=1
start=$(_lib_now_us)
sleep 0.3
took=$(elapsed_since "${start}")
[[ "${took}" =~ ^0\.[3-9]$|^1\.[0-9]$ ]] && pass "elapsed_since in tenths of a second (${took} s)" \
  || fail "elapsed_since after 0.3 s: '${took}'"
n=0
wait_for 'n=$((n + 1)); [[ ${n} -ge 3 ]]' 5; rc=$?
expect "wait_for retries until the condition holds; its assignments stay visible" "0 3" "${rc} ${n}"
condition=unchanged timeout=unchanged
wait_for 'true' 1
expect "wait_for leaves the caller's variables alone" "unchanged unchanged" "${condition} ${timeout}"
(sleep 0.3; echo 123 > "${TMP}/late") &
wait_for_file "${TMP}/late" 5 && expect "wait_for_file sees a file written later" 123 "$(cat "${TMP}/late")" \
  || fail "wait_for_file: no file"
wait_for_file "${TMP}/never" 0.3 && fail "wait_for_file found a file never written" || pass "wait_for_file times out"
sleep 0.3 &
wait_exit $! 5 && pass "wait_exit sees a process end" || fail "wait_exit: sleep 0.3 still running"
sleep 30 &
sleeper=$!
wait_exit "${sleeper}" 0.3 && fail "wait_exit: sleep 30 ended" || pass "wait_exit times out while the process runs"
kill "${sleeper}"

# --- pass / fail / finish in a child shell: counts and exit status
out=$(bash -c "source '${LIB}'; pass a; pass b; finish" 2>&1); rc=$?
expect "finish with no failure exits 0" "0 2 passed, 0 failure(s)" "${rc} $(tail -n 1 <<<"${out}")"
out=$(bash -c "source '${LIB}'; pass a; fail b; fail c; finish" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"FAIL: b"* && "$(tail -n 1 <<<"${out}")" == "1 passed, 2 failure(s)" ]] \
  && pass "finish with failures exits 1, counting them" || fail "finish after failures: rc=${rc} out='${out}'"

# --- start_coordinator with a stand-in that writes its port like the real one
cat > "${TMP}/fake_coordinator" <<'FAKE'
#!/usr/bin/env bash
# Records its arguments, writes port 4242 to --port_file, then waits.
echo "$*" > "$(dirname "$0")/fake_args"
while [[ $# -gt 0 ]]; do [[ "$1" == --port_file ]] && echo 4242 > "$2"; shift; done
echo "fake coordinator running" >&2
exec sleep 300
FAKE
chmod +x "${TMP}/fake_coordinator"
out=$(bash -c "source '${LIB}'; COORDINATOR='${TMP}/fake_coordinator'
  start_coordinator -s '${TMP}/fake_state' -p '${TMP}/fake.port' -o '${TMP}/fake.log' -- --token_file tokens || exit 3
  echo \"\${COORDINATOR_ADDR} \${COORDINATOR_PORT} \${COORDINATOR_PID}\"" 2>&1); rc=$?
read -r addr port pid <<<"${out}"
expect "start_coordinator sets the address and port" "0 127.0.0.1:4242 4242" "${rc} ${addr} ${port}"
expect "it passes listen, state dir, port file and the extra flags" \
  "--listen 127.0.0.1:0 --state_dir ${TMP}/fake_state --port_file ${TMP}/fake.port --token_file tokens" \
  "$(cat "${TMP}/fake_args")"
expect "its stderr goes to the log" "fake coordinator running" "$(cat "${TMP}/fake.log")"
wait_for '! kill -0 "${pid}" 2>/dev/null' 5 && pass "the exit cleanup killed the coordinator it started" \
  || { fail "coordinator ${pid} still runs after its test exited"; kill -KILL "${pid}"; }

printf '#!/usr/bin/env bash\necho "cannot bind" >&2\n' > "${TMP}/broken_coordinator"
chmod +x "${TMP}/broken_coordinator"
out=$(CHORUS_TEST_SLACK=1 bash -c "source '${LIB}'; COORDINATOR='${TMP}/broken_coordinator'
  # A clock that moves 5 s a reading, so the 20 s wait ends at once.
  _lib_now_us() { local t=\$(( \$(cat '${TMP}/clock' 2>/dev/null || echo 0) + 5000000 )); echo \$t > '${TMP}/clock'; echo \$t; }
  start_coordinator -l 127.0.0.1:7 -s '${TMP}/broken_state' -o '${TMP}/broken.log'" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"wrote no port within 20 s"* && "${out}" == *"cannot bind"* ]] \
  && pass "a coordinator that writes no port: start_coordinator returns 1 and shows its log" \
  || fail "broken coordinator: rc=${rc} out='${out}'"

# --- up_small_job runs the given chorus from TMP and keeps its JSON line
cat > "${TMP}/fake_chorus" <<FAKE
#!/usr/bin/env bash
echo "\$(pwd) \$*" > "${TMP}/fake_chorus_args"
echo "progress"; echo '{"state": "FAILED"}'; exit 1
FAKE
chmod +x "${TMP}/fake_chorus"
up_small_job "${TMP}/fake_chorus" tiny
expect "up_small_job: exit code, last line" '1 {"state": "FAILED"}' "${UP_RC} ${UP_LAST}"
expect "it runs chorus up from TMP with its spec" \
  "${TMP} up --local 2 --state_dir ${TMP}/up ${TMP}/job.textproto --json" "$(cat "${TMP}/fake_chorus_args")"
expect "the spec is named" 'name: "tiny"' "$(head -n 1 "${TMP}/job.textproto")"

# --- check_sample_trace: 2 ranks, an epoch of 8 samples (2 steps of 2 x 2);
# generation 1 started step 1 on rank 0 only, generation 2 trained it again
mkdir -p "${TMP}/trace"
printf '%s\n' "step 1 0 0 0 0,1" "step 1 0 1 0 4,5" "state 2 0 source 0 step 1 had 1" \
  "step 2 0 1 0 4,5" "final 2 0 2 0badc0de" > "${TMP}/trace/11.trace"
printf '%s\n' "step 1 1 0 0 2,3" "state 2 1 source 0 step 1 had 1" "step 2 1 1 0 6,7" \
  "final 2 1 2 0badc0de" > "${TMP}/trace/12.trace"
expect "check_sample_trace: states, finals, the interrupted epoch, the counts" \
  "$(printf '%s\n' "state 11 2 0 0 1 1" "final 11 2 0 2 0badc0de" "state 12 2 1 0 1 1" \
     "final 12 2 1 2 0badc0de" "interrupted 0" "epochs 1 steps 2")" \
  "$(check_sample_trace "${TMP}/trace" 2 8)"
# Rank 1 trains samples 2,3 twice, never 6,7.
printf '%s\n' "step 1 1 0 0 2,3" "step 2 1 1 0 2,3" > "${TMP}/trace/12.trace"
expect "a sample trained twice is an error" \
  "$(printf '%s\n' "state 11 2 0 0 1 1" "final 11 2 0 2 0badc0de" \
     "error epoch 0: 8 samples, 6 distinct, 2 repeated" "interrupted 0" "epochs 1 steps 2")" \
  "$(check_sample_trace "${TMP}/trace" 2 8)"
rm "${TMP}/trace/12.trace"
expect "a step that a rank of its generation did not train is an error" \
  "error step 0 generation 1 has ranks [0]" "$(check_sample_trace "${TMP}/trace" 2 8 | grep '^error step 0')"

# --- free_ports: distinct, free, below the ephemeral range (Note [Ports that
# stay free])
read -r -a picked < <(free_ports 5)
low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
expect "free_ports 5 gives 5 distinct ports" 5 "$(printf '%s\n' "${picked[@]}" | sort -u | wc -l)"
below=0
for p in "${picked[@]}"; do (( p >= 10000 && p < low )) && below=$((below + 1)); done
expect "each is below the ephemeral range (${low})" 5 "${below}"
expect "each can be bound" ok "$("${CHORUS_TEST_PYTHON}" -c '
import socket, sys
for p in sys.argv[1:]:
    s = socket.socket(); s.bind(("127.0.0.1", int(p))); s.close()
print("ok")' "${picked[@]}" 2>&1)"

# --- on_exit code runs when the test exits
bash -c "source '${LIB}'; on_exit 'echo cleaned > \"${TMP}/on_exit\"'; exit 0"
expect "on_exit code runs at exit" cleaned "$(cat "${TMP}/on_exit" 2>/dev/null)"

# --- a test terminated in a wait says which, and shows its on_timeout code's
# output (Note [A test that times out says where]); the child has a TMP of
# its own, since every wait_for writes TMP/.lib_waiting
mkdir -p "${TMP}/terminated"
TEST_TMPDIR="${TMP}/terminated" bash -c "source '${LIB}'; on_timeout 'echo shown: the agent log'
  wait_for '[[ -e /nonexistent-chorus ]]' 60" >"${TMP}/terminated.out" 2>&1 &
child=$!
wait_for '[[ -s "${TMP}/terminated/.lib_waiting" ]]' 10
kill -TERM "${child}"
wait "${child}"
expect "a terminated test exits 143" 143 "$?"
out=$(cat "${TMP}/terminated.out")
[[ "${out}" =~ TERMINATED\ after\ [0-9.]+\ s.*in:\ wait_for\ \(up\ to\ 60\ x\ [0-9.]+\ s,\ from\ [0-9.]+\ s\):\ \[\[\ -e\ /nonexistent-chorus\ \]\] \
   && "${out}" == *"shown: the agent log"* ]] \
  && pass "a terminated test names the wait it was in and shows its on_timeout output" \
  || fail "terminated test's output: ${out}"

finish
