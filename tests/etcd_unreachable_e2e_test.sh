#!/usr/bin/env bash
# End to end, issue 56: a coordinator on etcd state that cannot reach etcd
# says so. It starts (etcd may come later), follows, and answers `chorus
# ping` NOT_SERVING with the reason its calls are refused with, instead of
# SERVING (Note [A follower that cannot elect] in
# coordinator/service/follower_server.h); `chorus submit` is refused naming etcd.
# (A --checkpoint_dir that is not the cluster's is refused at start:
# coordinator/etcd/etcd_coordinator_state_test.cc, with a real etcd.)
#
# Usage (from Bazel): etcd_unreachable_e2e_test.sh CHORUS COORDINATOR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
COORDINATOR=$(realpath "$2")

# A port nothing listens on: bound, then closed.
port=$("${CHORUS_TEST_PYTHON}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_coordinator -- --state "etcd://127.0.0.1:${port}/cut-off" \
  --checkpoint_dir "${TMP}/checkpoints" \
  && pass "a coordinator on an unreachable etcd starts and listens" \
  || { fail "no coordinator"; finish; }
ping_out=""
wait_for 'ping_out=$("${CHORUS}" ping --coordinator "${COORDINATOR_ADDR}" 2>&1); [[ "${ping_out}" == *NOT_SERVING* ]]' 15
[[ "${ping_out}" == "${COORDINATOR_ADDR}: NOT_SERVING (${COORDINATOR_ADDR} says: no coordinator can lead: etcd at 127.0.0.1:${port}"*"unreachable"* ]] \
  && pass "chorus ping: ${ping_out}" || fail "chorus ping: '${ping_out}'"
"${CHORUS}" ping --coordinator "${COORDINATOR_ADDR}" >/dev/null 2>&1
[[ $? -eq 1 ]] && pass "chorus ping exits 1" || fail "chorus ping exit code $?"
json=$("${CHORUS}" ping --json --coordinator "${COORDINATOR_ADDR}" 2>&1)
[[ "$(json_get - status <<<"${json}")" == NOT_SERVING && "$(json_get - reason <<<"${json}")" == *"etcd at 127.0.0.1:${port}"* ]] \
  && pass "chorus ping --json gives the status and the reason" || fail "ping --json: ${json}"
cat > "${TMP}/job.textproto" <<SPEC
model { mlp {} } data { synthetic {} } resources { min_ranks: 1 max_ranks: 1 }
SPEC
submit=$("${CHORUS}" submit --coordinator "${COORDINATOR_ADDR}" --timeout 5 "${TMP}/job.textproto" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${submit}" == *"no coordinator can lead: etcd at 127.0.0.1:${port}"* ]] \
  && pass "chorus submit is refused naming etcd" || fail "submit rc=${rc}: ${submit}"
kill -0 "${COORDINATOR_PID}" && pass "the coordinator keeps running, waiting for etcd" \
  || fail "the coordinator exited: $(tail -3 "${TMP}/coordinator.log")"
finish
