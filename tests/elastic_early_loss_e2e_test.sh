#!/usr/bin/env bash
# End to end, an elastic job that loses a rank before any rank trained a step
# (issue 56, item 3): a 3-rank DDP job with hang_detection.action RESTART;
# every rank loads its data, builds its model and then waits (test mode
# CHORUS_TEST_SETUP_GATE) before its first collective. Rank 1 is killed with
# SIGKILL; the other two hear of generation 2 while still waiting, so their
# first collective fails and they join generation 2 holding no training
# state, as its newcomer does. The generation starts from the job's seeded
# initial model (Note [Starting over] in worker/train/trainer.cc) instead of
# failing: the job succeeds after the one restart the kill cost, and every
# rank ends with the parameters of an undisturbed run, bit for bit.
#
# Usage (from Bazel): elastic_early_loss_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }
# All-reduces always through shared memory, so that both runs add up their
# sums in the same order and parameters compare bit for bit.
export CHORUS_GLOO_SHM=1

# 2 epochs of 32 steps (1536 samples, 3 ranks x 16).
cat >"${TMP}/job.textproto" <<SPEC
name: "early-loss"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 1536 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 2 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 3 max_ranks: 3 }
elastic { max_restarts: 3 wait_seconds: 60 }
hang_detection { action: RESTART }
SPEC

# --- undisturbed reference run
mkdir -p "${TMP}/ref_trace" "${TMP}/trace"
out=$(CHORUS_SAMPLE_TRACE="${TMP}/ref_trace" timeout "$(slack_seconds 60)" "${CHORUS}" up \
  --local 3 --state_dir "${TMP}/ref" "${TMP}/job.textproto" --json 2>"${TMP}/ref.err"); rc=$?
ref_last=$(tail -n 1 <<<"${out}")
ref_loss=$(field "${ref_last}" final_metrics.test_loss)
ref=$(check_sample_trace "${TMP}/ref_trace" 3 1536)
ref_crc=$(awk '$1 == "final" {print $6}' <<<"${ref}" | sort -u)
[[ ${rc} -eq 0 && "$(field "${ref_last}" state)" == SUCCEEDED && "${ref}" != *error* \
   && $(grep -c '^final' <<<"${ref}") -eq 3 && "${ref_crc}" =~ ^[0-9a-f]{8}$ ]] \
  && pass "undisturbed run: 3 ranks end with parameters ${ref_crc}, test loss ${ref_loss}" \
  || fail "reference rc=${rc} last='${ref_last}' trace='${ref}' err=$(tail -3 "${TMP}/ref.err")"

# --- the same job; rank 1 is killed while every rank waits before its first
# collective
gate="${TMP}/gate"
CHORUS_TEST_SETUP_GATE="${gate}" CHORUS_SAMPLE_TRACE="${TMP}/trace" \
  timeout "$(slack_seconds 150)" "${CHORUS}" up --local 3 --state_dir "${TMP}/early" \
  "${TMP}/job.textproto" --json >"${TMP}/up.out" 2>"${TMP}/up.err" &
up_pid=$!
track_pid "${up_pid}"
log="${TMP}/early/worker.log"
waiting() { grep -c "waits for ${gate} before its first collective" "${log}" 2>/dev/null; }
wait_for '[[ "$(waiting)" -ge 3 ]]' 60 \
  || fail "the ranks did not all reach the gate: $(waiting) did; up: $(tail -3 "${TMP}/up.err")"
victim=$(sed -n 's/.*rank 1 (pid \([0-9]*\)) waits for .*/\1/p' "${log}" | head -n 1)
if [[ "${victim}" =~ ^[0-9]+$ ]] && kill -KILL "${victim}"; then
  pass "killed rank 1 (pid ${victim}) before any rank trained a step"
else
  fail "no rank 1 to kill (victim '${victim}'); log: $(tail -5 "${log}")"
fi
# Both survivors hear of generation 2 (RE_RENDEZVOUS) while they wait: their
# first collective then fails at once.
heard() { grep -c "the coordinator formed generation 2" "${log}" 2>/dev/null; }
wait_for '[[ "$(heard)" -ge 2 ]]' 30 \
  || fail "the survivors did not hear of generation 2: $(heard); log: $(tail -5 "${log}")"
touch "${gate}"
wait_exit "${up_pid}" 120 || fail "chorus up still running $(slack_seconds 120) s after the kill"
wait "${up_pid}"; rc=$?
last=$(tail -n 1 "${TMP}/up.out")
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED && "$(field "${last}" final_metrics.steps)" == 64 \
   && "$(field "${last}" final_metrics.test_loss)" == "${ref_loss}" ]] \
  && pass "the job succeeded after 64 steps with the undisturbed run's test loss ${ref_loss}" \
  || fail "run rc=${rc} last='${last}' (undisturbed test loss ${ref_loss}) err=$(tail -5 "${TMP}/up.err")"
grep -q "generation 2 starts over from the job's initial model (training.seed " "${log}" \
  && pass "rank 0 says that generation 2 starts over from the seeded initial model, and why" \
  || fail "no start-over line from rank 0: $(grep -E 'generation 2' "${log}" | tail -5)"

trace=$(check_sample_trace "${TMP}/trace" 3 1536)
states=$(awk '$1 == "state" && $3 == 2 && $5 == -1 && $6 == 0 && $7 == -1' <<<"${trace}")
finals=$(grep '^final' <<<"${trace}")
crcs=$(awk '{print $6}' <<<"${finals}" | sort -u)
[[ "${trace}" != *error* && "${trace}" == *"epochs 2 steps 64"* && $(wc -l <<<"${states}") -eq 3 ]] \
  && pass "all 3 members of generation 2 started over at step 0; every sample trained once an epoch" \
  || fail "sample trace: ${trace}"
[[ $(wc -l <<<"${finals}") -eq 3 && "${finals}" != *"final ${victim} "* && "${crcs}" == "${ref_crc}" ]] \
  && pass "all 3 ranks end with the undisturbed run's parameters (${crcs}), bit for bit" \
  || fail "final lines '${finals}', undisturbed ${ref_crc}"

# --- what the coordinator recorded: one restart, one generation change
if start_coordinator -s "${TMP}/early/state"; then
  out=$(timeout "$(slack_seconds 20)" "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" \
    status job-000001 2>&1)
  [[ "${out}" == *"generation 2, world size 3, restarts 1 of elastic.max_restarts 3"* ]] \
    && pass "status: generation 2, restarts 1: the kill cost one restart" || fail "status: ${out}"
  out=$(timeout "$(slack_seconds 20)" "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" \
    watch job-000001 2>&1)
  [[ "${out}" == *"generation 2 after rank 1 ("*"pid ${victim}) was killed by signal 9"*"restart 1 of 3"* \
     && "${out}" != *"generation 3"* ]] \
    && pass "watch: one generation change, after the kill" || fail "watch: ${out}"
else
  fail "no coordinator on the job's state"
fi
kill "${COORDINATOR_PID}" 2>/dev/null; wait "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "an elastic job that lost a rank before its first step"
finish
