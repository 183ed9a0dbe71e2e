#!/usr/bin/env bash
# Security end to end with real processes: a coordinator with tokens and
# mutual TLS (a CA, server and client certificates made here with openssl),
# the auth matrix through the chorus CLI, a job trained by a chorus-worker
# whose ranks present their job's credential (never the agent's worker
# token) and the client certificate they inherit, what a program's
# CHORUS_TOKEN can do, users who see and cancel only their own jobs
# (`chorus whoami`, a refused cancel), and token files readable by others
# refused.
#
# Usage (from Bazel): security_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$1
CHORUS=$2
WORKER=$3

# --- a throwaway CA, a server certificate for 127.0.0.1 and a client certificate
pki="${TMP}/pki"
mkdir -p "${pki}"
(
  cd "${pki}" || exit 1
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=chorus test CA" \
    -keyout ca.key -out ca.pem
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
    -extfile server.ext -out server.pem
  openssl req -newkey rsa:2048 -nodes -subj "/CN=chorus client" -keyout client.key -out client.csr
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -out client.pem
  # A second CA whose certificates the coordinator must not accept.
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=stranger" -keyout other.key -out other.pem
) >"${TMP}/openssl.log" 2>&1 || { cat "${TMP}/openssl.log" >&2; fail "openssl"; finish; }

admin_token=$(openssl rand -hex 24)
worker_token=$(openssl rand -hex 24)
alice_token=$(openssl rand -hex 24)
bob_token=$(openssl rand -hex 24)
# An old-style admin and worker line, and two users.
printf '# roles\nadmin %s\nworker %s\nuser %s alice\nuser %s bob\n' "${admin_token}" "${worker_token}" \
  "${alice_token}" "${bob_token}" > "${TMP}/tokens"
echo "${admin_token}" > "${TMP}/admin.token"
echo "${alice_token}" > "${TMP}/alice.token"
echo "${bob_token}" > "${TMP}/bob.token"
echo "worker ${worker_token}" > "${TMP}/worker.token"
echo "0000000000000000000000000000" > "${TMP}/bogus.token"
# Token files are private (a group- or world-readable one is refused).
chmod 600 "${TMP}/tokens" "${TMP}/admin.token" "${TMP}/worker.token" "${TMP}/bogus.token" \
  "${TMP}/alice.token" "${TMP}/bob.token"

start_coordinator -s "${TMP}/state" -- \
  --token_file "${TMP}/tokens" --tls_cert "${pki}/server.pem" --tls_key "${pki}/server.key" \
  --tls_client_ca "${pki}/ca.pem" || { fail "no port"; finish; }
addr=${COORDINATOR_ADDR}
grep -q "TLS, client certificates required), tokens required" "${TMP}/coordinator.log" \
  && pass "coordinator says it requires TLS, client certificates and tokens" \
  || fail "startup line: $(grep listening "${TMP}/coordinator.log")"
tls=(--tls_ca "${pki}/ca.pem" --tls_cert "${pki}/client.pem" --tls_key "${pki}/client.key")
c() { "${CHORUS}" --coordinator "${addr}" --timeout 3 "$@"; }

# --- transport: plaintext, no client certificate, a foreign CA all fail
out=$(c ping 2>&1); rc=$?
[[ ${rc} -eq 1 ]] && pass "plaintext client is refused" || fail "plaintext ping rc=${rc} out='${out}'"
out=$(c --tls_ca "${pki}/ca.pem" ping 2>&1); rc=$?
[[ ${rc} -eq 1 ]] && pass "TLS without a client certificate is refused" || fail "no-cert ping rc=${rc} out='${out}'"
out=$(c --tls_ca "${pki}/other.pem" --tls_cert "${pki}/client.pem" --tls_key "${pki}/client.key" ping 2>&1); rc=$?
[[ ${rc} -eq 1 ]] && pass "a server the CA did not sign is not trusted" || fail "foreign CA ping rc=${rc} out='${out}'"
out=$(c "${tls[@]}" ping 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *SERVING ]] && pass "mTLS ping (health needs no token)" || fail "mTLS ping rc=${rc} out='${out}'"
# A list of coordinators (only this one up; nothing listens on port 1): the channel dials IP
# addresses and checks each certificate against the first coordinator's name.
out=$("${CHORUS}" --coordinator "${addr},127.0.0.1:1" --timeout 3 "${tls[@]}" \
  --token_file "${TMP}/admin.token" coordinators 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"${addr}"*leader* ]] && pass "mTLS over a coordinator list finds the leader" \
  || fail "mTLS coordinators rc=${rc} out='${out}'"
out=$(c --tls_ca /nonexistent/ca.pem ping 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"--tls_ca /nonexistent/ca.pem: cannot read it"* ]] \
  && pass "a missing CA file is a clear error" || fail "missing CA rc=${rc} out='${out}'"

