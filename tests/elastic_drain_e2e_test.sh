#!/usr/bin/env bash
# End to end, planned changes of an elastic job (docs/elastic.md; issue 23,
# test 5 and growth): a 4-rank DDP job runs on two agents, node-a and node-b,
# two ranks each. `chorus drain node-b` makes node-b's ranks leave at a step
# boundary: the job goes on with 2 ranks, restarts stay 0, the leaving
# processes exit 0 and node-b is reported DRAINED. Then a third agent,
# node-c, connects with two free slots: the job grows back to 4 ranks at its
# next step boundary, the newcomers receiving the state by broadcast, and
# completes. The sample trace (CHORUS_SAMPLE_TRACE) shows that no step was
# trained twice (none redone, none lost) and every sample of every epoch was
# trained exactly once, and every rank ends with the same parameters.
#
# Usage (from Bazel): elastic_drain_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
field() { json_get - "$2" <<<"$1"; }
export CHORUS_GLOO_SHM=1
export CHORUS_SAMPLE_TRACE="${TMP}/trace"
mkdir -p "${CHORUS_SAMPLE_TRACE}"

start_coordinator || { fail "no coordinator"; finish; }
chorus() { timeout 30 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" "$@"; }
start_agent node-a 2
start_agent node-b 2

# 4 epochs of 4096 samples, 16 per rank and step: 64 steps an epoch with 4
# ranks, 128 with 2. Rank 0 sleeps 30 ms a step in every generation so the
# job lasts long enough to be drained and grown on a busy machine.
slow=""
for gen in 1 2 3 4; do
  slow+="faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.03 generation: ${gen} } "
done
cat > "${TMP}/job.textproto" <<SPEC
name: "drain"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 4096 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 4 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 4 threads_per_rank: 1 }
elastic { max_restarts: 0 wait_seconds: 60 scale_up_interval_seconds: 2 }
fault_injection { ${slow} }
SPEC
job=$(chorus submit "${TMP}/job.textproto" 2>"${TMP}/submit.err")
[[ "${job}" == job-* ]] || fail "submit: ${job} $(cat "${TMP}/submit.err")"

# The ranks on node-b (ranks 2 and 3: agents number ranks in the order they
# connected) past step 40.
wait_for '[[ -n "$(grep -l "^step 1 3 4[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 60 \
  || fail "rank 3 never reached step 40: $(chorus status "${job}")"
pid_of() { basename "$(grep -l "^step 1 $1 " "${TMP}"/trace/*.trace | head -n 1)" .trace; }
a_pids="$(pid_of 0) $(pid_of 1)"
b_pids="$(pid_of 2) $(pid_of 3)"

out=$(chorus drain node-b); rc=$?
[[ ${rc} -eq 0 && "${out}" == "agent-2 (node-b): DRAINING, 2 of 2 slot(s) busy, jobs ${job}" ]] \
  && pass "chorus drain node-b: ${out}" || fail "drain rc=${rc} out='${out}'"
out=$(chorus drain node-b --wait 30); rc=$?
[[ ${rc} -eq 0 && "${out}" == "agent-2 (node-b): DRAINED, 0 of 2 slot(s) busy - no rank runs there; the agent can be stopped" ]] \
  && pass "node-b is drained: ${out}" || fail "drain --wait rc=${rc} out='${out}'"
out=$(chorus status "${job}")
[[ "${out}" == *"RUNNING"* && "${out}" == *"generation 2, world size 2, restarts 0 of elastic.max_restarts 0"* ]] \
  && pass "the job runs on with 2 ranks and no restart counted" || fail "status: ${out}"
for pid in ${b_pids}; do
  kill -0 "${pid}" 2>/dev/null && fail "drained rank pid ${pid} still runs"
done
out=$(grep -c "the rank that left slot [01] of node-b exited with code 0" "${TMP}/coordinator.log")
[[ "${out}" -eq 2 ]] && pass "both ranks on node-b left and exited with code 0" \
  || fail "coordinator log: $(grep -i "node-b" "${TMP}/coordinator.log" | tail -5)"

