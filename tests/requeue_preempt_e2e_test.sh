#!/usr/bin/env bash
# End to end, preemption by re-queueing (docs/scheduling.md): a 2-rank LOW
# job on the built-in trainer (an MLP with dropout, deterministic, no
# periodic checkpoints) runs on a 2-slot agent; a 2-rank HIGH job is
# submitted. The LOW job checkpoints at its next step boundary, its ranks
# stop and it goes back to the queue with a reason naming who preempted it;
# the HIGH job runs and succeeds; the LOW job starts again, resuming from
# that checkpoint, and succeeds. Its final parameters (the exported final
# checkpoint) equal, bit for bit, those of the same job run undisturbed
# first; the sample trace shows that the resumed run trained exactly the
# steps from the checkpoint on, and that the first run trained none of
# them: rank 0 took the checkpoint and held (CHECKPOINT_AND_HOLD) until it
# was stopped; rank 1 at most started the next step, waiting in its
# gradient all-reduce without applying it.
#
# Usage (from Bazel): requeue_preempt_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
PYTHON=/usr/bin/python3  # Debian's python3-torch
field() { json_get - "$2" <<<"$1"; }
export CHORUS_GLOO_SHM=1
export CHORUS_SAMPLE_TRACE="${TMP}/trace"
mkdir -p "${CHORUS_SAMPLE_TRACE}"