# --- tokens: none, unknown, worker role, admin role
printf 'model { mlp { hidden_sizes: [16] } }\ndata { synthetic { num_samples: 512 input_shape: [8] num_classes: 2 } }\ntraining { batch_size_per_rank: 16 epochs: 2 }\nresources { min_ranks: 2 max_ranks: 2 }\n' > "${TMP}/job.textproto"
out=$(c "${tls[@]}" submit "${TMP}/job.textproto" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"requires a token"* ]] && pass "no token: UNAUTHENTICATED" || fail "no token rc=${rc} out='${out}'"
out=$(c "${tls[@]}" --token_file "${TMP}/bogus.token" submit "${TMP}/job.textproto" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"not valid for this coordinator"* ]] && pass "unknown token: UNAUTHENTICATED" \
  || fail "bogus token rc=${rc} out='${out}'"
out=$(c "${tls[@]}" --token_file "${TMP}/worker.token" submit "${TMP}/job.textproto" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"needs a user or admin token"* ]] && pass "worker token cannot submit: PERMISSION_DENIED" \
  || fail "worker submit rc=${rc} out='${out}'"
out=$(c "${tls[@]}" --token_file "${TMP}/worker.token" jobs 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"needs a user or admin token"* ]] && pass "worker token cannot list jobs" \
  || fail "worker jobs rc=${rc} out='${out}'"
out=$(CHORUS_TOKEN="${admin_token}" c "${tls[@]}" jobs --json 2>&1); rc=$?
[[ ${rc} -eq 0 ]] && json_get - '' <<<"${out}" >/dev/null && ! json_get - 'jobs[*].job_id' <<<"${out}" >/dev/null \
  && pass "refused submits created no job" || fail "jobs rc=${rc} out='${out}'"

# --- a worker with the worker token and a client certificate trains a job
"${WORKER}" --coordinator "${addr}" --slots 2 --token_file "${TMP}/worker.token" "${tls[@]}" \
  2>"${TMP}/worker.log" &
worker_pid=$!
track_pid "${worker_pid}"
out=$(timeout 120 "${CHORUS}" --coordinator "${addr}" "${tls[@]}" --token_file "${TMP}/admin.token" \
  submit --wait "${TMP}/job.textproto" 2>"${TMP}/submit.err"); rc=$?
[[ ${rc} -eq 0 && "${out}" == "job-000001" ]] && pass "job trained over mTLS with tokens (ranks hold their job's credential)" \
  || fail "secure job rc=${rc} out='${out}' err=$(tail -3 "${TMP}/submit.err") worker=$(tail -5 "${TMP}/worker.log")"
# A TLS coordinator has no (plaintext) checkpoint data port: the final
# checkpoint went over the gRPC Upload stream, encrypted.
grep -q "the coordinator takes checkpoints over gRPC only" "${TMP}/worker.log" \
  && grep -q "checkpoint step [0-9]*: sent [0-9]* bytes in" "${TMP}/worker.log" \
  && pass "under TLS the checkpoint was uploaded over gRPC" \
  || fail "checkpoint upload under TLS: $(grep -i checkpoint "${TMP}/worker.log" | tail -3)"
out=$(c "${tls[@]}" --token_file "${TMP}/admin.token" logs job-000001 --rank 0 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == *"[rank 0]"* ]] && pass "logs with the admin token" || fail "logs rc=${rc} out='${out}'"

