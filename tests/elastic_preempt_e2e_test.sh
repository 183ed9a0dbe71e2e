#!/usr/bin/env bash
# End to end, preemption by shrinking (docs/scheduling.md): a 4-rank NORMAL
# elastic DDP job fills two agents, node-a and node-b, two slots each. A
# 2-rank HIGH job is submitted: the elastic job gives up ranks 2 and 3 at its
# next step boundary (restarts stay 0), the HIGH job starts on their slots,
# runs and succeeds; the elastic job then grows back to 4 ranks and
# completes. The sample trace (CHORUS_SAMPLE_TRACE) shows that no step was
# trained twice (none redone, none lost) and every sample of every epoch was
# trained exactly once. The job sets training.global_batch_size, so every
# step trains the same samples at 4 ranks and at 2: its final parameters
# equal those of an undisturbed 4-rank run of the same spec, run afterwards,
# within 1e-5 of the largest parameter (float sums in another order at 2
# ranks, so not bit for bit). Prints how long the HIGH job waited from submission
# to its start (the goal: 2 s plus one step of the elastic job). The
# coordinator runs with a --scheduling_policy file (one with a mistake is
# refused at start). A CUDA job submitted first, on this CPU-only cluster,
# waits for a CUDA agent all along without holding up any of it.
#
# Usage (from Bazel): elastic_preempt_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
field() { json_get - "$2" <<<"$1"; }
export CHORUS_GLOO_SHM=1
export CHORUS_SAMPLE_TRACE="${TMP}/trace"
mkdir -p "${CHORUS_SAMPLE_TRACE}"

# A policy file with a mistake stops the coordinator at start, naming the
# file and line; the test's coordinator runs with a sound one.
printf 'default cpu_slots=8\nuser bob cpu_slots=lots\n' > "${TMP}/bad.policy"
out=$("${COORDINATOR}" --listen 127.0.0.1:0 --state_dir "${TMP}/bad-state" \
  --scheduling_policy "${TMP}/bad.policy" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"scheduling policy ${TMP}/bad.policy:2: cpu_slots must be a whole number >= 0, got \"lots\""* ]] \
  && pass "a bad policy file is refused at start with its file and line" \
  || fail "bad policy: rc=${rc} out='${out}'"
printf 'fair_share_half_life 30m\ndefault cpu_slots=8 queued_jobs=4 max_priority=HIGH\n' \
  > "${TMP}/scheduling.policy"
start_coordinator -- --scheduling_policy "${TMP}/scheduling.policy" \
  || { fail "no coordinator"; finish; }
chorus() { timeout 30 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" "$@"; }
start_agent node-a 2
start_agent node-b 2

# 4 epochs of 3072 samples, global batch 48 in micro-batches of 4 (a
# multiple of 4 x 2, 3 and 4 ranks, as validation asks): 64 steps an epoch at
# any world size, 3 micro-batches per rank and step at 4 ranks, 6 at 2. Rank 0 sleeps 60 ms a step in every generation so the job lasts
# long enough to be preempted and grow back on a busy machine.
slow=""
for gen in 1 2 3 4; do
  slow+="faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.06 generation: ${gen} } "
done
job_spec() {  # $1: min_ranks, $2: fault_injection's faults
  cat <<SPEC
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 3072 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 4 global_batch_size: 48 epochs: 4 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: $1 max_ranks: 4 threads_per_rank: 1 }
elastic { max_restarts: 0 wait_seconds: 60 scale_up_interval_seconds: 2 }
fault_injection { $2 }
SPEC
}
{ echo 'name: "elastic"'; job_spec 2 "${slow}"; } > "${TMP}/elastic.textproto"
# The undisturbed run: the same training at 4 ranks throughout, no faults.
{ echo 'name: "undisturbed"'; job_spec 4 ""; } > "${TMP}/undisturbed.textproto"
# A program writes no sample trace, so the trace is the elastic job's alone.
# Its ranks hold their slots until the test has seen the elastic job run
# shrunk and creates TMP/release-high (at most 120 s): the elastic job cannot
# grow back before that, however slow the machine.
cat > "${TMP}/high.textproto" <<SPEC
name: "urgent"
priority: HIGH
program { argv: ["/bin/bash", "-c", "for i in \$(seq 1200); do [[ -e '${TMP}/release-high' ]] && exit 0; sleep 0.1; done; exit 1"] }
resources { min_ranks: 2 max_ranks: 2 }
SPEC
# A CUDA job on this CPU-only cluster waits for a CUDA agent and blocks
# nobody: every job below is submitted after it and runs.
cat > "${TMP}/cuda.textproto" <<'SPEC'
name: "gpu-only"
program { argv: ["/bin/true"] }
resources { device: CUDA min_ranks: 1 max_ranks: 1 }
SPEC
cuda_job=$(chorus submit "${TMP}/cuda.textproto" 2>"${TMP}/submit-cuda.err")
[[ "${cuda_job}" == job-* ]] || fail "submit CUDA: ${cuda_job} $(cat "${TMP}/submit-cuda.err")"
job=$(chorus submit "${TMP}/elastic.textproto" 2>"${TMP}/submit.err")
[[ "${job}" == job-* ]] || fail "submit: ${job} $(cat "${TMP}/submit.err")"

