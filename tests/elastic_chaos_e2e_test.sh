#!/usr/bin/env bash
# End to end, issue 23 test 4 (chaos, DDP): while a 4-rank elastic job runs
# on an agent with 2 spare slots, a random rank is killed with SIGKILL every
# 3 to 5 seconds for about 40 s. Each loss is replaced by a newcomer that
# takes the lost rank's number and receives the state by broadcast, so the
# job trains exactly the batches an undisturbed run trains: it succeeds, no
# rank hangs, its test accuracy is within 0.5 point of the undisturbed run's
# (here: equal, as the final parameters are bit for bit the same).
#
# Usage (from Bazel): elastic_chaos_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")
field() { json_get - "$2" <<<"$1"; }
export CHORUS_GLOO_SHM=1

spec() {  # $1 = extra fields
  cat <<SPEC
name: "chaos"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 4096 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 8 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 4 max_ranks: 4 }
elastic { max_restarts: 20 wait_seconds: 60 }
$1
SPEC
}
final_crc() {
  python3 - "$1" <<'PY'
import glob, os, sys
crcs = set()
for path in glob.glob(os.path.join(sys.argv[1], "*.trace")):
    for line in open(path):
        f = line.split()
        if f[0] == "final":  # final GEN RANK STEP CRC
            crcs.add(f[4])
print(" ".join(sorted(crcs)))
PY
}

# --- undisturbed
mkdir -p "${TMP}/ref_trace" "${TMP}/trace"
spec "" > "${TMP}/ref.textproto"
out=$(CHORUS_SAMPLE_TRACE="${TMP}/ref_trace" timeout 60 "${CHORUS}" up --local 4 \
  --state_dir "${TMP}/ref" "${TMP}/ref.textproto" --json 2>"${TMP}/ref.err"); rc=$?
ref_accuracy=$(field "$(tail -n 1 <<<"${out}")" final_metrics.test_accuracy)
ref_crc=$(final_crc "${TMP}/ref_trace")
[[ ${rc} -eq 0 && "${ref_crc}" =~ ^[0-9a-f]{8}$ ]] \
  && pass "undisturbed: accuracy ${ref_accuracy}, parameters ${ref_crc}" \
  || fail "reference rc=${rc} out='${out}' err=$(tail -3 "${TMP}/ref.err")"

# --- the same job under chaos. Rank 0 sleeps 40 ms a step in every
# generation, so the job outlasts the 40 s of kills on a busy machine.
slow=""
for gen in $(seq 1 21); do
  slow+="faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.04 generation: ${gen} } "
done
spec "fault_injection { ${slow} }" > "${TMP}/chaos.textproto"
CHORUS_SAMPLE_TRACE="${TMP}/trace" timeout 110 "${CHORUS}" up --local 6 \
  --state_dir "${TMP}/chaos" "${TMP}/chaos.textproto" --json >"${TMP}/up.out" 2>"${TMP}/up.err" &
up_pid=$!
track_pid "${up_pid}"
wait_for '[[ -n "$(grep -l "^step 1 3 1[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 60 \
  || fail "the job never reached step 10"
# Live rank processes: trace files whose pid runs and has no final line.
live_ranks() {
  local f pid
  for f in "${TMP}"/trace/*.trace; do
    pid=$(basename "${f}" .trace)
    kill -0 "${pid}" 2>/dev/null && ! grep -q '^final' "${f}" && echo "${pid}"
  done
}
kills=0
start=${SECONDS}
RANDOM=23
for _ in $(seq 1 15); do  # bounded: at most 15 kills, at most ~40 s
  (( SECONDS - start < 40 )) || break
  kill -0 "${up_pid}" 2>/dev/null || break
  grep -q '^final' "${TMP}"/trace/*.trace 2>/dev/null && break  # the job is ending
  mapfile -t live < <(live_ranks)
  if (( ${#live[@]} > 0 )); then
    victim=${live[$((RANDOM % ${#live[@]}))]}
    kill -KILL "${victim}" 2>/dev/null && kills=$((kills + 1))
  fi
  sleep $((3 + RANDOM % 3))
done
(( kills >= 6 )) && pass "${kills} ranks killed over $((SECONDS - start)) s" \
  || fail "only ${kills} kills landed (the job ended after $((SECONDS - start)) s?)"
wait_exit "${up_pid}" 100 || fail "chorus up still running 100 s after the chaos (a hang)"
wait "${up_pid}"; rc=$?
last=$(tail -n 1 "${TMP}/up.out")
accuracy=$(field "${last}" final_metrics.test_accuracy)
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED ]] \
  && awk -v a="${accuracy}" -v b="${ref_accuracy}" 'BEGIN { d = a - b; exit !(d <= 0.005 && d >= -0.005) }' \
  && pass "the job succeeded, test accuracy ${accuracy} (undisturbed ${ref_accuracy})" \
  || fail "chaos run rc=${rc} last='${last}' err=$(tail -5 "${TMP}/up.err")"
crc=$(final_crc "${TMP}/trace")
[[ "${crc}" =~ ^[0-9a-f]{8}$ && "${crc}" == "${ref_crc}" ]] && pass "all ranks end with the undisturbed run's parameters (${crc})" \
  || fail "final parameters ${crc}, undisturbed ${ref_crc}"
assert_no_leftovers "a job under chaos"
finish