start_coordinator || { fail "no coordinator"; finish; }
chorus() { timeout 30 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" "$@"; }
state() { field "$(chorus status "$1" --json)" job.state; }
start_agent node-a 2

# 1920 samples, 32 per rank and step on 2 ranks: 30 steps an epoch, 90 in
# all. Rank 0 sleeps 30 ms a step (the other waits for it), which changes
# no value, so that the job is still running when the HIGH one comes.
cat > "${TMP}/low.textproto" <<'SPEC'
name: "low"
priority: LOW
model { mlp { hidden_sizes: [64] dropout: 0.2 } }
data { synthetic { num_samples: 1920 input_shape: [16] num_classes: 4 seed: 3 } }
training { batch_size_per_rank: 32 epochs: 3 seed: 5 log_every_steps: 10 }
optimizer { kind: ADAM lr: 0.003 }
resources { min_ranks: 2 max_ranks: 2 }
checkpoint { keep_last: 0 }
fault_injection { faults { kind: SLOW rank: 0 at_step: 1 duration_seconds: 0.03 } }
SPEC
cat > "${TMP}/high.textproto" <<'SPEC'
name: "urgent"
priority: HIGH
program { argv: ["/bin/bash", "-c", "sleep 2"] }
resources { min_ranks: 2 max_ranks: 2 }
SPEC

# --- the undisturbed run
ref=$(chorus submit "${TMP}/low.textproto" 2>"${TMP}/submit.err")
[[ "${ref}" == job-* ]] || fail "submit: ${ref} $(cat "${TMP}/submit.err")"
wait_for '[[ "$(state "${ref}")" == SUCCEEDED ]]' 60 \
  && pass "the undisturbed run succeeded" || fail "undisturbed run: $(chorus status "${ref}")"
mkdir -p "${TMP}/ref-trace"
mv "${CHORUS_SAMPLE_TRACE}"/*.trace "${TMP}/ref-trace/" 2>/dev/null

# --- the same job, preempted past step 20
low=$(chorus submit "${TMP}/low.textproto" 2>"${TMP}/submit.err")
[[ "${low}" == job-* ]] || fail "submit: ${low} $(cat "${TMP}/submit.err")"
wait_for '[[ -n "$(grep -l "^step 1 1 2[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 60 \
  || fail "the LOW job never reached step 20: $(chorus status "${low}")"
high=$(chorus submit "${TMP}/high.textproto" 2>"${TMP}/submit-high.err")
[[ "${high}" == job-* ]] || fail "submit HIGH: ${high} $(cat "${TMP}/submit-high.err")"
wait_for '[[ "$(state "${high}")" == RUNNING ]]' 30 \
  || fail "the HIGH job never started: $(chorus queue) $(chorus status "${low}")"
listing=$(chorus jobs)
[[ "$(state "${low}")" == PENDING \
   && "${listing}" == *"${low}"*"PENDING"*"preempted by ${high} (HIGH, anonymous); resumes from step "* ]] \
  && pass "the LOW job waits, and chorus jobs says who preempted it" \
  || fail "while the HIGH job runs: $(chorus status "${low}") ${listing}"
wait_for '[[ "$(state "${high}")" == SUCCEEDED ]]' 30 \
  && pass "the HIGH job succeeded" || fail "HIGH job: $(chorus status "${high}")"
wait_for '[[ "$(state "${low}")" == SUCCEEDED ]]' 60 \
  && pass "the LOW job resumed and succeeded" || fail "LOW job: $(chorus status "${low}")"
status=$(chorus status "${low}" --json)
[[ "$(field "${status}" job.preemptions)" == 1 ]] \
  && pass "its status counts one preemption" || fail "status: ${status}"

events=$(chorus watch "${low}" 2>&1)
resumed=$(grep -o "preempted by ${high} (HIGH, anonymous); resumes from step [0-9]*" <<<"${events}" \
  | head -n 1 | grep -o "[0-9]*$")
[[ "${events}" == *"preempted by ${high} (HIGH, anonymous): checkpointing at the next step boundary"* \
   && -n "${resumed}" ]] \
  && pass "watch names who preempted the LOW job; it resumes from step ${resumed}" \
  || fail "watch: ${events}"
events=$(chorus watch "${high}" 2>&1)
[[ "${events}" == *"preempting ${low} (priority LOW): it goes back to the queue to make room for this job"* ]] \
  && pass "the HIGH job's events name the job it preempted" || fail "watch HIGH: ${events}"

# --- bit for bit: the final checkpoints of both runs
chorus export "${ref}" -o "${TMP}/ref.pt" 2>"${TMP}/export.err" \
  && chorus export "${low}" -o "${TMP}/low.pt" 2>>"${TMP}/export.err" \
  || fail "export: $(cat "${TMP}/export.err")"
cmp=$("${PYTHON}" - "${TMP}/ref.pt" "${TMP}/low.pt" <<'PY' 2>&1
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
print("keys", len(a), "differing", sorted(a) != sorted(b) or [k for k in a if not torch.equal(a[k], b[k])])
PY
)
[[ "${cmp}" == *"differing []"* && "${cmp}" != *"keys 0 "* ]] \
  && pass "final parameters bit-identical to the undisturbed run (${cmp})" || fail "comparison: ${cmp}"

# --- the trace: which run trained which step
trace=$(python3 - "${TMP}/trace" "${resumed:-0}" <<'PY'
import collections, glob, os, sys
resumed = int(sys.argv[2])
runs = collections.defaultdict(lambda: collections.defaultdict(set))  # first step -> rank -> steps
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.trace"))):
    steps = [list(map(int, l.split()[1:4])) for l in open(path) if l.startswith("step ")]
    if not steps:
        continue
    first = min(s for _, _, s in steps)
    for _, rank, step in steps:
        runs[first][rank].add(step)
if sorted(runs) != [0, resumed]:
    print("error runs start at steps %s" % sorted(runs))
else:
    first, second = runs[0], runs[resumed]
    for rank in (0, 1):
        if second[rank] != set(range(resumed, 90)):
            print("error rank %d: the resumed run trained %s" % (rank, sorted(second[rank])[:5]))
        if not set(range(resumed)) <= first[rank]:
            print("error rank %d: the first run lacks steps before %d" % (rank, resumed))
    # Rank 0 took the checkpoint and held; rank 1 may have loaded the next
    # step's batch and waits in its gradient all-reduce, applying nothing.
    redone = [len(first[r] - set(range(resumed))) for r in (0, 1)]
    if redone[0] != 0 or redone[1] > 1:
        print("error the first run went on past its checkpoint: %s steps" % redone)
    print("resumed", resumed, "started after the checkpoint", redone)
PY
)
[[ "${trace}" != *error* && "${trace}" == *"resumed ${resumed} "* ]] \
  && pass "the resumed run trained steps ${resumed}..89; no step trained twice (${trace})" \
  || fail "trace: ${trace}"

kill "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
wait "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "a preempted and re-queued job"
finish
