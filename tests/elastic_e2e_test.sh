#!/usr/bin/env bash
# End to end, elastic jobs (docs/elastic.md; issue 23, test 1): a rank of a
# 4-rank DDP job is killed with SIGKILL in the middle of an epoch while the
# agent has a spare slot. The job succeeds; the three survivors keep their
# processes (same PIDs); the newcomer receives the training state by
# broadcast; every rank ends with the same parameters, bit for bit the ones
# of an undisturbed run of the same spec; and the sample trace (test mode
# CHORUS_SAMPLE_TRACE) shows that every sample of every epoch, the
# interrupted one included, was trained exactly once; the survivors join
# the new generation through their node agent, and no rank of the job
# joins with its own Join (chorus_rank_joins_total). Then (test 3) a rank
# frozen with SIGSTOP is diagnosed DEAD and, with hang_detection.action
# RESTART, evicted and replaced the same way; and (test 6) a failure beyond
# elastic.max_restarts fails the job with the history in its reason.
#
# Usage (from Bazel): elastic_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }
# All-reduces always through shared memory (no timing of both paths on the
# first ops of each communicator, which would run some steps over TCP in one
# run and not in another): the sums add up in the same order in every run and
# generation, so parameters can be compared bit for bit.
export CHORUS_GLOO_SHM=1

# 3 epochs of 64 steps (4096 samples, 4 ranks x 16). Rank 0 sleeps 40 ms a
# step in generation 1 only, so the kill lands mid-epoch on a busy machine.
spec() {  # $1 = extra fields, $2 = the elastic block's fields
  cat <<SPEC
name: "elastic"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 4096 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 3 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 4 max_ranks: 4 }
elastic { ${2:-max_restarts: 2 wait_seconds: 60} }
$1
SPEC
}

# --- undisturbed reference run
mkdir -p "${TMP}/ref_trace" "${TMP}/trace"
spec "" > "${TMP}/ref.textproto"
out=$(CHORUS_SAMPLE_TRACE="${TMP}/ref_trace" timeout 100 "${CHORUS}" up --local 4 \
  --state_dir "${TMP}/ref" "${TMP}/ref.textproto" --json 2>"${TMP}/ref.err"); rc=$?
ref_state=$(field "$(tail -n 1 <<<"${out}")" state)
ref=$(check_sample_trace "${TMP}/ref_trace" 4 4096)
ref_crc=$(awk '$1 == "final" {print $6}' <<<"${ref}" | sort -u)
ref_accuracy=$(field "$(tail -n 1 <<<"${out}")" final_metrics.test_accuracy)
[[ ${rc} -eq 0 && "${ref_state}" == SUCCEEDED && $(grep -c '^final' <<<"${ref}") -eq 4 \
   && $(wc -l <<<"${ref_crc}") -eq 1 && "${ref_crc}" =~ ^[0-9a-f]{8}$ && "${ref}" != *error* && "${ref}" == *"epochs 3 steps 192"* ]] \
  && pass "undisturbed run: 4 ranks end with parameters ${ref_crc}" \
  || fail "reference rc=${rc} state=${ref_state} trace='${ref}' err=$(tail -3 "${TMP}/ref.err")"

# --- the same job, rank 1 killed with SIGKILL in epoch 1, one spare slot
spec "fault_injection { faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.04 } }" \
  > "${TMP}/elastic.textproto"
CHORUS_SAMPLE_TRACE="${TMP}/trace" timeout 110 "${CHORUS}" up --local 5 \
  --state_dir "${TMP}/elastic" "${TMP}/elastic.textproto" --json >"${TMP}/up.out" 2>"${TMP}/up.err" &
