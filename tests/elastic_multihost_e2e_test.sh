#!/usr/bin/env bash
# End to end, issue 23 test 2: node loss and return with three "hosts" on one
# machine. Three network namespaces (node-a, node-b, node-c) joined by a
# bridge in a fourth; the coordinator listens on node-a's address with
# tokens; each host runs an agent with one slot. A 3-rank elastic job
# (min_ranks 2) trains with one rank per host. Everything in node-b's
# namespace (its agent and its rank) is killed with SIGKILL: the coordinator
# hears the agent's stream end (agents have no reconnect grace) and the job
# shrinks to 2 ranks and keeps training. An agent started in node-b's
# namespace again is a new agent with a free slot: the job grows back to 3
# ranks at a step boundary, the newcomer receiving the state by broadcast,
# and completes. No traffic leaves the namespaces.
#
# Needs root (ip netns); where namespaces cannot be made the test reports
# itself skipped in its XML rather than passing (as multihost_e2e_test).
#
# Usage (from Bazel): elastic_multihost_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
field() { json_get - "$2" <<<"$1"; }

hub="chorus-$$-hub"
hosts=(a b c)
for h in hub "${hosts[@]}"; do
  ns="chorus-$$-${h}"
  on_exit "ip netns pids '${ns}' 2>/dev/null | xargs -r kill -KILL 2>/dev/null; ip netns del '${ns}' 2>/dev/null"
done
ns_of() { echo "chorus-$$-$1"; }

skip() {
  echo "SKIPPED: $*"
  if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
    cat > "${XML_OUTPUT_FILE}" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="elastic_multihost_e2e_test" tests="1" skipped="1">
<testcase name="node_loss_and_return" classname="elastic_multihost_e2e_test"><skipped message="$*"/></testcase>
</testsuite></testsuites>
XML
  fi
  exit 0
}

if ! ip netns add "${hub}" 2>"${TMP}/netns.err"; then
  skip "cannot create network namespaces here ($(head -1 "${TMP}/netns.err")); needs root and iproute2"
fi
ip -n "${hub}" link add br0 type bridge || skip "cannot create a bridge"
ip -n "${hub}" link set br0 up
i=0
for h in "${hosts[@]}"; do
  i=$((i + 1))
  ns=$(ns_of "${h}")
  ip netns add "${ns}" || skip "cannot create namespace ${ns}"
  ip link add "cev$$${h}" type veth peer name "ceb$$${h}" || skip "cannot create a veth pair"
  ip link set "cev$$${h}" netns "${ns}"
  ip link set "ceb$$${h}" netns "${hub}"
  ip -n "${hub}" link set "ceb$$${h}" master br0
  ip -n "${hub}" link set "ceb$$${h}" up
  ip -n "${ns}" addr add "10.79.0.${i}/24" dev "cev$$${h}"
  ip -n "${ns}" link set lo up
  ip -n "${ns}" link set "cev$$${h}" up
done
# node-b reaches node-c over the bridge: a connection to a closed port is
# refused at once (no ping on every machine).
reach=$(ip netns exec "$(ns_of b)" timeout 3 bash -c 'exec 3<>/dev/tcp/10.79.0.3/9' 2>&1)
[[ "${reach}" == *"refused"* ]] || skip "the namespaces cannot reach each other over the bridge (${reach})"

admin=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
worker=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf 'admin %s\nworker %s\n' "${admin}" "${worker}" > "${TMP}/tokens"
echo "${admin}" > "${TMP}/admin.token"
echo "${worker}" > "${TMP}/worker.token"
chmod 600 "${TMP}/tokens" "${TMP}/admin.token" "${TMP}/worker.token"  # token files readable by others are refused
start_coordinator -n "$(ns_of a)" -l 10.79.0.1:0 -s "${TMP}/state" -- --token_file "${TMP}/tokens" \
  || { fail "coordinator did not start"; finish; }
addr=${COORDINATOR_ADDR}
c() { timeout 30 ip netns exec "$(ns_of a)" "${CHORUS}" --coordinator "${addr}" --token_file "${TMP}/admin.token" "$@"; }

export CHORUS_SAMPLE_TRACE="${TMP}/trace"
mkdir -p "${CHORUS_SAMPLE_TRACE}"
start_agent() {  # $1 = a, b or c; $2 = the log's name
  local n=$(( $(printf '%d' "'$1") - 96 ))
  local agent_log="${TMP}/$2.log"
  ip netns exec "$(ns_of "$1")" "${WORKER}" --coordinator "${addr}" --slots 1 --host "node-$1" \
    --rank_host "10.79.0.${n}" --token_file "${TMP}/worker.token" 2>"${agent_log}" &
  track_pid $!
  wait_for 'grep -q "connected to ${addr} as agent-" "${agent_log}"' 20 \
    || fail "agent node-$1 did not connect: $(tail -3 "${agent_log}")"
}
for h in "${hosts[@]}"; do start_agent "${h}" "agent_${h}"; done

# 3 epochs of 3072 samples, 16 per rank and step: 64 steps an epoch with 3
# ranks, 96 with 2. Rank 0 (node-a) sleeps 30 ms a step in every generation.
slow=""
for gen in 1 2 3; do
  slow+="faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.03 generation: ${gen} } "
