#!/usr/bin/env bash
# The Python package end to end (docs/python.md): examples/programs/python_ddp.py
# as `program` jobs through `chorus up --local 2`, with the package built
# here (python/install.sh --prefix). DDP on the `chorus` backend ends with the
# parameters DDP on PyTorch's `gloo` backend ends with; the script's steps
# reach Chorus; a rank that leaves out an all_reduce its peer entered is
# named NEVER_JOINED with the collective; a rank frozen with SIGSTOP is DEAD;
# a Python checkpoint is listed, exported (torch.load reads it back into the
# script's structure) and resumed bit for bit; a rank whose last heartbeats
# say it waits inside a collective after the other finished, then exits 0,
# leaves the job SUCCEEDED with no diagnosis recorded.
#
# Usage (from Bazel): python_e2e_test.sh CHORUS COORDINATOR INSTALL_SH NATIVE_SO SCRIPT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
COORDINATOR=$(realpath "$2")
INSTALL=$(realpath "$3")
NATIVE=$(realpath "$4")
SCRIPT=$(realpath "$5")
PYTHON=/usr/bin/python3
STATE="${TMP}/state"
up() { timeout 150 "${CHORUS}" up --local 2 --state_dir "${STATE}" "$@" --json 2>>"${TMP}/up.err" | tail -n 1; }
field() { json_get - "$2" <<<"$1"; }
lines() { grep "$1" "${STATE}/worker.log" | grep -o "$2.*"; }

if out=$(install_python_package "${INSTALL}" "${NATIVE}" "${TMP}/site"); then
  pass "python/install.sh: ${out}"
else
  fail "install.sh: ${out}"; finish
fi

spec() {  # $1 = name, $2 = the script's arguments (a textproto list tail), $3 = extra fields
  printf 'name: "%s"\nprogram { argv: ["%s", "%s"%s] env { key: "PYTHONPATH" value: "%s" } }\nresources { min_ranks: 2 max_ranks: 2 threads_per_rank: 1 }\n%s\n' \
    "$1" "${PYTHON}" "${SCRIPT}" "$2" "${TMP}/site" "${3:-}"
}

# --- job-000001 on gloo, job-000002 on chorus: the same 40 DDP steps
spec gloo ', "--backend=gloo", "--steps=40", "--save_params='"${TMP}"'/gloo"' > "${TMP}/gloo.textproto"
spec chorus ', "--steps=40", "--save_params='"${TMP}"'/chorus"' > "${TMP}/chorus.textproto"
last=$(up "${TMP}/gloo.textproto")
[[ "$(field "${last}" state)" == SUCCEEDED ]] && pass "DDP on gloo ran" || fail "gloo: '${last}' $(tail -5 "${STATE}/worker.log")"
last=$(up "${TMP}/chorus.textproto")
[[ "$(field "${last}" state)" == SUCCEEDED ]] && pass "DDP on chorus ran" || fail "chorus: '${last}' $(tail -5 "${STATE}/worker.log")"
[[ "$(field "${last}" final_metrics.steps)" == 40 ]] \
  && pass "the script's step reached Chorus (final_metrics.steps 40)" || fail "steps: '${last}'"
diff=$("${PYTHON}" - "${TMP}" <<'PY'
import sys, torch
tmp = sys.argv[1]
worst = 0.0
for r in (0, 1):
    a, b = torch.load(f"{tmp}/gloo.{r}"), torch.load(f"{tmp}/chorus.{r}")
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    worst = max([worst] + [(a[k] - b[k]).abs().max().item() for k in a])
print(worst)
PY
)
"${PYTHON}" -c "import sys; sys.exit(not float('${diff:-1}') <= 1e-6)" \
  && pass "DDP on chorus ends within ${diff} (<= 1e-6) of DDP on gloo on both ranks" \
  || fail "parameters differ by '${diff}'"

# --- job-000003: rank 1 leaves out the all_reduce of step 10 and waits in
# phase DATA; rank 0 waits in it. Named within stall_after_seconds.
spec skip ', "--steps=1000", "--skip_rank=1", "--skip_at_step=10", "--skip_seconds=60"' \
  'hang_detection { action: ABORT stall_after_seconds: 2 }' > "${TMP}/skip.textproto"
t0=$(date +%s)
last=$(up "${TMP}/skip.textproto")
t1=$(date +%s)
reason=$(field "${last}" reason)
if [[ "$(field "${last}" state)" == FAILED && "${reason}" == *"NEVER_JOINED rank 1 has not entered collective"* \
      && "${reason}" == *"torch:all_reduce"* ]]; then
  pass "the rank that skipped an all_reduce is named with it: ${reason}"
else
  fail "skip: '${last}'"
fi
(( t1 - t0 < 40 )) && pass "diagnosed and aborted after $((t1 - t0)) s, before the 60 s wait ended" \
  || fail "the skipping job took $((t1 - t0)) s"

# --- job-000004: rank 1 stops itself with SIGSTOP at step 10: DEAD. Rank 0
# then waits for it in an all_reduce, so the stall threshold is set well
# above the dead one: with both at 3 s a loaded machine may report the same
# rank NEVER_JOINED first.
spec freeze ', "--steps=1000", "--freeze_rank=1", "--freeze_at_step=10"' \
  'hang_detection { action: ABORT dead_after_seconds: 3 stall_after_seconds: 30 }' > "${TMP}/freeze.textproto"
