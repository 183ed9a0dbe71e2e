#!/usr/bin/env bash
# End to end, issue 56: a rank frozen (SIGSTOP) while a generation forms is
# replaced (Note [A survivor that does not join] in
# coordinator/scheduling/hang_restart.h). A 3-rank elastic DDP job runs on 5
# slots. At step 10, rank 1 is stopped and then rank 2 killed: rank 0 joins
# generation 2, rank 1 never hears of it. After dead_after_seconds (3 here)
# of silence rank 1 is evicted, generation 3 forms with newcomers, and the
# job succeeds with two restarts and the undisturbed run's final parameters,
# long before elastic.wait_seconds (120 s) would have failed it.
#
# Usage (from Bazel): elastic_frozen_join_e2e_test.sh CHORUS
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
field() { json_get - "$2" <<<"$1"; }
export CHORUS_GLOO_SHM=1

spec() {  # $1 = extra fields
  cat <<SPEC
name: "frozen-join"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 3072 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 6 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 3 max_ranks: 3 }
elastic { max_restarts: 5 wait_seconds: 120 }
hang_detection { dead_after_seconds: 3 }
$1
SPEC
}
final_crc() {
  cat "$1"/*.trace | awk '$1 == "final" { print $5 }' | sort -u | tr '\n' ' ' | sed 's/ $//'
}
# The pid of rank $2 of generation 1, from the trace files in $1 (one per pid).
rank_pid() {
  local f
  f=$(grep -l "^step 1 $2 " "$1"/*.trace 2>/dev/null | head -n 1)
  [[ -n "${f}" ]] && basename "${f}" .trace
}

# --- undisturbed
mkdir -p "${TMP}/ref_trace" "${TMP}/trace"
spec "" > "${TMP}/ref.textproto"
out=$(CHORUS_SAMPLE_TRACE="${TMP}/ref_trace" timeout $(slack_seconds 60) "${CHORUS}" up --local 3 \
  --state_dir "${TMP}/ref" "${TMP}/ref.textproto" --json 2>"${TMP}/ref.err"); rc=$?
ref_crc=$(final_crc "${TMP}/ref_trace")
[[ ${rc} -eq 0 && "${ref_crc}" =~ ^[0-9a-f]{8}$ ]] \
  && pass "undisturbed: parameters ${ref_crc}" \
  || fail "reference rc=${rc} out='${out}' err=$(tail -3 "${TMP}/ref.err")"

# --- rank 1 frozen, rank 2 killed. Rank 0 sleeps 50 ms a step, so the job
# outlasts the eviction on a busy machine.
slow=""
for gen in 1 2 3; do
  slow+="faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.05 generation: ${gen} } "
done
spec "fault_injection { ${slow} }" > "${TMP}/frozen.textproto"
CHORUS_SAMPLE_TRACE="${TMP}/trace" timeout $(slack_seconds 100) "${CHORUS}" up --local 5 \
  --state_dir "${TMP}/frozen" "${TMP}/frozen.textproto" --json >"${TMP}/up.out" 2>"${TMP}/up.err" &
up_pid=$!
track_pid "${up_pid}"
wait_for '[[ -n "$(grep -l "^step 1 [0-9] 1[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 30 \
  || fail "the job never reached step 10"
frozen=$(rank_pid "${TMP}/trace" 1)
killed=$(rank_pid "${TMP}/trace" 2)
[[ -n "${frozen}" && -n "${killed}" ]] || fail "no pids for ranks 1 and 2 in the traces"
kill -STOP "${frozen}" && kill -KILL "${killed}" \
  && pass "rank 1 (pid ${frozen}) stopped, then rank 2 (pid ${killed}) killed"
start=${SECONDS}
wait_exit "${frozen}" 20 \
  && pass "the frozen rank was stopped by its agent $((SECONDS - start)) s later" \
  || { kill -CONT "${frozen}" 2>/dev/null; fail "the frozen rank still runs $((SECONDS - start)) s later"; }
wait_exit "${up_pid}" 80 || fail "chorus up still running 80 s after the freeze"
wait "${up_pid}"; rc=$?
last=$(tail -n 1 "${TMP}/up.out")
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED ]] \
  && pass "the job succeeded after $((SECONDS - start)) s" \
  || fail "rc=${rc} last='${last}' err=$(tail -5 "${TMP}/up.err")"
logs=("${TMP}/up.err" "${TMP}"/frozen/*.log*)
history=$(grep -ho "generation [0-9] after .*, restart [0-9] of 5" "${logs[@]}" 2>/dev/null \
  | sed 's/:.*, restart/: restart/' | sort -u)
[[ "$(grep -c . <<<"${history}")" == 2 && "${history}" == *"generation 3 after rank 1 "*"was evicted by the forming generation"*"restart 2 of 5"* ]] \
  && pass "two restarts, the kill and the eviction: $(tr '\n' ';' <<<"${history}")" \
  || fail "generations: '${history}'"
evicted=$(grep -h "evicting rank 1 (the forming generation)" "${logs[@]}" 2>/dev/null | head -n 1)
[[ -n "${evicted}" ]] && pass "evicted as a survivor that did not join: ${evicted##*: rank 1 }" \
  || fail "no eviction by the forming generation in the logs"
crc=$(final_crc "${TMP}/trace")
[[ "${crc}" == "${ref_crc}" ]] && pass "all ranks end with the undisturbed run's parameters (${crc})" \
  || fail "final parameters '${crc}', undisturbed ${ref_crc}"
assert_no_leftovers "a job with a frozen survivor"
finish