# Ranks 2 and 3 (on node-b: agents number ranks in the order they connected)
# past step 40.
wait_for '[[ -n "$(grep -l "^step 1 3 4[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 60 \
  || fail "rank 3 never reached step 40: $(chorus status "${job}")"
pid_of() { basename "$(grep -l "^step 1 $1 " "${TMP}"/trace/*.trace | head -n 1)" .trace; }
b_pids="$(pid_of 2) $(pid_of 3)"

high=$(chorus submit "${TMP}/high.textproto" 2>"${TMP}/submit-high.err")
[[ "${high}" == job-* ]] || fail "submit HIGH: ${high} $(cat "${TMP}/submit-high.err")"
wait_for '[[ "$(field "$(chorus status "${high}" --json)" job.state)" != PENDING ]]' 30 \
  || fail "the HIGH job never started: $(chorus queue) $(chorus status "${job}")"
status=$(chorus status "${high}" --json)
waited=$(python3 -c 'import sys; print("%.2f" % ((int(sys.argv[2]) - int(sys.argv[1])) / 1e6))' \
  "$(field "${status}" job.submit_time_us)" "$(field "${status}" job.start_time_us)")
pass "the HIGH job started ${waited} s after its submission (goal: 2 s + one step)"
# Generation 2 formed before ranks 2 and 3 left and gave the HIGH job their
# slots (docs/scheduling.md); while it holds them there is no generation 3.
out=$(chorus status "${job}")
[[ "${out}" == *"generation 2, world size 2, restarts 0 of elastic.max_restarts 0"* ]] \
  && pass "the elastic job runs on with 2 ranks and no restart counted" || fail "status: ${out}"
for pid in ${b_pids}; do
  wait_for '! kill -0 "${pid}" 2>/dev/null' 10 || fail "preempted rank pid ${pid} still runs"
done
touch "${TMP}/release-high"
wait_for '[[ "$(field "$(chorus status "${high}" --json)" job.state)" == SUCCEEDED ]]' 30 \
  && pass "the HIGH job succeeded" || fail "HIGH job: $(chorus status "${high}")"

wait_for '[[ "$(field "$(chorus status "${job}" --json)" job.world_size)" == 4 ]]' 30 \
  && pass "the elastic job grew back to 4 ranks" || fail "no growth: $(chorus status "${job}")"
wait_for '[[ "$(field "$(chorus status "${job}" --json)" job.state)" == SUCCEEDED ]]' 90 \
  && pass "the elastic job succeeded" || fail "job: $(chorus status "${job}")"
events=$(chorus watch "${job}" 2>&1)
[[ "${events}" == *"generation 2 after ${high} (priority HIGH, anonymous) preempted rank(s) 2,3 of this NORMAL job: they leave, nothing is lost: 4 -> 2 ranks, at a step boundary (not a restart)"* \
   && "${events}" == *"generation 3 after 2 free slot(s) let the job grow from 2 towards resources.max_ranks 4"* ]] \
  && pass "watch names who preempted whom, and the growth" || fail "watch: ${events}"
