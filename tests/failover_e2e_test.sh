#!/usr/bin/env bash
# End to end: two chorus-coordinator processes sharing one etcd member (its
# own data directory and free loopback ports, stopped at the end), and the
# chorus CLI given both. One leads, the other follows and names the leader;
# a node agent given both connects to the leader; kill -9 of the leader moves
# the leadership to the follower, the agent reconnects to it, and a CLI call
# made through the list during the failover waits for it and finds the job
# submitted before; a coordinator started again follows the new leader; a
# leader whose lease is revoked follows again without exiting; SIGTERM stops
# a coordinator cleanly.
#
# Usage (from Bazel): failover_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$1
CHORUS=$2
WORKER=$3

start_etcd_member failover && pass "etcd is up" \
  || { fail "etcd did not start in 3 tries: $(tail -20 "${TMP}/etcd.log")"; finish; }
client_port=${ETCD_CLIENT_PORT}

state="etcd://127.0.0.1:${client_port}/chorus-failover"
mkdir -p "${TMP}/checkpoints"
start_one() {  # NAME: a coordinator writing TMP/NAME.port and TMP/NAME.log
  start_coordinator -s "${TMP}/$1" -p "${TMP}/$1.port" -o "${TMP}/$1.log" -- \
    --state "${state}" --checkpoint_dir "${TMP}/checkpoints" --http_listen off
}
start_one a || { fail "coordinator a wrote no port"; finish; }
a_pid=${COORDINATOR_PID}
a=${COORDINATOR_ADDR}
wait_for "grep -q 'coordinator listening' '${TMP}/a.log'" 20 \
  && pass "a leads (the first to campaign)" || fail "a never served: $(tail -5 "${TMP}/a.log")"
start_one b || { fail "coordinator b wrote no port"; finish; }
b_pid=${COORDINATOR_PID}
b=${COORDINATOR_ADDR}
both="${a},${b}"

# --- the follower names the leader; the list finds the leader
out=$("${CHORUS}" --coordinator "${b}" --timeout 3 jobs 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"follower; the leader is ${a} "* ]] \
  && pass "a client of the follower alone is told where the leader is" \
  || fail "jobs at the follower rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${both}" --timeout 5 coordinators 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"${a}"*leader*"${a}"*"${b}"*follower*"${a}"* ]] \
  && pass "chorus coordinators: a leads, b follows" || fail "coordinators rc=${rc} out='${out}'"
"${WORKER}" --coordinator "${both}" --slots 1 --host node-x 2>"${TMP}/agent.log" &
track_pid $!
wait_for "grep -q 'connected to ${both} as agent-' '${TMP}/agent.log'" 20 \
  && pass "an agent given both connects" || fail "agent: $(tail -3 "${TMP}/agent.log")"
# Two ranks: it waits PENDING beside the one slot.
printf 'model { mlp {} }\ndata { synthetic {} }\nresources { min_ranks: 2 max_ranks: 2 }\n' \
  > "${TMP}/job.textproto"
job=$("${CHORUS}" --coordinator "${both}" --timeout 5 submit "${TMP}/job.textproto" 2>/dev/null); rc=$?
[[ ${rc} -eq 0 && "${job}" == job-* ]] && pass "submit through the list: ${job}" \
  || fail "submit rc=${rc} out='${job}'"

# --- kill -9 the leader: a call through the list waits for b and finds the job
kill -KILL "${a_pid}"
start_us=$(_lib_now_us)
out=$("${CHORUS}" --coordinator "${both}" --timeout 15 jobs 2>&1); rc=$?
took_ms=$(( ($(_lib_now_us) - start_us) / 1000 ))
[[ ${rc} -eq 0 && "${out}" == *"${job}"* ]] \
  && pass "after kill -9 of the leader the list reached b in ${took_ms} ms and it has ${job}" \
  || fail "jobs after the failover rc=${rc} out='${out}'"
out=$("${CHORUS}" --coordinator "${both}" --timeout 3 coordinators 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"${a}"*unreachable*"${b}"*leader* ]] \
  && pass "chorus coordinators: a unreachable, b leads" \
  || fail "coordinators after the kill rc=${rc} out='${out}'"
wait_for "\"${CHORUS}\" --coordinator '${both}' --timeout 3 agents 2>/dev/null | grep -q node-x" 20 \
  && pass "the agent reconnected to the new leader" \
  || fail "no agent at b: $(tail -3 "${TMP}/agent.log")"
kill -0 "${b_pid}" 2>/dev/null && pass "b still runs" || fail "b exited"

# --- a started again (on a new port) follows b
start_one a2 || { fail "coordinator a2 wrote no port"; finish; }
a2=${COORDINATOR_ADDR}
out=$("${CHORUS}" --coordinator "${a2},${b}" --timeout 5 coordinators 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"${a2}"*follower*"${b}"*"${b}"*leader*"${b}"* ]] \
  && pass "a coordinator started again follows the new leader" \
  || fail "coordinators with a2 rc=${rc} out='${out}'"

# --- b loses its lease (revoked in etcd): it stops serving, follows without
# exiting, and the two elect a leader again
etcdctl() { /usr/bin/etcdctl --endpoints "127.0.0.1:${client_port}" "$@"; }
for lease in $(etcdctl lease list 2>/dev/null | tail -n +2); do etcdctl lease revoke "${lease}" >/dev/null; done
wait_for "grep -q 'leadership lost' '${TMP}/b.log'" 10 \
  && pass "b saw its leadership lost" || fail "b never lost: $(tail -3 "${TMP}/b.log")"
wait_for "\"${CHORUS}\" --coordinator '${a2},${b}' --timeout 3 coordinators >/dev/null 2>&1" 15 \
  && pass "a leader again after the revocation" \
  || fail "no leader after the revocation: $("${CHORUS}" --coordinator "${a2},${b}" coordinators 2>&1)"
kill -0 "${b_pid}" 2>/dev/null && pass "b kept running after losing the leadership" \
  || fail "b exited on losing the leadership"

# --- SIGTERM stops b (leading or following) cleanly
kill -TERM "${b_pid}"
wait_exit "${b_pid}" 15 && pass "SIGTERM stops b" || fail "b did not exit on SIGTERM"
finish
