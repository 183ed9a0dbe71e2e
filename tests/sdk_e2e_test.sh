#!/usr/bin/env bash
# The C++ SDK end to end: programs of one's own (examples/programs) run as
# `program` jobs through `chorus up --local 2`. The Fashion-MNIST loop
# reaches the built-in MLP's accuracy; the actor-critic program's replicas
# end with identical parameters while their replay buffers differ; a rank
# that stays out of a collective its peer entered is diagnosed NEVER_JOINED
# by name (its progress reaches the hang detector through the SDK); the
# loop's named tensors are checkpointed and resumed bit for bit.
#
# Usage (from Bazel): sdk_e2e_test.sh CHORUS FASHION_MNIST_LOOP ACTOR_CRITIC
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
LOOP=$(realpath "$2")
ACTOR_CRITIC=$(realpath "$3")
STATE="${TMP}/state"
# `chorus up --json` ends with one JSON line; these read it.
field() { json_get - "$2" <<<"$1"; }
up() { timeout 150 "${CHORUS}" up --local 2 --state_dir "${STATE}" "$@" --json 2>>"${TMP}/up.err" | tail -n 1; }
# The job's output lines that start with $2 (as the agent logged them).
lines() { grep "$1" "${STATE}/worker.log" | grep -o "$2.*"; }

spec() {  # $1 = name, $2 = argv (a textproto list), $3 = extra fields
  printf 'name: "%s"\nprogram { argv: [%s] }\nresources { min_ranks: 2 max_ranks: 2 threads_per_rank: 1 }\n%s\n' \
    "$1" "$2" "${3:-}"
}

if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  fail "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist, deploy/setup.sh)"
  finish
fi

# --- job-000001: the Fashion-MNIST loop, the built-in MLP recipe, 5 epochs
spec fashion "\"${LOOP}\", \"--epochs=5\"" > "${TMP}/fashion.textproto"
t0=$(date +%s)
last=$(up "${TMP}/fashion.textproto")
t1=$(date +%s)
acc=$(lines job-000001 "final: rank 0 " | grep -o "test_accuracy [0-9.]*" | cut -d' ' -f2)
if [[ "$(field "${last}" state)" == SUCCEEDED ]] && python3 -c "import sys; sys.exit(not float('${acc:-0}') >= 0.88)"; then
  pass "the Fashion-MNIST loop reached test accuracy ${acc} (>= 0.88) in $((t1 - t0)) s"
else
  fail "fashion loop: '${last}' accuracy '${acc}' $(tail -3 "${TMP}/up.err")"
fi
# Both replicas end with the same parameters.
d0=$(lines job-000001 "final: rank 0 " | grep -o "params_digest [0-9a-f]*")
d1=$(lines job-000001 "final: rank 1 " | grep -o "params_digest [0-9a-f]*")
[[ -n "${d0}" && "${d0}" == "${d1}" ]] && pass "both ranks end with ${d0}" || fail "digests '${d0}' '${d1}'"

# --- job-000002: actor-critic, DDP on the update networks only
spec actor-critic "\"${ACTOR_CRITIC}\", \"--updates=200\", \"--aux_ranks=0\"" > "${TMP}/ac.textproto"
last=$(up "${TMP}/ac.textproto")
r0=$(lines job-000002 "digest: rank 0 ")
r1=$(lines job-000002 "digest: rank 1 ")
p0=$(grep -o "params [0-9a-f]*" <<<"${r0}"); p1=$(grep -o "params [0-9a-f]*" <<<"${r1}")
b0=$(grep -o "replay [0-9a-f]*" <<<"${r0}"); b1=$(grep -o "replay [0-9a-f]*" <<<"${r1}")
if [[ "$(field "${last}" state)" == SUCCEEDED && -n "${p0}" && "${p0}" == "${p1}" && -n "${b0}" && -n "${b1}" && "${b0}" != "${b1}" ]]; then
  pass "actor-critic replicas: identical parameters (${p0}), different replay buffers (${b0} / ${b1})"
else
  fail "actor-critic: '${last}' rank 0 '${r0}' rank 1 '${r1}'"
fi
[[ "${r0}" == *"updates 193"* && "${r1}" == *"updates 193"* ]] \
  && pass "both ranks counted their own 193 updates (the first 7 fill the buffer)" || fail "update counts: '${r0}' '${r1}'"

# --- job-000003: rank 1 stays in its environment while rank 0 waits in the
# update's all-reduce: the hang detector names rank 1 and ABORT fails the job.
spec stall "\"${ACTOR_CRITIC}\", \"--updates=1000\", \"--stall_rank=1\", \"--stall_at_update=20\", \"--stall_seconds=60\"" \
  'hang_detection { action: ABORT stall_after_seconds: 2 }' > "${TMP}/stall.textproto"
t0=$(date +%s)
last=$(up "${TMP}/stall.textproto")
t1=$(date +%s)
reason=$(field "${last}" reason)
[[ "$(field "${last}" state)" == FAILED && "${reason}" == *"NEVER_JOINED rank 1 has not entered collective"* ]] \
  && pass "a rank that skips a collective is named: ${reason}" || fail "stall: '${last}'"
(( t1 - t0 < 50 )) && pass "diagnosed and aborted after $((t1 - t0)) s, before the stall ended" \
  || fail "the stalled job took $((t1 - t0)) s"

# --- job-000004 checkpoints the loop's parameters and momentum at step 30;
# job-000005 resumes from it and ends bit-identical to job-000004.
spec ckpt "\"${LOOP}\", \"--max_steps=60\", \"--checkpoint_every=30\"" 'checkpoint { keep_last: 0 }' \
  > "${TMP}/ckpt.textproto"
last=$(up "${TMP}/ckpt.textproto")
saved=$(lines job-000004 "checkpoint: saved step 30 " | grep -o "digest [0-9a-f]*")
full=$(lines job-000004 "final: rank 0 " | grep -o "params_digest [0-9a-f]*")
[[ "$(field "${last}" state)" == SUCCEEDED && -n "${saved}" && -n "${full}" ]] \
  && pass "checkpointed at step 30 (${saved})" || fail "checkpointing run: '${last}' saved '${saved}'"
last=$(up --resume_from job-000004:30 "${TMP}/ckpt.textproto")
restored0=$(lines job-000005 "checkpoint: rank 0 restored step 30 " | grep -o "digest [0-9a-f]*")
restored1=$(lines job-000005 "checkpoint: rank 1 restored step 30 " | grep -o "digest [0-9a-f]*")
resumed=$(lines job-000005 "final: rank 0 " | grep -o "params_digest [0-9a-f]*")
[[ "$(field "${last}" state)" == SUCCEEDED && "${restored0}" == "${saved}" && "${restored1}" == "${saved}" ]] \
  && pass "both ranks restored step 30 bit for bit (${restored0})" \
  || fail "restore: '${last}' saved '${saved}' restored '${restored0}' '${restored1}'"
[[ -n "${resumed}" && "${resumed}" == "${full}" ]] \
  && pass "the resumed run ends bit-identical to the uninterrupted one (${resumed})" \
  || fail "resumed '${resumed}' vs uninterrupted '${full}'"

assert_no_leftovers "SDK programs"
finish