events=$(chorus watch "${high}" 2>&1)
[[ "${events}" == *"preempting rank(s) 2,3 of ${job} (priority NORMAL) at its next step boundary to make room for this job"* ]] \
  && pass "the HIGH job's events name the job it preempted" || fail "watch HIGH: ${events}"

# --- the trace: steps by generation, samples per epoch
trace=$(python3 - "${TMP}/trace" <<'PY'
import collections, glob, os, sys
steps = collections.defaultdict(lambda: collections.defaultdict(dict))
world = collections.defaultdict(int)
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.trace"))):
    for line in open(path):
        f = line.split()
        if f[0] == "step":  # one line per micro-batch
            gen, rank, step, epoch = map(int, f[1:5])
            steps[step][gen].setdefault(rank, (epoch, []))[1].extend(int(i) for i in f[5].split(","))
            world[gen] = max(world[gen], rank + 1)
by_epoch = collections.defaultdict(list)
for step in sorted(steps):
    if len(steps[step]) != 1:
        print("error step %d trained by generations %s" % (step, sorted(steps[step])))
    gen = max(steps[step])
    ranks = steps[step][gen]
    if sorted(ranks) != list(range(world[gen])):
        print("error step %d generation %d has ranks %s" % (step, gen, sorted(ranks)))
    for epoch, idx in ranks.values():
        by_epoch[epoch].extend(idx)
for epoch in sorted(by_epoch):
    idx = sorted(by_epoch[epoch])
    if idx != list(range(3072)):
        print("error epoch %d: %d samples, %d distinct" % (epoch, len(idx), len(set(idx))))
print("epochs", len(by_epoch), "worlds", " ".join("%d:%d" % (g, world[g]) for g in sorted(world)))
PY
)
[[ "${trace}" != *error* && "${trace}" == *"epochs 4 worlds 1:4 2:2 3:4"* ]] \
  && pass "no step trained twice or skipped; every sample of the 4 epochs once (${trace##*epochs})" \
  || fail "trace: ${trace}"

# --- the same computation as an undisturbed run: its final parameters
# (after the trace is read, so its ranks' trace lines do not count)
undisturbed=$(chorus submit "${TMP}/undisturbed.textproto" 2>"${TMP}/submit-undisturbed.err")
[[ "${undisturbed}" == job-* ]] \
  || fail "submit undisturbed: ${undisturbed} $(cat "${TMP}/submit-undisturbed.err")"
wait_for '[[ "$(field "$(chorus status "${undisturbed}" --json)" job.state)" == SUCCEEDED ]]' 60 \
  || fail "undisturbed job: $(chorus status "${undisturbed}")"
chorus export "${job}" --step 256 -o "${TMP}/elastic.pt" 2>"${TMP}/export.err" \
  && chorus export "${undisturbed}" --step 256 -o "${TMP}/undisturbed.pt" 2>>"${TMP}/export.err" \
  || fail "export: $(cat "${TMP}/export.err")"
cmp=$(/usr/bin/python3 - "${TMP}/elastic.pt" "${TMP}/undisturbed.pt" <<'PY' 2>&1
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
diff = max((a[k] - b[k]).abs().max().item() for k in a)
scale = max(1.0, max(b[k].abs().max().item() for k in b))
print("tensors %d max_abs_diff %.3g relative %.3g %s" % (len(a), diff, diff / scale,
      "within" if diff / scale <= 1e-5 else "beyond"))
PY
)
[[ "${cmp}" == *" within" ]] \
  && pass "final parameters equal the undisturbed 4-rank run's within 1e-5 (${cmp})" \
  || fail "final parameters against the undisturbed run: ${cmp}"

queue=$(chorus queue)
[[ "$(field "$(chorus status "${cuda_job}" --json)" job.state)" == PENDING \
   && "${queue}" == *"${cuda_job}"*"waiting for a node agent with CUDA slots (none is connected); later jobs start meanwhile"* ]] \
  && pass "the CUDA job still waits for a CUDA agent, and the jobs after it ran" \
  || fail "CUDA job: $(chorus status "${cuda_job}") queue: ${queue}"
chorus cancel "${cuda_job}" >/dev/null || fail "cancel ${cuda_job}"

kill "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
wait "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "a preempted and grown job"
finish
