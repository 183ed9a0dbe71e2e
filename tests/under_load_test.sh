#!/usr/bin/env bash
# Tests of tests/under_load.sh: the busy loops run while the command does and
# end with it, the command's status and last line come through, bad flags are
# refused naming the flag.
#
# Usage (from Bazel): under_load_test.sh UNDER_LOAD
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
UNDER_LOAD=$(realpath "$1")

# The command counts the busy loops of its harness (their last argument is
# its pid: another harness may run beside it, the one CI runs under, say)
# while it runs, then says so and fails with status 3.
probe="${TMP}/probe.sh"
cat > "${probe}" <<PROBE
sleep 1
echo "\${CHORUS_UNDER_LOAD_PID}" > "${TMP}/harness.pid"
echo "loops while running: \$(pgrep -c -f "^bash -c end=.* busy [0-9]+ \${CHORUS_UNDER_LOAD_PID}\$")"
echo "7 passed, 1 failed"
exit 3
PROBE
start=$(_lib_now_us)
out=$("${UNDER_LOAD}" --loops 3 --max_seconds 60 --command "bash ${probe}" 2>&1); rc=$?
took=$(elapsed_since "${start}")
[[ "${out}" == *"loops while running: 3"* ]] && pass "3 busy loops run beside the command" \
  || fail "loops while running: ${out}"
[[ ${rc} -eq 3 && "$(tail -n 1 <<<"${out}")" == "7 passed, 1 failed" ]] \
  && pass "the command's status and last line come through" || fail "rc=${rc} out='${out}'"
# The command takes a second; nothing of the harness (its load sampler
# sleeps a minute at a time) may keep it waiting after that.
awk -v t="${took}" 'BEGIN { exit !(t < 15) }' && pass "it returns when the command ends (${took} s)" \
  || fail "it returned ${took} s after starting a 1 s command"
[[ "$(tail -n 2 <<<"${out}" | head -n 1)" =~ ^"under load: 3 loop(s), load "[0-9.]+[.][.][0-9.]+" (".*"), "[0-9]+" s"$ ]] \
  && pass "it says how many loops and what load" || fail "summary line: ${out}"
harness=$(cat "${TMP}/harness.pid" 2>/dev/null)
[[ "${harness}" =~ ^[0-9]+$ ]] || fail "the command saw no CHORUS_UNDER_LOAD_PID: '${harness}'"
wait_for '[[ "$(pgrep -c -f "^bash -c end=.* busy [0-9]+ ${harness}$")" == 0 ]]' 5 \
  && pass "no loop outlives the command" \
  || fail "loops left: $(pgrep -a -f "busy [0-9]+ ${harness}$")"

# Killed with SIGKILL (no trap runs), it leaves nothing running: each loop
# and the load sampler watch the script's pid.
"${UNDER_LOAD}" --loops 2 --max_seconds 60 --command "echo \$\$ > '${TMP}/sleeper'; exec sleep 30" \
  >/dev/null 2>&1 &
harness=$!
disown "${harness}"  # no "Killed" line from the shell
wait_for '[[ "$(pgrep -c -f "^bash -c end=.* busy [0-9]+ ${harness}$")" == 2 ]]' 10 \
  || fail "no loops of the harness ${harness} seen"
kill -KILL "${harness}"
wait_for '[[ "$(pgrep -c -f "^bash -c end=.* busy [0-9]+ ${harness}$")" == 0 ]]' 5 \
  && pass "the loops end when the harness is killed with SIGKILL" \
  || { fail "loops outlived a killed harness: $(pgrep -a -f "busy [0-9]+ ${harness}$")"; pkill -f "busy [0-9]+ ${harness}$"; }
wait_for '! pgrep -f "sampler .* ${harness}$" >/dev/null' 5 \
  && pass "so does its load sampler" \
  || { fail "the sampler outlived a killed harness: $(pgrep -a -f "sampler .* ${harness}$")"; pkill -f "sampler .* ${harness}$"; }
wait_for_file "${TMP}/sleeper" 5 && kill "$(cat "${TMP}/sleeper")" 2>/dev/null

out=$("${UNDER_LOAD}" --loops two --command true 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"--loops must be a whole number, got 'two'"* ]] \
  && pass "a bad --loops is refused naming it" || fail "bad --loops: rc=${rc} ${out}"
out=$("${UNDER_LOAD}" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"no test targets given"* ]] \
  && pass "nothing to run is refused" || fail "nothing to run: rc=${rc} ${out}"
out=$("${UNDER_LOAD}" --max_seconds 0 --command true 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"--max_seconds must be a whole number > 0"* ]] \
  && pass "a zero --max_seconds is refused" || fail "bad --max_seconds: rc=${rc} ${out}"
finish