last=$(up "${TMP}/freeze.textproto")
reason=$(field "${last}" reason)
[[ "$(field "${last}" state)" == FAILED && "${reason}" == *"DEAD rank 1"* && "${reason}" != *"rank 0"* ]] \
  && pass "a frozen Python rank is DEAD: ${reason}" || fail "freeze: '${last}'"

# --- job-000005 checkpoints at steps 20 and 40; job-000006 resumes from 20.
spec ckpt ', "--steps=40", "--checkpoint_every=20"' 'checkpoint { keep_last: 0 }' > "${TMP}/ckpt.textproto"
last=$(up "${TMP}/ckpt.textproto")
saved=$(lines job-000005 "checkpoint: saved step 20 " | grep -o "digest [0-9a-f]*")
full=$(lines job-000005 "final: rank 0 " | grep -o "params_digest [0-9a-f]*")
[[ "$(field "${last}" state)" == SUCCEEDED && -n "${saved}" && -n "${full}" ]] \
  && pass "checkpointed at step 20 (${saved})" || fail "checkpointing run: '${last}'"
last=$(up --resume_from job-000005:20 "${TMP}/ckpt.textproto")
restored0=$(lines job-000006 "checkpoint: rank 0 restored step 20 " | grep -o "digest [0-9a-f]*")
restored1=$(lines job-000006 "checkpoint: rank 1 restored step 20 " | grep -o "digest [0-9a-f]*")
resumed=$(lines job-000006 "final: rank 0 " | grep -o "params_digest [0-9a-f]*")
[[ "$(field "${last}" state)" == SUCCEEDED && "${restored0}" == "${saved}" && "${restored1}" == "${saved}" ]] \
  && pass "both ranks loaded step 20 bit for bit (${restored0})" \
  || fail "restore: '${last}' saved '${saved}' restored '${restored0}' '${restored1}'"
[[ -n "${resumed}" && "${resumed}" == "${full}" ]] \
  && pass "the resumed run ends bit-identical to the uninterrupted one (${resumed})" \
  || fail "resumed '${resumed}' vs uninterrupted '${full}'"
# --- job-000007: after the 20 steps rank 1 says it finished and rank 0
# posts an all_reduce rank 1 never joins; both stay up 6 s, rank 0's
# heartbeats saying it waits inside it past stall_after_seconds (2), then
# exit 0. Note [Diagnoses during shutdown]: the job is shutting down,
# nothing is aborted, and it SUCCEEDS.
spec linger ', "--steps=20", "--linger_rank=0", "--linger_seconds=6"' \
  'hang_detection { action: ABORT stall_after_seconds: 2 }' > "${TMP}/linger.textproto"
t0=${SECONDS}
last=$(up "${TMP}/linger.textproto")
took=$((SECONDS - t0))
lingered=$(lines job-000007 "linger: rank 0 waits")
if [[ "$(field "${last}" state)" == SUCCEEDED && -n "${lingered}" ]] && (( took >= 6 )); then
  pass "a rank inside a collective for 6 s after the others finished exits 0 and the job SUCCEEDS (${took} s)"
else
  fail "linger: '${last}', '${lingered}', ${took} s; $(tail -5 "${STATE}/worker.log")"
fi

# Listed and exported by a coordinator on the same state.
start_coordinator -s "${STATE}/state" || fail "no coordinator on ${STATE}/state"
listed=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" checkpoints job-000005 2>&1)
grep -qw 20 <<<"${listed}" && grep -qw 40 <<<"${listed}" \
  && pass "chorus checkpoints lists steps 20 and 40" || fail "checkpoints: ${listed}"
if "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" export job-000005 --step 20 -o "${TMP}/ckpt20.pt" \
    2>"${TMP}/export.err"; then
  got=$(PYTHONPATH="${TMP}/site" "${PYTHON}" - "${TMP}/ckpt20.pt" <<'PY'
import sys, torch, chorus
state = chorus.state_from_checkpoint(torch.load(sys.argv[1]))
momentum = state["optimizer"]["state"][0]["momentum_buffer"]
print(sorted(state), tuple(state["model"]["0.weight"].shape), tuple(momentum.shape),
      state["optimizer"]["param_groups"][0]["lr"])
PY
)
  [[ "${got}" == "['model', 'optimizer'] (64, 32) (64, 32) 0.05" ]] \
    && pass "the exported file loads back into the script's structure: ${got}" || fail "export read '${got}'"
else
  fail "export: $(cat "${TMP}/export.err")"
fi

# The lingering job's history: no diagnosis was recorded against it.
events=$(timeout 20 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" watch job-000007 2>&1)
if grep -q "SUCCEEDED" <<<"${events}" \
    && ! grep -qE "STUCK_IN_COLLECTIVE|NEVER_JOINED|MISMATCH|DEAD|STRAGGLER" <<<"${events}"; then
  pass "no hang diagnosis in the lingering job's events"
else
  fail "the lingering job's events: ${events}"
fi

kill -TERM "${COORDINATOR_PID}"; wait "${COORDINATOR_PID}" 2>/dev/null

assert_no_leftovers "Python programs"
finish
