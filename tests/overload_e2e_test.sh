#!/usr/bin/env bash
# Overload end to end with the real binaries: a coordinator started under a
# low soft open-file limit raises it to the hard limit; 1500 idle TCP
# connections on each of its gRPC port and its checkpoint data port leave
# `chorus ping` and `chorus submit` working; the queue limit refuses one job
# too many with the flag to change; and once the idle peers go, the
# coordinator's descriptors go with them. (The hostile data-port peers, store
# quotas and upload names are covered by //coordinator:overload_test.)
#
# Usage (from Bazel): overload_e2e_test.sh COORDINATOR CHORUS
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$1
CHORUS=$2
IDLE=1500

hard=$(ulimit -H -n)
if [[ "${hard}" != unlimited && "${hard}" -lt $((2 * IDLE + 500)) ]]; then
  fail "the hard open-file limit ${hard} is too low for ${IDLE} idle connections per port"
  finish
fi

# --- the coordinator raises its soft limit itself
ulimit -S -n 1024
start_coordinator -- --max_pending_jobs 3 || { fail "no port"; finish; }
ulimit -S -n "${hard}"
soft_now=$(awk '/^Max open files/ {print $4}' "/proc/${COORDINATOR_PID}/limits")
hard_now=$(awk '/^Max open files/ {print $5}' "/proc/${COORDINATOR_PID}/limits")
[[ "${soft_now}" == "${hard_now}" && "${soft_now}" != 1024 ]] \
  && pass "started with a soft limit of 1024 files, the coordinator raised it to ${soft_now}" \
  || fail "coordinator open-file limit: soft ${soft_now}, hard ${hard_now}"
grep -q "open-file limit ${hard_now}" "${TMP}/coordinator.log" \
  && pass "the coordinator logs its open-file limit" || fail "no open-file limit in the log"
data_port=$(sed -n 's/.*checkpoint data port \([0-9]*\).*/\1/p' "${TMP}/coordinator.log" | head -1)
[[ -n "${data_port}" ]] && pass "data port ${data_port}" || { fail "no data port in the log"; finish; }
c() { "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" --timeout 5 "$@"; }

# --- idle peers: connect and never send a byte
fds_before=$(ls "/proc/${COORDINATOR_PID}/fd" | wc -l)
(
  for ((i = 0; i < IDLE; i++)); do
    exec {fd}<>"/dev/tcp/127.0.0.1/${COORDINATOR_PORT}" || exit 1
    exec {fd}<>"/dev/tcp/127.0.0.1/${data_port}" || exit 1
  done
  echo ready >"${TMP}/idle.ready"
  exec sleep 120  # holds the connections; killed below
) 2>"${TMP}/idle.log" &
idle_pid=$!
track_pid "${idle_pid}"
wait_for_file "${TMP}/idle.ready" 60 && pass "${IDLE} idle connections on each port" \
  || { fail "idle connections: $(cat "${TMP}/idle.log")"; finish; }

start_us=$(_lib_now_us)
out=$(c ping 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *SERVING ]] && pass "chorus ping answers among idle connections" \
  || fail "ping rc=${rc} out='${out}'"
printf 'model { mlp {} }\ndata { synthetic {} }\n' > "${TMP}/job.textproto"
for i in 1 2 3; do
  out=$(c submit "${TMP}/job.textproto" 2>/dev/null); rc=$?
  [[ ${rc} -eq 0 && "${out}" == "job-00000${i}" ]] || fail "submit ${i}: rc=${rc} out='${out}'"
done
elapsed_ms=$((($(_lib_now_us) - start_us) / 1000))
[[ ${elapsed_ms} -lt 15000 ]] && pass "ping and three submissions took ${elapsed_ms} ms" \
  || fail "ping and submissions took ${elapsed_ms} ms"

# --- the queue limit
out=$(c submit "${TMP}/job.textproto" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"the coordinator's queue is full: 3 jobs are pending, the limit is 3 (coordinator flag --max_pending_jobs)"* ]] \
  && pass "a fourth pending job is refused with the flag to change" \
  || fail "fourth submit rc=${rc} out='${out}'"
c cancel job-000001 >/dev/null 2>&1 || fail "cancel"
out=$(c submit "${TMP}/job.textproto" 2>/dev/null); rc=$?
[[ ${rc} -eq 0 && "${out}" == job-000004 ]] && pass "a cancelled job makes room" \
  || fail "submit after cancel rc=${rc} out='${out}'"

# --- the idle peers go; so do the coordinator's descriptors for them
kill "${idle_pid}" 2>/dev/null
wait "${idle_pid}" 2>/dev/null
fds_now=$(ls "/proc/${COORDINATOR_PID}/fd" | wc -l)
wait_for 'fds_now=$(ls "/proc/${COORDINATOR_PID}/fd" | wc -l); [[ ${fds_now} -le $((fds_before + 16)) ]]' 20 \
  && pass "descriptors back to ${fds_now} (${fds_before} before the idle connections)" \
  || fail "coordinator holds ${fds_now} descriptors, ${fds_before} before the idle connections"
out=$(c ping 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *SERVING ]] && pass "still serving" || fail "ping after: '${out}'"
kill -0 "${COORDINATOR_PID}" 2>/dev/null && pass "coordinator alive" || fail "coordinator died"

# --- the limits and their defaults are in --help
help=$("${COORDINATOR}" --help 2>&1)
missing=0
for flag in "--max_pending_jobs INT:POSITIVE=5000" "--store_max_keys_per_job INT:POSITIVE=100000" \
  "--store_max_bytes_per_job INT:POSITIVE=268435456" "--store_max_value_bytes INT:INT in [1 - 32505856]=16777216" \
  "--checkpoint_max_upload_bytes INT:POSITIVE=68719476736" \
  "--checkpoint_data_hello_timeout_seconds FLOAT:POSITIVE=10" \
  "--checkpoint_data_timeout_seconds FLOAT:POSITIVE=60"; do
  [[ "${help}" == *"${flag}"* ]] || { fail "--help lacks '${flag}'"; missing=1; }
done
[[ ${missing} -eq 0 ]] && pass "--help lists the limits with their defaults"
finish
