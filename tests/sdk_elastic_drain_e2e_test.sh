#!/usr/bin/env bash
# The SDK's elastic hooks at planned changes (docs/sdk.md "Elastic
# programs"): the elastic Fashion-MNIST loop (examples/programs/elastic_loop)
# as a program job of 1 to 2 ranks on two one-slot agents, node-a and node-b.
# `chorus drain node-b` makes rank 1 leave at a step boundary the ranks agree
# on (Session::ReformRequested): its program says so and exits 0, the job
# goes on with rank 0 alone (same process), no restart counted. Then node-c
# connects: the job grows back to 2 ranks at a step boundary, the newcomer
# takes the state from rank 0, and both end with the same parameters.
#
# Usage (from Bazel): sdk_elastic_drain_e2e_test.sh COORDINATOR CHORUS WORKER ELASTIC_LOOP
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
LOOP=$(realpath "$4")
field() { json_get - "$2" <<<"$1"; }

if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  fail "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist, deploy/setup.sh)"
  finish
fi

start_coordinator || { fail "no coordinator"; finish; }
chorus() { timeout 30 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" "$@"; }
# The program's lines (as the agents log them) that start with $1.
lines() { cat "${TMP}"/node-*.log 2>/dev/null | grep -h -o "$1.*"; }

start_agent node-a 1
start_agent node-b 1
# One epoch: 468 steps at 2 ranks of 64 samples; 10 ms a step so that the
# job lasts long enough to be drained and grown on a busy machine.
cat > "${TMP}/job.textproto" <<SPEC
name: "sdk-drain"
program { argv: ["${LOOP}", "--epochs=1", "--step_sleep_ms=10"] }
resources { min_ranks: 1 max_ranks: 2 threads_per_rank: 1 }
elastic { max_restarts: 0 wait_seconds: 60 scale_up_interval_seconds: 2 }
SPEC
job=$(chorus submit "${TMP}/job.textproto" 2>"${TMP}/submit.err")
[[ "${job}" == job-* ]] || fail "submit: ${job} $(cat "${TMP}/submit.err")"

wait_for '[[ -n "$(lines "progress: rank 1 step 100")" ]]' 90 \
  || fail "rank 1 never reached step 100: $(chorus status "${job}")"
survivor=$(lines "joined: rank 0 of 2 generation 1 pid " | awk '{print $NF}')

out=$(chorus drain node-b); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"(node-b): DRAINING"* ]] && pass "chorus drain node-b: ${out}" \
  || fail "drain rc=${rc} out='${out}'"
out=$(chorus drain node-b --wait 30); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"(node-b): DRAINED"* ]] && pass "node-b is drained: ${out}" \
  || fail "drain --wait rc=${rc} out='${out}'"
left=$(lines "left: rank 1 of generation 1 at step ")
[[ -n "${left}" ]] && pass "rank 1's program left at a step boundary: ${left}" \
  || fail "no 'left' line; node-b: $(tail -5 "${TMP}/node-b.log")"
out=$(chorus status "${job}")
[[ "${out}" == *"RUNNING"* && "${out}" == *"generation 2, world size 1, restarts 0 of elastic.max_restarts 0"* ]] \
  && pass "the job runs on with 1 rank and no restart counted" || fail "status: ${out}"
[[ -n "$(lines "joined: rank 0 of 1 generation 2 pid ${survivor}")" ]] \
  && pass "rank 0 went on alone in its own process (pid ${survivor})" \
  || fail "rank 0 in generation 2: '$(lines "joined: rank 0 of 1 generation 2")' (was ${survivor})"

# --- growth: node-c brings a free slot
start_agent node-c 1
wait_for '[[ "$(field "$(chorus status "${job}" --json)" job.world_size)" == 2 ]]' 30 \
  && pass "the job grew back to 2 ranks on node-c" || fail "no growth: $(chorus status "${job}")"
wait_for '[[ "$(field "$(chorus status "${job}" --json)" job.state)" == SUCCEEDED ]]' 120 \
  && pass "the job succeeded" || fail "job: $(chorus status "${job}")"
newcomer=$(lines "state: rank 1 generation 3 held -1 now step ")
boundary=${left##* }
[[ "${newcomer}" =~ now\ step\ ([0-9]+)\ from\ rank\ 0 && ${BASH_REMATCH[1]} -gt ${boundary:-999999} ]] \
  && pass "the newcomer took the newest state from rank 0: ${newcomer}" \
  || fail "newcomer: '${newcomer}' (left at ${boundary})"
[[ -n "$(lines "joined: rank 0 of 2 generation 3 pid ${survivor}")" ]] \
  && pass "rank 0 joined generation 3 in its own process" || fail "rank 0 in generation 3: $(lines "joined: rank 0")"
finals=$(lines "final: rank ")
digests=$(grep -o "params_digest [0-9a-f]*" <<<"${finals}" | sort -u)
[[ $(grep -c "generation 3 " <<<"${finals}") -eq 2 && $(grep -c . <<<"${digests}") -eq 1 ]] \
  && pass "both ranks of generation 3 end with the same parameters (${digests})" \
  || fail "finals: ${finals}"
events=$(chorus watch "${job}" 2>&1)
[[ "${events}" == *"generation 2 after agent agent-2 (node-b) was drained: rank(s) 1 leave: 2 -> 1 ranks, at a step boundary (not a restart)"* \
   && "${events}" == *"generation 3 after 1 free slot(s) let the job grow"* ]] \
  && pass "watch shows the drain and the growth" || fail "watch: ${events}"

kill "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
wait "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "an elastic program drained and grown"
finish