up_pid=$!
track_pid "${up_pid}"
# The coordinator's /metrics while chorus up runs: the last scrape has
# counted every join of the job (chorus_rank_joins_total).
scrape_up_metrics "${TMP}/elastic" "${up_pid}" "${TMP}/metrics.last"
# Rank 1 past step 80 (epoch 1 is steps 64..127).
wait_for '[[ -n "$(grep -l "^step 1 1 8[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 60
victim=$(grep -l "^step 1 1 " "${TMP}"/trace/*.trace 2>/dev/null | head -n 1)
victim=$(basename "${victim:-none}" .trace)
survivors=()
for rank in 0 2 3; do
  f=$(grep -l "^step 1 ${rank} " "${TMP}"/trace/*.trace 2>/dev/null | head -n 1)
  survivors+=("$(basename "${f:-none}" .trace)")
done
if [[ "${victim}" =~ ^[0-9]+$ ]] && kill -KILL "${victim}"; then
  pass "killed rank 1 (pid ${victim}) at step $(grep -c '^step' "${TMP}/trace/${victim}.trace")"
else
  fail "no rank 1 to kill (victim '${victim}'); up: $(tail -3 "${TMP}/up.err")"
fi
wait_exit "${up_pid}" 100 || fail "chorus up still running 100 s after the kill"
wait "${up_pid}"; rc=$?
last=$(tail -n 1 "${TMP}/up.out")
accuracy=$(field "${last}" final_metrics.test_accuracy)
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED && "$(field "${last}" final_metrics.steps)" == 192 ]] \
  && awk -v a="${accuracy}" -v b="${ref_accuracy}" 'BEGIN { d = a - b; exit !(d <= 0.005 && d >= -0.005) }' \
  && pass "the job succeeded after 192 steps, test accuracy ${accuracy} (undisturbed ${ref_accuracy})" \
  || fail "elastic run rc=${rc} last='${last}' undisturbed accuracy ${ref_accuracy} err=$(tail -5 "${TMP}/up.err")"

# The 3 survivors joined generation 2 through their node agent (Note [Joins
# through the agent] in worker/agent/agent.cc), none with its own Join.
through_agent=$(sed -n 's/.*job-000001: sent \([0-9]*\) rank join(s) to the coordinator in one message (generation 2).*/\1/p' \
  "${TMP}/elastic/worker.log" | awk '{ n += $1 } END { print n + 0 }')
direct=$(grep -c "joining generation 2 of job-000001 directly" "${TMP}/elastic/worker.log")
[[ "${through_agent}" -ge 3 && "${direct}" -eq 0 ]] \
  && pass "the survivors joined generation 2 through the agent (${through_agent} joins sent)" \
  || fail "joins through the agent: ${through_agent}, direct fallbacks: ${direct}; $(grep -E 'rank join|directly' "${TMP}/elastic/worker.log" | tail -5)"

# Every join of the job, generation 1's and the newcomer's first joins
# included, came through the node agent (Note [The first join through the
# agent] in worker/rank_main.cc): 4 in generation 1, 4 in generation 2, more
# for the attempts answered "not formed yet"; none with a rank's own Join.
wait_exit "${SCRAPER_PID}" 10 || fail "the /metrics scraper still runs 10 s after chorus up ended"
via_agent=$(rank_joins_via "${TMP}/metrics.last" agent)
via_rank=$(rank_joins_via "${TMP}/metrics.last" rank)
[[ "${via_rank}" == 0 && "${via_agent}" =~ ^[0-9]+$ && "${via_agent}" -ge 8 ]] \
  && pass "chorus_rank_joins_total: ${via_agent} joins via the agent, 0 via the rank's own Join" \
  || fail "chorus_rank_joins_total via agent '${via_agent}', via rank '${via_rank}'; $(grep -E 'rank join|directly' "${TMP}/elastic/worker.log" | tail -5)"

trace=$(check_sample_trace "${TMP}/trace" 4 4096)
finals=$(grep '^final' <<<"${trace}")
[[ "${trace}" != *error* && "${trace}" == *"epochs 3 steps 192"* && "${trace}" == *"interrupted 1"* ]] \
  && pass "every sample of each of the 3 epochs, interrupted epoch 1 included, was trained exactly once" \
  || fail "sample trace: ${trace}"
for pid in "${survivors[@]}"; do
  grep -q "^final ${pid} 2 " <<<"${finals}" && pass "survivor pid ${pid} finished generation 2 in the same process" \
    || fail "survivor ${pid} has no final line in generation 2: ${finals}"
done
grep -q "^final ${victim} " <<<"${finals}" && fail "the killed rank ${victim} finished"
newcomer=$(awk '$1 == "state" && $7 == -1 {print $2, $4, $5, $6}' <<<"${trace}")
read -r new_pid new_rank source step <<<"${newcomer}"
[[ -n "${new_pid}" && "${new_pid}" != "${victim}" && " ${survivors[*]} " != *" ${new_pid} "* \
   && "${new_rank}" == 1 && "${source}" != 1 && "${step}" -ge 80 ]] \
  && grep -q "^final ${new_pid} 2 1 " <<<"${finals}" \
  && pass "the newcomer (pid ${new_pid}, rank 1) received step ${step} from rank ${source} and finished" \
  || fail "newcomer '${newcomer}' finals='${finals}'"
crcs=$(awk '{print $6}' <<<"${finals}" | sort -u)
[[ $(wc -l <<<"${finals}") -eq 4 && $(wc -l <<<"${crcs}") -eq 1 ]] \
  && pass "all 4 ranks end with the same parameters (${crcs})" || fail "final lines: ${finals}"
[[ "${crcs}" == "${ref_crc}" ]] \
  && pass "the parameters are bit for bit those of the undisturbed run: no step lost or redone" \
  || fail "parameters ${crcs} differ from the undisturbed run's ${ref_crc}"

# --- what the coordinator recorded
if start_coordinator -s "${TMP}/elastic/state"; then
  out=$(timeout 20 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" watch job-000001 2>&1)
  [[ "${out}" == *"state RUNNING: generation 2 after rank 1 ("*"pid ${victim}) was killed by signal 9"*": 4 -> 4 ranks (rank 1 on "*"restart 1 of 2"* \
     && "${out}" == *"generation 2 formed with 4 ranks, "*" s after the failure (recovery_seconds)"* ]] \
    && pass "watch shows the generation change and the recovery time" || fail "watch: ${out}"
  out=$(timeout 20 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status job-000001 2>&1)
  [[ "${out}" == *"generation 2, world size 4, restarts 1 of elastic.max_restarts 2"* ]] \
    && pass "status shows the generation and the restarts" || fail "status: ${out}"
else
  fail "no coordinator on the job's state"
fi
kill "${COORDINATOR_PID}" 2>/dev/null; wait "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "an elastic job"

# --- hang_detection RESTART (issue 23, test 3): rank 2 stops itself with
# SIGSTOP at step 100; diagnosed DEAD (after the default 5 s without a
# heartbeat: 2 s gave false DEADs on a loaded machine), evicted (its agent
# kills it) and replaced, and the job completes as if nothing had happened.
mkdir -p "${TMP}/stop_trace"
spec "hang_detection { action: RESTART }
fault_injection { faults { kind: STOP rank: 2 at_step: 100 } }" > "${TMP}/stop.textproto"
out=$(CHORUS_SAMPLE_TRACE="${TMP}/stop_trace" timeout 100 "${CHORUS}" up --local 5 \
  --state_dir "${TMP}/stop" "${TMP}/stop.textproto" --json 2>"${TMP}/stop.err"); rc=$?
[[ ${rc} -eq 0 && "$(field "$(tail -n 1 <<<"${out}")" state)" == SUCCEEDED ]] \
  && pass "the job with a stopped rank succeeded" \
  || fail "stop run rc=${rc} out='$(tail -n 1 <<<"${out}")' err=$(tail -5 "${TMP}/stop.err")"
trace=$(check_sample_trace "${TMP}/stop_trace" 4 4096)
crcs=$(awk '$1 == "final" {print $6}' <<<"${trace}" | sort -u)
[[ "${trace}" != *error* && "${trace}" == *"interrupted 1"* && "${trace}" == *"epochs 3 steps 192"* \
   && $(grep -c '^final' <<<"${trace}") -eq 4 && "${crcs}" == "${ref_crc}" ]] \
  && pass "after the eviction every sample was trained once and the parameters are the undisturbed run's" \
  || fail "stop trace: ${trace}"
if start_coordinator -s "${TMP}/stop/state"; then
  out=$(timeout 20 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" watch job-000001 2>&1)
  [[ "${out}" == *"evicting rank 2 (hang_detection.action RESTART): DEAD "* \
     && "${out}" == *"state RUNNING: generation 2 after rank 2 ("*") was evicted by hang_detection.action RESTART: DEAD "*"4 -> 4 ranks"* \
     && "${out}" == *"state SUCCEEDED"* ]] \
    && pass "watch shows the eviction and the new generation" || fail "watch: ${out}"
else
  fail "no coordinator on the stopped job's state"
fi
kill "${COORDINATOR_PID}" 2>/dev/null; wait "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "a job whose stopped rank was evicted"

# --- test 6: a failure beyond elastic.max_restarts fails the job with the
# history. Rank 1 kills itself at step 30 of generation 1 (survived), rank 2
# at step 60 of generation 2 (one too many).
spec "fault_injection { faults { kind: CRASH rank: 1 at_step: 30 }
                        faults { kind: CRASH rank: 2 at_step: 60 generation: 2 } }" \
  "max_restarts: 1" > "${TMP}/limit.textproto"
out=$(timeout 100 "${CHORUS}" up --local 5 --state_dir "${TMP}/limit" "${TMP}/limit.textproto" \
  --json 2>"${TMP}/limit.err"); rc=$?
last=$(tail -n 1 <<<"${out}")
reason=$(field "${last}" reason)
[[ ${rc} -eq 1 && "$(field "${last}" state)" == FAILED \
   && "${reason}" == "rank 2 ("*") was killed by signal 9; last stderr: fault injection: rank 2 kills itself (SIGKILL) at step 60 "*"; elastic.max_restarts 1 used up in generation 2; history: generation 2 after rank 1 ("*") was killed by signal 9; last stderr: fault injection: rank 1 kills itself (SIGKILL) at step 30 "*": 4 -> 4 ranks (rank 1 on "*"), restart 1 of 1" ]] \
  && pass "one failure too many fails the job with the history: ${reason}" \
  || fail "max_restarts run rc=${rc} last='${last}' err=$(tail -3 "${TMP}/limit.err")"
assert_no_leftovers "a job past elastic.max_restarts"

finish
