#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair
# (10.77.0.1 and 10.77.0.2). The coordinator listens on host A's address with
# tokens; one agent per host offers one slot; a 2-rank job trains with one rank
# on each host, the ranks finding each other at the addresses their agents
# picked (the local address that reaches the coordinator). No traffic leaves
# the namespaces.
#
# Needs root (ip netns). Where namespaces cannot be made, the test reports
# itself skipped in its XML rather than passing.
#
# Usage (from Bazel): multihost_e2e_test.sh COORDINATOR CHORUS WORKER
set -uo pipefail

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
TMP=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
wait_for_file() { for _ in $(seq 1 200); do [[ -s "$1" ]] && return 0; sleep 0.1; done; return 1; }

ns_a="chorus-$$-a"
ns_b="chorus-$$-b"
veth="chv$$"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "${p}" 2>/dev/null; done
  ip netns pids "${ns_a}" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip netns pids "${ns_b}" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip netns del "${ns_a}" 2>/dev/null
  ip netns del "${ns_b}" 2>/dev/null
}
trap cleanup EXIT

skip() {
  echo "SKIPPED: $*"
  if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
    cat > "${XML_OUTPUT_FILE}" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="multihost_e2e_test" tests="1" skipped="1">
<testcase name="two_hosts" classname="multihost_e2e_test"><skipped message="$*"/></testcase>
</testsuite></testsuites>
XML
  fi
  exit 0
}

if ! ip netns add "${ns_a}" 2>"${TMP}/netns.err"; then
  skip "cannot create network namespaces here ($(head -1 "${TMP}/netns.err")); needs root and iproute2"
fi
ip netns add "${ns_b}" || skip "cannot create a second namespace"
ip link add "${veth}a" type veth peer name "${veth}b" || skip "cannot create a veth pair"
ip link set "${veth}a" netns "${ns_a}"
ip link set "${veth}b" netns "${ns_b}"
ip -n "${ns_a}" addr add 10.77.0.1/24 dev "${veth}a"
ip -n "${ns_b}" addr add 10.77.0.2/24 dev "${veth}b"
for ns in "${ns_a}" "${ns_b}"; do
  ip -n "${ns}" link set lo up
done
ip -n "${ns_a}" link set "${veth}a" up
ip -n "${ns_b}" link set "${veth}b" up
# A little latency, as between real machines.
tc -n "${ns_a}" qdisc add dev "${veth}a" root netem delay 1ms 2>/dev/null || true

admin=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
worker=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf 'admin %s\nworker %s\n' "${admin}" "${worker}" > "${TMP}/tokens"
echo "${admin}" > "${TMP}/admin.token"
echo "${worker}" > "${TMP}/worker.token"

ip netns exec "${ns_a}" "${COORDINATOR}" --listen 10.77.0.1:0 --state_dir "${TMP}/state" \
  --token_file "${TMP}/tokens" --port_file "${TMP}/port" 2>"${TMP}/coordinator.log" &
pids+=($!)
wait_for_file "${TMP}/port" || { cat "${TMP}/coordinator.log" >&2; fail "coordinator did not start"; exit 1; }
addr="10.77.0.1:$(cat "${TMP}/port")"

ip netns exec "${ns_a}" "${WORKER}" --coordinator "${addr}" --slots 1 --host node-a \
  --token_file "${TMP}/worker.token" 2>"${TMP}/agent_a.log" &
pids+=($!)
ip netns exec "${ns_b}" "${WORKER}" --coordinator "${addr}" --slots 1 --host node-b \
  --token_file "${TMP}/worker.token" 2>"${TMP}/agent_b.log" &
pids+=($!)

cat > "${TMP}/job.textproto" <<'SPEC'
name: "two-hosts"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 2048 input_shape: [16] num_classes: 4 seed: 5 } }
training { batch_size_per_rank: 32 epochs: 3 seed: 1 log_every_steps: 8 }
optimizer { kind: SGD lr: 0.1 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
SPEC
c() { ip netns exec "${ns_a}" "${CHORUS}" --coordinator "${addr}" --token_file "${TMP}/admin.token" "$@"; }
out=$(timeout 120 ip netns exec "${ns_a}" "${CHORUS}" --coordinator "${addr}" --token_file "${TMP}/admin.token" \
  submit --wait "${TMP}/job.textproto" 2>"${TMP}/submit.err"); rc=$?
[[ ${rc} -eq 0 && "${out}" == "job-000001" ]] && pass "a 2-rank job trained across the two hosts" \
  || fail "job rc=${rc} out='${out}' err=$(tail -3 "${TMP}/submit.err") a=$(tail -3 "${TMP}/agent_a.log") b=$(tail -3 "${TMP}/agent_b.log")"
acc=$(c jobs --json 2>/dev/null | sed -n 's/.*"eval_accuracy": \([0-9.]*\).*/\1/p' | head -1)
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.7) }' && pass "test accuracy ${acc}" || fail "accuracy '${acc}'"
# Each agent told its rank the address of its own host; the ranks' output
# reached the coordinator from both.
logs=$(c logs job-000001 2>&1)
[[ "${logs}" == *"training traffic on 10.77.0.1"* && "${logs}" == *"training traffic on 10.77.0.2"* ]] \
  && pass "one rank trained on each host's address, logs from both" \
  || fail "logs: $(grep -i traffic <<<"${logs}")"

echo "${failures} failure(s)"
[[ ${failures} -eq 0 ]]
