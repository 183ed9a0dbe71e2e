#!/usr/bin/env bash
# End to end, issue 56 (gray failure): the leading coordinator is frozen
# (SIGSTOP) for 40 s, not killed (longer than the 30 s a new leader waits
# for a job's ranks to come back), while an elastic DDP job (2 ranks on agent
# node-e) and a job without an elastic block (1 rank on agent node-n) train.
# Its TCP connections stay up and it answers nothing: clients notice by
# their keepalive pings (Note [Noticing a frozen coordinator] in
# common/grpc_util.cc) and move to the leader a standby becomes; ranks send
# their reports off the training thread (Note [Reports off the training
# thread] in worker/runtime/report_queue.h). Checked:
#  - a standby leads; both agents are at it within 5 s of its election;
#  - the elastic job's steps/s while the leader is frozen is at least 0.75
#    of its rate over the 6 s before (a rank that waited on the frozen
#    coordinator would stall for seconds a step; the margin is for the
#    tests and builds beside it on a shared machine, where 2 s windows
#    varied by more than 10 %);
#  - after SIGCONT the frozen coordinator stops leading (its lease ended)
#    and the new leader keeps leading;
#  - both jobs end SUCCEEDED, the elastic one without a restart, and each
#    step is trained exactly once (sample traces).
#
# Usage (from Bazel): ha_frozen_leader_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$2
WORKER=$3
field() { json_get - "$2" <<<"$1"; }

# --- one etcd member
start_etcd_member m0 && pass "an etcd member is up" \
  || { fail "etcd did not start in 3 tries: $(tail -n 5 "${TMP}/etcd.log")"; finish; }

# --- three coordinators
state="etcd://127.0.0.1:${ETCD_CLIENT_PORT}/chorus-frozen"
mkdir -p "${TMP}/checkpoints"
declare -A pid_of log_of
list=""
for name in a b c; do
  start_coordinator -s "${TMP}/${name}" -p "${TMP}/${name}.port" -o "${TMP}/${name}.log" -- \
    --state "${state}" --checkpoint_dir "${TMP}/checkpoints" --http_listen off \
    || { fail "coordinator ${name} wrote no port"; finish; }
  pid_of[${COORDINATOR_ADDR}]=${COORDINATOR_PID}
  log_of[${COORDINATOR_ADDR}]="${TMP}/${name}.log"
  list+="${list:+,}${COORDINATOR_ADDR}"
done
cli() { "${CHORUS}" --coordinator "${list}" "$@"; }
# The address of the coordinator that says it leads, empty if none does.
leader() {
  cli --timeout 3 coordinators --json 2>/dev/null | "${CHORUS_TEST_PYTHON}" -c '
import json, sys
try:
    print(*[c["coordinator"] for c in json.load(sys.stdin)["coordinators"] if c["role"] == "leader"])
except ValueError:
    pass'
}
wait_for '[[ -n "$(leader)" ]]' 20 && pass "one of a, b, c leads: $(leader)" \
  || { fail "no leader: $(cli coordinators 2>&1)"; finish; }

# --- two agents, one job each (the elastic job is placed before node-n exists)
start_traced_agent() {  # NAME SLOTS
  mkdir -p "${TMP}/trace-$1"
  CHORUS_SAMPLE_TRACE="${TMP}/trace-$1" "${WORKER}" --coordinator "${list}" --slots "$2" \
    --host "$1" 2>"${TMP}/$1.log" &
  track_pid $!
  wait_for "grep -q 'connected to ${list} as agent-' '${TMP}/$1.log'" 20 \
    && pass "agent $1 connects" || fail "agent $1: $(tail -3 "${TMP}/$1.log")"
}
spec() {  # NAME RANKS [EXTRA]
  cat <<SPEC
name: "$1"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 2560 input_shape: [16] num_classes: 4 } }
training { batch_size_per_rank: 16 max_steps: 2000 }
optimizer { kind: SGD lr: 0.05 }
resources { min_ranks: $2 max_ranks: $2 }
fault_injection { faults { kind: SLOW rank: 0 at_step: 0 duration_seconds: 0.03 } }
${3:-}
SPEC
}
start_traced_agent node-e 2
spec frozen-elastic 2 "elastic { max_restarts: 2 wait_seconds: 60 }" >"${TMP}/elastic.textproto"
elastic_job=$(cli --timeout 5 submit "${TMP}/elastic.textproto" 2>"${TMP}/submit.err")
[[ "${elastic_job}" == job-* ]] && pass "submitted ${elastic_job} (elastic)" || fail "submit: $(cat "${TMP}/submit.err")"
start_traced_agent node-n 1
spec frozen-plain 1 >"${TMP}/plain.textproto"
plain_job=$(cli --timeout 5 submit "${TMP}/plain.textproto" 2>"${TMP}/submit.err")
[[ "${plain_job}" == job-* ]] && pass "submitted ${plain_job}" || fail "submit: $(cat "${TMP}/submit.err")"