# --- a program's CHORUS_TOKEN is its job's credential: it cannot list jobs
cat > "${TMP}/probe.sh" <<EOF
#!/bin/sh
job=\${CHORUS_TOKEN#chorus-job:}
echo "probe: CHORUS_TOKEN is the credential of \${job%%:*}; CHORUS_TOKEN_FILE='\${CHORUS_TOKEN_FILE}'"
if "$(realpath "${CHORUS}")" --coordinator "\${CHORUS_COORDINATOR}" --timeout 5 jobs >/dev/null 2>"${TMP}/probe.err"; then
  echo "probe: listed the jobs"
else
  echo "probe: jobs refused: \$(cat "${TMP}/probe.err")"
fi
EOF
chmod +x "${TMP}/probe.sh"
printf 'program { argv: "%s" }\nresources { min_ranks: 1 max_ranks: 1 }\n' "${TMP}/probe.sh" > "${TMP}/probe.textproto"
out=$(timeout 60 "${CHORUS}" --coordinator "${addr}" "${tls[@]}" --token_file "${TMP}/admin.token" \
  submit --wait "${TMP}/probe.textproto" 2>"${TMP}/probe_submit.err"); rc=$?
logs=$(c "${tls[@]}" --token_file "${TMP}/admin.token" logs job-000002 2>&1)
[[ ${rc} -eq 0 && "${logs}" == *"probe: CHORUS_TOKEN is the credential of job-000002; CHORUS_TOKEN_FILE=''"* ]] \
  && pass "a program's CHORUS_TOKEN is its own job's credential, not the worker token" \
  || fail "program credential rc=${rc} err=$(tail -3 "${TMP}/probe_submit.err") logs=${logs}"
[[ "${logs}" == *"probe: jobs refused: "*"needs a user or admin token"*"credential of job job-000002"* ]] \
  && pass "a program's CHORUS_TOKEN cannot make admin calls" || fail "program admin call: ${logs}"
[[ "${logs}" != *"${worker_token}"* ]] && pass "the worker token appears nowhere in the program's output" \
  || fail "the worker token reached the program"
kill -TERM "${worker_pid}"; wait "${worker_pid}" 2>/dev/null

# --- users: whoami, and a job only its owner (or an admin) may cancel
out=$(c "${tls[@]}" --token_file "${TMP}/alice.token" whoami 2>&1); rc=$?
[[ ${rc} -eq 0 && "${out}" == "alice (user)" ]] && pass "whoami: alice (user)" || fail "whoami rc=${rc} out='${out}'"
out=$(c "${tls[@]}" --token_file "${TMP}/admin.token" whoami 2>&1)
[[ "${out}" == "admin (admin)" ]] && pass "whoami: an old admin line is the user admin" || fail "admin whoami '${out}'"
job=$(c "${tls[@]}" --token_file "${TMP}/alice.token" submit "${TMP}/job.textproto" 2>/dev/null)
[[ "${job}" == "job-000003" ]] && pass "alice submits ${job}" || fail "alice submit: ${job}"
out=$(c "${tls[@]}" --token_file "${TMP}/bob.token" cancel "${job}" 2>&1); rc=$?
[[ ${rc} -eq 1 && "${out}" == *"${job} belongs to alice; only alice or an admin may cancel it"* ]] \
  && pass "bob cannot cancel alice's job" || fail "bob cancel rc=${rc} out='${out}'"
out=$(c "${tls[@]}" --token_file "${TMP}/bob.token" jobs 2>&1)
[[ $(grep "^${job} " <<<"${out}") =~ ^${job}\ +[^\ ]+\ +alice\ +(PENDING|RUNNING) ]] \
  && pass "bob's listing shows alice's job, its owner and state" || fail "bob jobs: ${out}"
out=$(c "${tls[@]}" --token_file "${TMP}/alice.token" cancel "${job}" 2>&1); rc=$?
[[ ${rc} -eq 0 ]] && pass "alice cancels her job" || fail "alice cancel rc=${rc} out='${out}'"

# --- a token file others can read is refused, saying how to fix it
cp "${TMP}/admin.token" "${TMP}/open.token" && chmod 644 "${TMP}/open.token"
out=$(c "${tls[@]}" --token_file "${TMP}/open.token" jobs 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"--token_file ${TMP}/open.token is readable by others (mode 0644); chmod 600 ${TMP}/open.token"* ]] \
  && pass "a world-readable token file is refused with the chmod that fixes it" \
  || fail "open token file rc=${rc} out='${out}'"

# An agent without a token is turned away with the reason.
out=$("${WORKER}" --coordinator "${addr}" --slots 1 "${tls[@]}" --connect_timeout 3 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"requires a token"* ]] && pass "agent without a token is refused" \
  || fail "tokenless agent rc=${rc} out='$(tail -3 <<<"${out}")'"

# --- no token ever reaches the coordinator's log
if grep -q -e "${admin_token}" -e "${worker_token}" -e "000000000000000000000000" "${TMP}/coordinator.log"; then
  fail "a token appears in the coordinator log"
else
  pass "no token in the coordinator log"
fi

# --- listening beyond loopback needs tokens; with them it starts
out=$("${COORDINATOR}" --listen 0.0.0.0:0 --state_dir "${TMP}/open" 2>&1); rc=$?
[[ ${rc} -ne 0 && "${out}" == *"Pass --token_file FILE"* ]] && pass "0.0.0.0 without tokens is refused" \
  || fail "open rc=${rc} out='${out}'"
if start_coordinator -l 0.0.0.0:0 -s "${TMP}/open2" -p "${TMP}/port2" -o "${TMP}/open2.log" \
     -- --token_file "${TMP}/tokens"; then
  open_pid=${COORDINATOR_PID}
  out=$("${CHORUS}" --coordinator "127.0.0.1:${COORDINATOR_PORT}" --token_file "${TMP}/admin.token" jobs 2>&1); rc=$?
  [[ ${rc} -eq 0 ]] && grep -q "in plaintext" "${TMP}/open2.log" \
    && pass "0.0.0.0 with tokens serves, warning that there is no TLS" || fail "open2 rc=${rc} out='${out}'"
  kill -TERM "${open_pid}"; wait "${open_pid}" 2>/dev/null
else
  fail "0.0.0.0 with tokens did not start: $(cat "${TMP}/open2.log")"
fi

finish