done
cat > "${TMP}/job.textproto" <<SPEC
name: "node-loss"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 3072 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 epochs: 3 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 3 }
elastic { max_restarts: 1 wait_seconds: 60 scale_up_interval_seconds: 2 }
fault_injection { ${slow} }
SPEC
job=$(c submit "${TMP}/job.textproto" 2>"${TMP}/submit.err")
[[ "${job}" == job-* ]] || fail "submit: ${job} $(cat "${TMP}/submit.err")"
wait_for '[[ -n "$(grep -l "^step 1 1 3[0-9] " "${TMP}"/trace/*.trace 2>/dev/null)" ]]' 60 \
  || fail "rank 1 never reached step 30: $(c status "${job}")"

# --- node-b is lost: its agent and its rank, SIGKILL
pids=$(ip netns pids "$(ns_of b)" | tr '\n' ' ')
kill -KILL ${pids}
pass "killed everything in node-b's namespace (pids ${pids})"
wait_for '[[ "$(field "$(c status "${job}" --json)" job.generation)" == 2 ]]' 20
out=$(c status "${job}")
[[ "${out}" == *"RUNNING"* && "${out}" == *"generation 2, world size 2, restarts 1 of elastic.max_restarts 1"* ]] \
  && pass "the job shrank to 2 ranks and runs on" || fail "status after the loss: ${out}"
# Rank 0 reports metrics every 16 steps.
step_then=$(field "$(c status "${job}" --json)" job.latest_metrics.step)
wait_for 's=$(field "$(c status "${job}" --json)" job.latest_metrics.step); [[ "${s:-0}" -ge $(( ${step_then:-0} + 32 )) ]]' 20 \
  && pass "2 ranks keep training (from step ${step_then} past $(( ${step_then:-0} + 32 )))" \
  || fail "no progress from step ${step_then}: $(c status "${job}")"

# --- an agent in node-b's namespace again: the job grows back to 3
start_agent b agent_b2
wait_for '[[ "$(field "$(c status "${job}" --json)" job.world_size)" == 3 ]]' 30 \
  && pass "the job grew back to 3 ranks on the new agent" || fail "no growth: $(c status "${job}")"
wait_for '[[ "$(field "$(c status "${job}" --json)" job.state)" == SUCCEEDED ]]' 90 \
  && pass "the job succeeded" || fail "job: $(c status "${job}")"
events=$(c watch "${job}" 2>&1)
[[ "${events}" == *"generation 2 after lost contact with the agent on node-b (agent-2), which ran rank(s) 1, and it was not back within 5s: 3 -> 2 ranks (rank 2 is now rank 1), restart 1 of 1"* \
   && "${events}" == *"generation 3 after 1 free slot(s) let the job grow from 2 towards resources.max_ranks 3: 2 -> 3 ranks (rank 2 on node-b slot 0), at a step boundary (not a restart)"* ]] \
  && pass "watch shows the loss and the growth" || fail "watch: ${events}"

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
worlds_of_epoch = collections.defaultdict(set)
for step in sorted(steps):
    gen = max(steps[step])  # the generation that completed the step
    if len(steps[step]) > 1 and sorted(steps[step]) != [1, 2]:
        print("error step %d trained by generations %s" % (step, sorted(steps[step])))
    ranks = steps[step][gen]
    if sorted(ranks) != list(range(world[gen])):
        print("error step %d generation %d has ranks %s" % (step, gen, sorted(ranks)))
    for epoch, idx in ranks.values():
        by_epoch[epoch].extend(idx)
        worlds_of_epoch[epoch].add(world[gen])
for epoch in sorted(by_epoch):
    idx = sorted(by_epoch[epoch])
    if len(idx) != len(set(idx)) or not set(idx) <= set(range(3072)):
        print("error epoch %d: %d samples, %d distinct" % (epoch, len(idx), len(set(idx))))
    # A loss re-shards the rest of the epoch among 2 ranks: a rest that is
    # not a whole number of 2-rank batches (32 samples) loses its partial
    # batch (data.remainder DROP; docs/elastic.md). Nothing else may be lost.
    allowed = 32 if len(worlds_of_epoch[epoch]) > 1 else 0
    if 3072 - len(set(idx)) > allowed:
        print("error epoch %d: %d of 3072 samples trained" % (epoch, len(set(idx))))
print("epochs", len(by_epoch), "worlds", " ".join("%d:%d" % (g, world[g]) for g in sorted(world)))
PY
)
crcs=$(awk '$1 == "final" {print $6}' <<<"${trace}" | sort -u)
[[ "${trace}" != *error* && "${trace}" == *"epochs 3 worlds 1:3 2:2 3:3"* \
   && $(grep -c '^final' <<<"${trace}") -eq 3 && $(wc -l <<<"${crcs}") -eq 1 ]] \
  && pass "no sample of the 3 epochs twice, none lost but a partial batch after the loss; only the step the loss interrupted was trained again; 3 ranks end equal (${crcs})" \
  || fail "trace: ${trace}"
newcomer=$(awk '$1 == "state" && $3 == 3 && $7 == -1 {print $4}' <<<"${trace}")
[[ "${newcomer}" == 2 ]] && pass "the newcomer on node-b (rank 2) received the state by broadcast" \
  || fail "state lines: $(grep '^state' <<<"${trace}")"
finish
