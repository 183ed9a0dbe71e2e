#!/usr/bin/env bash
# Point-to-point exchanges on the `chorus` backend end to end (docs/python.md):
# examples/programs/python_p2p.py as `program` jobs through `chorus up
# --local N`. An isend/irecv ring on 2 and 3 ranks (send first, receive
# first, batch_isend_irecv) completes with the right values, where it hung;
# a 1F1B pipeline of 4 stages on isend/irecv ends with the parameters a
# single process computes from the same micro-batches; hang detection with
# action ABORT leaves all of them alone (sends and receives are no MISMATCH:
# Note [Pairing ranks' ops] in coordinator/hang/hang_detector.h) and names the
# rank that never posts a receive another rank's send waits for; a
# mixture-of-experts layer on all_to_all_single with uneven splits gives
# each token the output one process computes.
#
# Usage (from Bazel): python_p2p_e2e_test.sh CHORUS INSTALL_SH NATIVE_SO SCRIPT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
INSTALL=$(realpath "$2")
NATIVE=$(realpath "$3")
SCRIPT=$(realpath "$4")
PYTHON=/usr/bin/python3
STATE="${TMP}/state"
up() {  # $1 = ranks, $2 = spec
  timeout "$(slack_seconds 240)" "${CHORUS}" up --local "$1" --state_dir "${STATE}" "$2" --json \
    2>>"${TMP}/up.err" | tail -n 1
}
field() { json_get - "$2" <<<"$1"; }
lines() { grep "$1" "${STATE}/worker.log" | grep -o "$2.*"; }

if ! out=$(install_python_package "${INSTALL}" "${NATIVE}" "${TMP}/site"); then
  fail "install.sh: ${out}"; finish
fi

spec() {  # $1 = name, $2 = ranks, $3 = the script's arguments (a textproto list tail)
  printf 'name: "%s"\nprogram { argv: ["%s", "%s"%s] env { key: "PYTHONPATH" value: "%s" } }\nresources { min_ranks: %d max_ranks: %d threads_per_rank: 1 }\nhang_detection { action: ABORT stall_after_seconds: 3 }\n' \
    "$1" "${PYTHON}" "${SCRIPT}" "$3" "${TMP}/site" "$2" "$2" > "${TMP}/$1.textproto"
}

# --- job-000001, job-000002: the ring on 2 and 3 ranks.
n=0
for ranks in 2 3; do
  n=$((n + 1))
  job=$(printf 'job-%06d' "${n}")
  spec "ring${ranks}" "${ranks}" ', "--mode=ring"'
  last=$(up "${ranks}" "${TMP}/ring${ranks}.textproto")
  ok=$(lines "${job}" "ring: rank [0-9]* ok: 15 exchanges" | wc -l)
  if [[ "$(field "${last}" state)" == SUCCEEDED && "${ok}" == "${ranks}" ]]; then
    pass "isend/irecv ring on ${ranks} ranks: 15 exchanges each (send first, receive first, batched)"
  else
    fail "ring on ${ranks}: '${last}', ${ok} rank(s) ok; $(tail -5 "${STATE}/worker.log")"
  fi
done

# --- job-000003: 1F1B on 4 stages, 6 micro-batches, 3 steps.
spec pipeline 4 ', "--mode=pipeline"'
last=$(up 4 "${TMP}/pipeline.textproto")
exact=$(grep job-000003 "${STATE}/worker.log" | grep -c "pipeline: rank [0-9] stage max diff 0\.0$")
if [[ "$(field "${last}" state)" == SUCCEEDED && "${exact}" == 4 ]]; then
  pass "a 1F1B pipeline of 4 stages on isend/irecv ends with the single-process parameters exactly"
else
  fail "pipeline: '${last}'; $(lines job-000003 "pipeline: " | tr '\n' ';') $(tail -5 "${STATE}/worker.log")"
fi

# --- job-000004: rank 1 sends but never posts the receive rank 0's send
# waits for: named within stall_after_seconds, before its 60 s sleep ends.
spec stall 2 ', "--mode=ring", "--stall_rank=1", "--stall_seconds=60"'
t0=${SECONDS}
last=$(up 2 "${TMP}/stall.textproto")
took=$((SECONDS - t0))
reason=$(field "${last}" reason)
if [[ "$(field "${last}" state)" == FAILED \
      && "${reason}" == *"NEVER_JOINED rank 1 has not posted the receive matching rank 0's send #1 to it (send/to1 torch:send (float64[1000], 8000 bytes))"* ]]; then
  pass "the rank that never posted the receive is named: ${reason}"
else
  fail "stall: '${last}'"
fi
(( took < 55 )) && pass "diagnosed and aborted in ${took} s, before the 60 s stall ended" \
  || fail "the stalling job took ${took} s"

# --- job-000005: a mixture-of-experts layer on 3 ranks, tokens dispatched to
# their expert and combined back with all_to_all_single, uneven splits.
spec moe 3 ', "--mode=moe"'
last=$(up 3 "${TMP}/moe.textproto")
matched=$(grep job-000005 "${STATE}/worker.log" | grep -c "moe: rank [0-9] max diff [0-9.e-]* (sent")
if [[ "$(field "${last}" state)" == SUCCEEDED && "${matched}" == 3 ]]; then
  pass "a mixture-of-experts layer on all_to_all_single (uneven splits) matches one process on 3 ranks: $(lines job-000005 "moe: rank 0 " | head -1)"
else
  fail "moe: '${last}'; $(lines job-000005 "moe: " | tr '\n' ';') $(tail -5 "${STATE}/worker.log")"
fi

assert_no_leftovers "Python point-to-point programs"
finish