# The highest step any rank traced in trace directory $1 (0 before the first).
traced_step() {
  cat "$1"/*.trace 2>/dev/null | awk '$1 == "step" && $4 > m {m = $4} END {print m + 0}'
}
wait_for '(( $(traced_step "${TMP}/trace-node-e") >= 20 && $(traced_step "${TMP}/trace-node-n") >= 20 ))' 40 \
  || fail "the jobs did not reach step 20"

# --- the freeze. The steady rate first, over about 6 s (a window to measure
# over, not a wait for something to happen).
frozen=$(leader)
before_step=$(traced_step "${TMP}/trace-node-e"); before_us=$(_lib_now_us)
sleep 6
stop_step=$(traced_step "${TMP}/trace-node-e"); stop_us=$(_lib_now_us)
kill -STOP "${pid_of[${frozen}]}" && pass "froze the leader ${frozen} (SIGSTOP)"
new_leader=""
wait_for 'new_leader=$(leader); [[ -n "${new_leader}" && "${new_leader}" != "${frozen}" ]]' 15 \
  && pass "${new_leader} leads" || fail "no other coordinator leads: $(cli coordinators 2>&1)"
# 40 s frozen in all.
sleep "$(awk -v now="$(_lib_now_us)" -v stop="${stop_us}" 'BEGIN { s = 40 - (now - stop) / 1e6; print (s > 0 ? s : 0) }')"
cont_step=$(traced_step "${TMP}/trace-node-e"); cont_us=$(_lib_now_us)
kill -CONT "${pid_of[${frozen}]}"
steady=$(awk -v s=$((stop_step - before_step)) -v t=$((stop_us - before_us)) 'BEGIN {printf "%.1f", s / (t / 1e6)}')
during=$(awk -v s=$((cont_step - stop_step)) -v t=$((cont_us - stop_us)) 'BEGIN {printf "%.1f", s / (t / 1e6)}')
ratio=$(awk -v a="${during}" -v b="${steady}" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')
awk -v r="${ratio}" 'BEGIN { exit !(r >= 0.75) }' \
  && pass "the elastic job trained ${during} steps/s while the leader was frozen, ${steady} before (${ratio})" \
  || fail "the elastic job trained ${during} steps/s while the leader was frozen, ${steady} before (${ratio} < 0.75)"
printf '{"bench": "ha_frozen_leader_throughput", "metric": "elastic DDP job steps/s during a 40 s SIGSTOP of the leading coordinator", "unit": "steps/s", "ours": %s, "peer": %s, "peer_name": "the same ranks in the 6 s before the freeze", "ratio": %s}\n' \
  "${during}" "${steady}" "${ratio}"

# --- the agents at the new leader: its own log's times (glog: HH:MM:SS.us)
seconds_of() { awk '{ split($2, t, ":"); print t[1] * 3600 + t[2] * 60 + t[3] }'; }
new_log=${log_of[${new_leader}]}
elected=$(grep -h "leading /chorus-frozen" "${new_log}" | tail -n 1 | seconds_of)
for host in node-e node-n; do
  joined=$(grep -h "on ${host} offers" "${new_log}" | tail -n 1 | seconds_of)
  gap=$(awk -v a="${joined:-}" -v e="${elected:-}" 'BEGIN { if (a == "" || e == "") print "none"; else printf "%.2f", a - e }')
  [[ "${gap}" != none ]] && awk -v g="${gap}" 'BEGIN { exit !(g <= 5) }' \
    && pass "agent ${host} was at the new leader ${gap} s after its election" \
    || fail "agent ${host} at the new leader: ${gap} s after its election (log: $(grep -c offers "${new_log}") hello(s))"
done

# --- the frozen coordinator, woken, stops leading; the new one goes on
wait_for "grep -q 'leadership lost' '${log_of[${frozen}]}'" 15 \
  && pass "${frozen}, woken, stopped leading" \
  || fail "${frozen} did not say it lost leadership: $(tail -n 3 "${log_of[${frozen}]}")"
[[ "$(leader)" == "${new_leader}" ]] && pass "${new_leader} still leads" \
  || fail "the leader is now '$(leader)'"

# --- both jobs end well, each step once
for job in "${elastic_job}" "${plain_job}"; do
  out=""
  wait_for 'out=$(cli --timeout 5 status "${job}" --json 2>/dev/null)
            [[ "$(field "${out}" job.state 2>/dev/null)" =~ ^(SUCCEEDED|FAILED|CANCELLED)$ ]]' 90
  restarts=$(field "${out}" job.restarts)  # absent when 0
  [[ "$(field "${out}" job.state)" == SUCCEEDED && "${restarts:-0}" == 0 ]] \
    && pass "${job} SUCCEEDED without a restart" \
    || fail "${job}: $(field "${out}" job.state) restarts ${restarts} $(field "${out}" job.reason)"
done
trace=$(check_sample_trace "${TMP}/trace-node-e" 2 2560)
[[ "${trace}" != *error* && "${trace}" == *"steps 2000"* && $(grep -c '^final' <<<"${trace}") -eq 2 ]] \
  && pass "the elastic job's sample trace shows steps 0..1999 each trained once" \
  || fail "sample trace: ${trace}"
finish