# --- growth: node-c brings two free slots
start_agent node-c 2
wait_for '[[ "$(field "$(chorus status "${job}" --json)" job.world_size)" == 4 ]]' 30 \
  && pass "the job grew back to 4 ranks on node-c" \
  || fail "no growth: $(chorus status "${job}")"
wait_for '[[ "$(field "$(chorus status "${job}" --json)" job.state)" == SUCCEEDED ]]' 90 \
  && pass "the job succeeded" || fail "job: $(chorus status "${job}")"
out=$(chorus agents)
[[ "${out}" == *"agent-1 (node-a): ACTIVE, 0 of 2 slot(s) busy"* && "${out}" == *"agent-2 (node-b): DRAINED"* \
   && "${out}" == *"agent-3 (node-c): ACTIVE, 0 of 2 slot(s) busy"* ]] \
  && pass "chorus agents lists the states" || fail "agents: ${out}"
events=$(chorus watch "${job}" 2>&1)
[[ "${events}" == *"generation 2 after agent agent-2 (node-b) was drained: rank(s) 2,3 leave: 4 -> 2 ranks, at a step boundary (not a restart)"* \
   && "${events}" == *"generation 3 after 2 free slot(s) let the job grow from 2 towards resources.max_ranks 4: 2 -> 4 ranks (rank 2 on node-c slot 0, rank 3 on node-c slot 1), at a step boundary (not a restart)"* ]] \
  && pass "watch shows the drain and the growth" || fail "watch: ${events}"

# --- the trace: steps by generation, samples per epoch
trace=$(python3 - "${TMP}/trace" <<'PY'
import collections, glob, os, sys
steps = collections.defaultdict(lambda: collections.defaultdict(dict))
world = collections.defaultdict(int)
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.trace"))):
    pid = os.path.basename(path).split(".")[0]
    for line in open(path):
        f = line.split()
        if f[0] == "step":
            gen, rank, step, epoch = map(int, f[1:5])
            steps[step][gen][rank] = (epoch, [int(i) for i in f[5].split(",")])
            world[gen] = max(world[gen], rank + 1)
        elif f[0] == "final":
            print("final", pid, *f[1:])
        elif f[0] == "state":
            print("state", pid, f[1], f[2], f[4], f[6], f[8])
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
    if idx != list(range(4096)):
        print("error epoch %d: %d samples, %d distinct" % (epoch, len(idx), len(set(idx))))
print("epochs", len(by_epoch), "worlds", " ".join("%d:%d" % (g, world[g]) for g in sorted(world)))
PY
)
[[ "${trace}" != *error* && "${trace}" == *"epochs 4 worlds 1:4 2:2 3:4"* ]] \
  && pass "no step trained twice or skipped; every sample of the 4 epochs once (${trace##*epochs})" \
  || fail "trace: ${trace}"
# Survivors held the boundary step themselves (HAD = STEP) in generations 2
# and 3; the newcomers received it (HAD -1) from a survivor.
for pid in ${a_pids}; do
  awk -v p="${pid}" '$1 == "state" && $2 == p && $6 == $7 {n++} END {exit n != 2}' <<<"${trace}" \
    && grep -q "^final ${pid} 3 " <<<"${trace}" \
    && pass "survivor pid ${pid} kept its state across both changes and finished in generation 3" \
    || fail "survivor ${pid}: $(grep " ${pid} " <<<"${trace}")"
done
newcomers=$(awk '$1 == "state" && $3 == 3 && $7 == -1 && ($5 == 0 || $5 == 1) {print $4}' <<<"${trace}" | sort | tr '\n' ' ')
[[ "${newcomers}" == "2 3 " ]] && pass "the newcomers (ranks 2, 3) received the state by broadcast" \
  || fail "newcomer state lines: ${newcomers}; ${trace}"
crcs=$(awk '$1 == "final" {print $6}' <<<"${trace}" | sort -u)
[[ $(grep -c '^final' <<<"${trace}") -eq 4 && $(wc -l <<<"${crcs}") -eq 1 ]] \
  && pass "all 4 ranks end with the same parameters (${crcs})" || fail "finals: $(grep '^final' <<<"${trace}")"

kill "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
wait "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "a drained and grown job"
finish
