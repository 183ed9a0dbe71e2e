#!/usr/bin/env bash
# End to end: what a user sees when a job is too big for any machine, or a
# rank fails inside LibTorch. Sizes no machine could hold are refused before
# anything starts, naming the field and the estimate; an exception inside a
# rank ends it with one line (cause and where) that becomes the job's reason,
# never a stack trace; `chorus status` of the ended job says what happened.
#
# Usage (from Bazel): rank_failure_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }

# --- validate refuses an input no machine could hold, naming the field
printf 'model { mlp {} }\ndata { synthetic { input_shape: [100000, 100000] } }\n' > "${TMP}/wide.textproto"
out=$("${CHORUS}" validate "${TMP}/wide.textproto" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"data.synthetic.input_shape: a rank needs about 237.6 TB ("*"data 196.6 TB"*"more than the 70.4 TB any one machine holds"* ]] \
  && pass "validate refuses [100000, 100000]" || fail "validate wide rc=${rc} out='${out}'"

# --- a hidden layer bigger than this machine: validate notes it, up refuses it
printf 'model { mlp { hidden_sizes: [2000000000] } }\ndata { synthetic {} }\n' > "${TMP}/deep.textproto"
out=$("${CHORUS}" validate "${TMP}/deep.textproto" -o none 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"a rank needs about 5.1 TB (runtime 180.0 MB, parameters 344.0 GB"* \
   && "${out}" == *"note: model.mlp.hidden_sizes: that is more than this machine's"* ]] \
  && pass "validate notes the estimate" || fail "validate deep rc=${rc} out='${out}'"
out=$(timeout 60 "${CHORUS}" up --local 1 --state_dir "${TMP}/deep" "${TMP}/deep.textproto" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"model.mlp.hidden_sizes: a rank needs about 5.1 TB"*"of memory on this machine"* ]] \
  && pass "up refuses a rank this machine cannot hold" || fail "up deep rc=${rc} out='${out}'"
assert_no_leftovers "a refused job"

# --- a rank that fails inside LibTorch: MSE on class labels makes the loss
# reshape [16, 3] outputs to the labels' [16] and LibTorch throws (a
# std::runtime_error from its shape inference; uncaught, it was SIGABRT).
cat > "${TMP}/mse.textproto" <<'SPEC'
model { mlp { hidden_sizes: [8] } }
data { synthetic { num_samples: 256 input_shape: [4] num_classes: 3 } }
loss { kind: MSE }
training { batch_size_per_rank: 16 max_steps: 4 }
SPEC
"${CHORUS}" validate "${TMP}/mse.textproto" >/dev/null 2>&1 && pass "the failing spec validates" \
  || fail "the LibTorch-failure spec does not validate"
out=$(timeout 120 "${CHORUS}" up --local 1 --state_dir "${TMP}/mse" "${TMP}/mse.textproto" --json 2>"${TMP}/mse.err"); rc=$?
last=$(echo "${out}" | tail -n 1)
reason=$(field "${last}" reason)
[[ ${rc} -eq 1 && "$(field "${last}" state)" == FAILED \
   && "${reason}" == *"exited with code 1; last stderr: chorus-rank: rank 0: error (std::runtime_error) in phase FORWARD at step 0: shape '[16]' is invalid for input of size 48"* ]] \
  && pass "the reason is the rank's one line: ${reason}" \
  || fail "LibTorch failure rc=${rc} reason='${reason}' err=$(tail -3 "${TMP}/mse.err")"
[[ "${reason}" != *"signal"* && "${reason}" != *"Exception raised from"* && "${reason}" != *"@ 0x"* ]] \
  && pass "no stack trace in the reason" || fail "stack trace in '${reason}'"
assert_no_leftovers "a rank that failed in LibTorch"

# --- status of the ended job says how it ended and where its rank ran
if start_coordinator -s "${TMP}/mse/state"; then
  out=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status job-000001 2>&1); rc=$?
  [[ ${rc} -eq 0 && "${out}" == *"Ranks: none running - the job ended FAILED at "*" after "*" s with 1 rank"* \
     && "${out}" == *"  reason: rank 0 ("*"error (std::runtime_error) in phase FORWARD"* \
     && "${out}" == *"  rank 0 ran on "*" slot 0"* && "${out}" != *"none yet"* ]] \
    && pass "status of the ended job" || fail "status rc=${rc} out='${out}'"
  # A pending job says what it waits for.
  "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" submit "${TMP}/mse.textproto" >/dev/null 2>&1
  out=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status job-000002 2>&1); rc=$?
  [[ ${rc} -eq 0 && "${out}" == *"Ranks: none yet - waiting for a node agent with CPU slots (none is connected)"* ]] \
    && pass "status of a pending job" || fail "pending status rc=${rc} out='${out}'"
else
  fail "no coordinator started on ${TMP}/mse/state"
fi

finish
