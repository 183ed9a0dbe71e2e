#!/usr/bin/env bash
# End to end, hang_detection.action RESTART of an elastic job for a diagnosis
# that blames no single rank (issue 23; Note [Hang restart] in
# coordinator/scheduling/hang_restart.h): rank 1 of a 2-rank DDP job issues two
# all-reduces in the other order (fault MISMATCH_COLLECTIVE), so both ranks
# wait in collectives that never match. The coordinator diagnoses MISMATCH and
# starts generation 2 with the same ranks; they hear of it on their
# heartbeats, abort their communicator and re-form in the same processes. The
# job succeeds with restarts 1, and its parameters are bit for bit those of an
# undisturbed run. Then a mismatch that comes back in generation 2 (as one in
# the program's own code would) uses up elastic.max_restarts 1 and fails the
# job with the history.
#
# Usage (from Bazel): elastic_restart_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }
# All-reduces always through shared memory, so that sums add up in the same
# order in every run and generation (as in elastic_e2e_test.sh).
export CHORUS_GLOO_SHM=1

# 2 epochs of 64 steps (2048 samples, 2 ranks x 16).
spec() {  # $1 = extra fields, $2 = the elastic block's fields
  cat <<SPEC
name: "restart"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 2048 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 2 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
elastic { ${2:-max_restarts: 2 wait_seconds: 30} }
hang_detection { action: RESTART }
$1
SPEC
}

# --- undisturbed reference run
mkdir -p "${TMP}/ref_trace" "${TMP}/trace"
spec "" > "${TMP}/ref.textproto"
t0=$(date +%s)
out=$(CHORUS_SAMPLE_TRACE="${TMP}/ref_trace" timeout 60 "${CHORUS}" up --local 2 \
  --state_dir "${TMP}/ref" "${TMP}/ref.textproto" --json 2>"${TMP}/ref.err"); rc=$?
t1=$(date +%s)
ref=$(check_sample_trace "${TMP}/ref_trace" 2 2048)
ref_crc=$(awk '$1 == "final" {print $6}' <<<"${ref}" | sort -u)
[[ ${rc} -eq 0 && "$(field "$(tail -n 1 <<<"${out}")" state)" == SUCCEEDED \
   && $(grep -c '^final' <<<"${ref}") -eq 2 && $(wc -l <<<"${ref_crc}") -eq 1 \
   && "${ref_crc}" =~ ^[0-9a-f]{8}$ && "${ref}" != *error* && "${ref}" == *"epochs 2 steps 128"* ]] \
  && pass "undisturbed run: 2 ranks end with parameters ${ref_crc} ($((t1 - t0)) s)" \
  || fail "reference rc=${rc} trace='${ref}' err=$(tail -3 "${TMP}/ref.err")"

# --- the same job, rank 1 swapping two collectives at step 80 (in epoch 1)
spec "fault_injection { faults { kind: MISMATCH_COLLECTIVE rank: 1 at_step: 80 } }" \
  > "${TMP}/mismatch.textproto"
t0=$(date +%s)
out=$(CHORUS_SAMPLE_TRACE="${TMP}/trace" timeout 60 "${CHORUS}" up --local 2 \
  --state_dir "${TMP}/mismatch" "${TMP}/mismatch.textproto" --json 2>"${TMP}/mismatch.err"); rc=$?
t1=$(date +%s)
last=$(tail -n 1 <<<"${out}")
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED && "$(field "${last}" final_metrics.steps)" == 128 ]] \
  && pass "the job succeeded after 128 steps ($((t1 - t0)) s)" \
  || fail "mismatch run rc=${rc} last='${last}' err=$(tail -5 "${TMP}/mismatch.err")"

trace=$(check_sample_trace "${TMP}/trace" 2 2048)
finals=$(grep '^final' <<<"${trace}")
[[ "${trace}" != *error* && "${trace}" == *"epochs 2 steps 128"* && "${trace}" == *"interrupted 1"* ]] \
  && pass "every sample of both epochs, interrupted epoch 1 included, was trained exactly once" \
  || fail "sample trace: ${trace}"
