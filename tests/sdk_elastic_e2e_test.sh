#!/usr/bin/env bash
# The SDK's elastic hooks end to end (docs/sdk.md "Elastic programs"): the
# elastic Fashion-MNIST loop (examples/programs/elastic_loop.cc) as a 2-rank
# `program` job with an elastic block and a spare slot. The program of rank 1
# is killed with SIGKILL mid-epoch: the job succeeds; rank 0's program keeps
# its process (same PID) and joins generation 2 in it; the newcomer receives
# the newest state from rank 0 over the new communicator; both end with the
# same parameters, bit for bit those of an undisturbed run (2 ranks: every
# all-reduce adds the same two numbers, and the replacement trains the lost
# rank's shard). Then a rank frozen with SIGSTOP is evicted
# (hang_detection.action RESTART) and replaced the same way.
#
# Usage (from Bazel): sdk_elastic_e2e_test.sh CHORUS ELASTIC_LOOP
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
LOOP=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }

if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  fail "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist, deploy/setup.sh)"
  finish
fi

# One epoch (468 steps at 2 x 64), 5 ms pause a step so that the test can act mid-epoch.
spec() {  # $1 = the spec's name
  cat <<SPEC
name: "$1"
program { argv: ["${LOOP}", "--epochs=1", "--step_sleep_ms=5"] }
resources { min_ranks: 2 max_ranks: 2 threads_per_rank: 1 }
elastic { max_restarts: 2 wait_seconds: 60 }
hang_detection { action: RESTART dead_after_seconds: 4 stall_after_seconds: 3 }
SPEC
}
# The job's output lines in `chorus up`'s state dir $1 that start with $2.
lines() { grep -h -o "$2.*" "$1/worker.log" 2>/dev/null; }
digest_of() { grep -o "params_digest [0-9a-f]*" | cut -d' ' -f2 | sort -u; }

# --- undisturbed reference run
spec reference > "${TMP}/ref.textproto"
out=$(timeout 120 "${CHORUS}" up --local 2 --state_dir "${TMP}/ref" "${TMP}/ref.textproto" --json \
  2>"${TMP}/ref.err"); rc=$?
ref_finals=$(lines "${TMP}/ref" "final: rank ")
ref_digest=$(digest_of <<<"${ref_finals}")
[[ ${rc} -eq 0 && "$(field "$(tail -n 1 <<<"${out}")" state)" == SUCCEEDED \
   && $(grep -c . <<<"${ref_finals}") -eq 2 && "${ref_digest}" =~ ^[0-9a-f]{16}$ \
   && "${ref_finals}" == *"step 468 "* ]] \
  && pass "undisturbed run: both ranks end at step 468 with parameters ${ref_digest}" \
  || fail "reference rc=${rc} finals='${ref_finals}' err=$(tail -3 "${TMP}/ref.err")"

# Runs the job with one spare slot, does "$2" to rank 1's program once it is
# past step 150, and checks the outcome. $1 names the case.
disturbed() {
  local name=$1 action=$2 state="${TMP}/$1"
  spec "${name}" > "${TMP}/${name}.textproto"
  timeout 150 "${CHORUS}" up --local 3 --state_dir "${state}" "${TMP}/${name}.textproto" --json \
    >"${TMP}/${name}.out" 2>"${TMP}/${name}.err" &
  local up_pid=$!
  track_pid "${up_pid}"
  wait_for '[[ -n "$(lines "${state}" "progress: rank 1 step 150")" ]]' 90
  local victim survivor
  victim=$(lines "${state}" "joined: rank 1 of 2 generation 1 pid " | head -n 1 | awk '{print $NF}')
  survivor=$(lines "${state}" "joined: rank 0 of 2 generation 1 pid " | head -n 1 | awk '{print $NF}')
  if [[ "${victim}" =~ ^[0-9]+$ ]] && kill "-${action}" "${victim}"; then
    pass "${name}: SIG${action} to rank 1's program (pid ${victim}) at $(lines "${state}" "progress: rank 1 " | tail -n 1)"
  else
    fail "${name}: no rank 1 program to signal ('${victim}'); $(tail -3 "${TMP}/${name}.err")"
  fi
  wait_exit "${up_pid}" 120 || fail "${name}: chorus up still running 120 s after the signal"
  wait "${up_pid}"; local rc=$?
  [[ "${action}" == STOP ]] && kill -KILL "${victim}" 2>/dev/null
  local last finals
  last=$(tail -n 1 "${TMP}/${name}.out")
  finals=$(lines "${state}" "final: rank ")
  [[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED ]] \
    && pass "${name}: the job succeeded" || fail "${name}: rc=${rc} '${last}' $(tail -3 "${TMP}/${name}.err")"
  [[ $(grep -c "generation 2 step 468 " <<<"${finals}") -eq 2 ]] \
    && pass "${name}: two ranks of generation 2 finished the epoch at step 468" \
    || fail "${name}: finals '${finals}'"
  local rejoined
  rejoined=$(lines "${state}" "joined: rank 0 of 2 generation 2 pid " | awk '{print $NF}')
  [[ -n "${survivor}" && "${rejoined}" == "${survivor}" ]] \
    && pass "${name}: rank 0 joined generation 2 in its own process (pid ${survivor})" \
    || fail "${name}: rank 0 rejoined as pid '${rejoined}' (was pid ${survivor})"
  local newcomer
  newcomer=$(lines "${state}" "state: rank 1 generation 2 held -1 now step ")
  [[ "${newcomer}" =~ now\ step\ ([0-9]+)\ from\ rank\ 0 && ${BASH_REMATCH[1]} -ge 150 ]] \
    && pass "${name}: the newcomer took the newest state from rank 0: ${newcomer}" \
    || fail "${name}: newcomer state '${newcomer}'"
  local d
  d=$(digest_of <<<"${finals}")
  [[ -n "${d}" && "${d}" == "${ref_digest}" ]] \
    && pass "${name}: both ranks end bit for bit with the undisturbed run's parameters (${d})" \
    || fail "${name}: digests '${d}' vs undisturbed '${ref_digest}'"
}

disturbed killed KILL
disturbed frozen STOP

assert_no_leftovers "elastic SDK programs"
finish
