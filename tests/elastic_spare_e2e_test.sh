#!/usr/bin/env bash
# End to end, hot spares (docs/elastic.md "Hot spares"; Note [Hot spares] in
# sdk/decentralized_data_parallel.h): an elastic gossip job
# over one_peer_exponential, which serves powers of two, runs on 3 slots.
# Ranks 0 and 1 train; rank 2 is a hot spare that trains on nothing. Rank 1
# kills itself at step 150. The spare takes its place in generation 2 in the
# same process (it is numbered 1 and trains), the newcomer on the freed slot
# becomes the spare, every sample of each epoch is still trained exactly once
# by the two training ranks, and all three ranks end with the same model.
#
# Usage (from Bazel): elastic_spare_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }

# 3 epochs of 128 steps for the two training ranks (4096 samples, 2 x 16).
cat > "${TMP}/spare.textproto" <<SPEC
name: "spare"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 4096 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 3 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 3 }
elastic { max_restarts: 2 wait_seconds: 60 }
strategy { decentralized { topology: ONE_PEER_EXPONENTIAL } }
fault_injection { faults { kind: CRASH rank: 1 at_step: 150 } }
SPEC
mkdir -p "${TMP}/trace"
out=$(CHORUS_SAMPLE_TRACE="${TMP}/trace" timeout 100 "${CHORUS}" up --local 3 \
  --state_dir "${TMP}/state" "${TMP}/spare.textproto" --json 2>"${TMP}/up.err"); rc=$?
last=$(tail -n 1 <<<"${out}")
accuracy=$(field "${last}" final_metrics.test_accuracy)
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED && "$(field "${last}" final_metrics.steps)" == 384 ]] \
  && awk -v a="${accuracy}" 'BEGIN { exit !(a >= 0.9) }' \
  && pass "the job succeeded after 384 steps, test accuracy ${accuracy}" \
  || fail "rc=${rc} last='${last}' err=$(tail -5 "${TMP}/up.err")"

# Who was who: the trace file of each process (one per pid).
pid_of() {  # $1 = generation, $2 = rank: the pid whose trace has that final or state line
  grep -l "^\(state\|final\) $1 $2 " "${TMP}"/trace/*.trace 2>/dev/null | head -n 1 | xargs -r basename | sed 's/\.trace$//'
}
# Gossip has no step-wide barrier: rank 0 may complete step 150, whose
# exchange with rank 1 only fails at step 151, and then holds step 151 while
# rank 1's batch of step 150 died with it (16 samples). Nothing else may be
# missing, and no sample may be trained twice.
trace=$(check_sample_trace "${TMP}/trace" 2 4096)
errors=$(grep '^error' <<<"${trace}")
[[ "${trace}" == *"epochs 3 steps 384"* && "${trace}" == *"interrupted 1"* ]] \
  && [[ -z "${errors}" || "${errors}" == "error step 150 generation 1 has ranks [0]
error epoch 1: 4080 samples, 4080 distinct, 0 repeated" ]] \
  && pass "2 ranks trained every sample of each of the 3 epochs once (but for the lost rank's last batch: '${errors//$'\n'/; }')" \
  || fail "sample trace: ${trace}"
spare=$(grep -L "^step 1 " "${TMP}"/trace/*.trace | xargs -r grep -l "^step 2 1 " | xargs -r basename | sed 's/\.trace$//')
[[ "${spare}" =~ ^[0-9]+$ ]] && grep -q "^final ${spare} 2 1 " <<<"${trace}" \
  && pass "the spare (pid ${spare}) trained nothing in generation 1 and trained as rank 1 in generation 2" \
  || fail "no process went from spare to rank 1 ('${spare}'): ${trace}"
newcomer=$(awk '$1 == "final" && $3 == 2 && $4 == 2 {print $2}' <<<"${trace}")
[[ "${newcomer}" =~ ^[0-9]+$ ]] && ! grep -q "^step" "${TMP}/trace/${newcomer}.trace" \
  && pass "the newcomer (pid ${newcomer}) is generation 2's spare and trained nothing" \
  || fail "newcomer '${newcomer}': ${trace}"
finals=$(grep '^final' <<<"${trace}")
crcs=$(awk '{print $6}' <<<"${finals}" | sort -u)
[[ $(wc -l <<<"${finals}") -eq 3 && $(wc -l <<<"${crcs}") -eq 1 ]] \
  && pass "all 3 ranks, the spare included, end with the same model (${crcs})" \
  || fail "final lines: ${finals}"

if start_coordinator -s "${TMP}/state/state"; then
  out=$(timeout 20 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" watch job-000001 2>&1)
  [[ "${out}" == *"generation 2 after rank 1 ("*"was killed by signal 9"*": 3 -> 3 ranks, 2 training and 1 hot spare (rank 2 is now rank 1, rank 2 on "*"restart 1 of 2"* ]] \
    && pass "watch shows the spare taking the lost rank's place; $(grep -o 'generation 2 formed with [^(]*' <<<"${out}")" \
    || fail "watch: ${out}"
else
  fail "no coordinator on the job's state"
fi
kill "${COORDINATOR_PID}" 2>/dev/null; wait "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "a job with a hot spare"
finish