# One trace file per rank process: both ranks trained generation 1, then
# received step 80 and finished generation 2 in the same process.
pids=$(ls "${TMP}/trace" | sed 's/\.trace$//' | sort | tr '\n' ' ')
kept=0
for pid in ${pids}; do
  rank=$(awk '$1 == "step" && $2 == 1 {print $3; exit}' "${TMP}/trace/${pid}.trace")
  if [[ -n "${rank}" ]] && grep -q "^state ${pid} 2 ${rank} 0 80 80$" <<<"${trace}" \
     && grep -q "^final ${pid} 2 ${rank} 128 " <<<"${finals}"; then
    kept=$((kept + 1))
  else
    fail "rank process ${pid} (rank '${rank}'): $(grep " ${pid} " <<<"${trace}")"
  fi
done
[[ $(wc -w <<<"${pids}") -eq 2 && ${kept} -eq 2 ]] \
  && pass "both rank processes (pids ${pids}) kept their process and step 80 into generation 2" \
  || fail "rank processes: '${pids}', ${kept} kept theirs"
crcs=$(awk '{print $6}' <<<"${finals}" | sort -u)
[[ $(wc -l <<<"${finals}") -eq 2 && $(wc -l <<<"${crcs}") -eq 1 && "${crcs}" == "${ref_crc}" ]] \
  && pass "the parameters are bit for bit those of the undisturbed run (${crcs})" \
  || fail "final parameters '${finals}' differ from the undisturbed run's ${ref_crc}"

# --- what the coordinator recorded
if start_coordinator -s "${TMP}/mismatch/state"; then
  out=$(timeout 20 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" watch job-000001 2>&1)
  recovery=$(grep -o 'generation 2 formed with 2 ranks, [0-9.]* s' <<<"${out}" | awk '{print $7}')
  [[ "${out}" == *"problem MISMATCH ranks 0 and 1 issued different collectives at #"*"rank 0 allreduce/sum fault/first (float32[4], 16 bytes), rank 1 allreduce/sum fault/second (float32[8], 32 bytes)"* \
     && "${out}" == *"state RUNNING: generation 2 after hang_detection.action RESTART for MISMATCH ranks 0,1 at #"*" (every rank re-forms its transport): ranks 0 and 1 issued different collectives at #"*": 2 -> 2 ranks, restart 1 of 2"* \
     && "${out}" == *"generation 2 formed with 2 ranks, "*" s after the failure (recovery_seconds)"* \
     && "${out}" == *"state SUCCEEDED"* ]] \
    && pass "watch shows the diagnosis, the new generation with its cause, and the recovery (${recovery} s)" \
    || fail "watch: ${out}"
  out=$(timeout 20 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status job-000001 2>&1)
  [[ "${out}" == *"generation 2, world size 2, restarts 1 of elastic.max_restarts 2"* ]] \
    && pass "status shows generation 2 and restarts 1" || fail "status: ${out}"
else
  fail "no coordinator on the job's state"
fi
kill "${COORDINATOR_PID}" 2>/dev/null; wait "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "an elastic job re-formed after a MISMATCH"

# --- a mismatch in every generation: elastic.max_restarts 1 is used up
spec "fault_injection { faults { kind: MISMATCH_COLLECTIVE rank: 1 at_step: 10 }
                        faults { kind: MISMATCH_COLLECTIVE rank: 1 at_step: 20 generation: 2 } }" \
  "max_restarts: 1 wait_seconds: 30" > "${TMP}/again.textproto"
t0=$(date +%s)
out=$(timeout 60 "${CHORUS}" up --local 2 --state_dir "${TMP}/again" "${TMP}/again.textproto" \
  --json 2>"${TMP}/again.err"); rc=$?
t1=$(date +%s)
last=$(tail -n 1 <<<"${out}")
reason=$(field "${last}" reason)
[[ ${rc} -eq 1 && "$(field "${last}" state)" == FAILED \
   && "${reason}" == "hang_detection.action RESTART for MISMATCH ranks 0,1 at #"*"; elastic.max_restarts 1 used up in generation 2; history: generation 2 after hang_detection.action RESTART for MISMATCH ranks 0,1 at #"*": 2 -> 2 ranks, restart 1 of 1" ]] \
  && pass "a mismatch that comes back fails the job with the history ($((t1 - t0)) s): ${reason}" \
  || fail "max_restarts run rc=${rc} last='${last}' err=$(tail -3 "${TMP}/again.err")"
assert_no_leftovers "a job whose mismatch came back"

finish
