#!/usr/bin/env bash
# Tenants kept apart by the kernel (Note [Rank accounts] in
# worker/agent/rank_accounts.h), with real processes: two Unix users made
# here with useradd (removed when the test exits, however it exits), a
# coordinator whose token file maps two Chorus users to them (unix=), and a
# root chorus-worker. A program job of the first user runs as that user's
# uid and succeeds, and what it tries to read of the agent's secrets is
# refused: the agent's token file, the coordinator's token file and
# credential key, /proc/AGENT/environ, /proc/AGENT/fd; its CHORUS_TOKEN is
# its job's credential. The same with the agent given --rank_uid_range for
# a user the token file maps to no account: the job runs as a uid of the
# range, and once it has ended nothing runs as that uid and its directory
# is gone; a mapped user's job on that agent still runs as its own account.
# Then another user's job: the first user's program cannot read the second's
# checkpoints (in a 1777 shared directory and in the coordinator's store),
# list its job directory, or read its running rank's /proc environ and mem.
#
# Needs root (useradd, and an agent that may start processes as other
# uids); skipped otherwise.
#
# Usage (from Bazel): isolation_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ $(id -u) -ne 0 ]] || ! command -v useradd >/dev/null; then
  echo "skipped: needs root and useradd (it creates two Unix users and runs ranks as them)"
  exit 0
fi

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")

# --- a directory every uid may traverse (TMP may lie under a 0700 home):
# the rank program, the probe, the secrets (0600 root: refused by their
# mode, not by the path) and the agent's TMPDIR.
BASE=$(mktemp -d /tmp/chorus-isolation.XXXXXX)
on_exit 'rm -rf "${BASE}"'
chmod 0711 "${BASE}"
mkdir -m 0755 "${BASE}/bin"
mkdir -m 0711 "${BASE}/tmp"
cp "$(dirname "${WORKER}")/chorus-rank" "${BASE}/bin/chorus-rank"
chmod 0755 "${BASE}/bin/chorus-rank"

# --- two Unix users, unique to this run, removed on exit
USER_A="chiso$$a"
USER_B="chiso$$b"
remove_users() {
  local u
  for u in "${USER_A}" "${USER_B}"; do
    id -u "${u}" >/dev/null 2>&1 || continue
    pkill -KILL -u "${u}" 2>/dev/null  # userdel refuses a user that still runs something
    userdel "${u}" 2>/dev/null || { sleep 0.5; userdel "${u}" 2>/dev/null; }
    groupdel "${u}" 2>/dev/null
  done
}
on_exit remove_users
for u in "${USER_A}" "${USER_B}"; do
  useradd -M -U -s /usr/sbin/nologin "${u}" || { fail "useradd ${u}"; finish; }
done
UID_A=$(id -u "${USER_A}")
UID_B=$(id -u "${USER_B}")
# A uid range of one that no account uses.
RANGE_UID=$((1900000000 + $$ % 100000))
while getent passwd "${RANGE_UID}" >/dev/null; do RANGE_UID=$((RANGE_UID + 1)); done

admin_token=$(openssl rand -hex 24)
agent_token=$(openssl rand -hex 24)
alice_token=$(openssl rand -hex 24)
bob_token=$(openssl rand -hex 24)
carol_token=$(openssl rand -hex 24)
printf 'admin %s root\nagent %s\nuser %s alice unix=%s\nuser %s bob unix=%s\nuser %s carol\n' \
  "${admin_token}" "${agent_token}" "${alice_token}" "${USER_A}" "${bob_token}" "${USER_B}" \
  "${carol_token}" > "${BASE}/tokens"
echo "agent ${agent_token}" > "${BASE}/agent.token"
for who in admin alice bob carol; do
  eval "echo \"\${${who}_token}\"" > "${TMP}/${who}.token"
done
chmod 600 "${BASE}/tokens" "${BASE}/agent.token" "${TMP}"/*.token

start_coordinator -s "${BASE}/state" -- --token_file "${BASE}/tokens" || { fail "no port"; finish; }
addr=${COORDINATOR_ADDR}
c() { "${CHORUS}" --coordinator "${addr}" --timeout 5 "$@"; }

# --- the probe: what a user's program tries to read, each with its errno
# (bin/attempt.py: one line "probe: NAME READ" or "probe: NAME ERRNO" a try;
# in bin/, which every uid may list, as Python's imports need)
cat > "${BASE}/bin/attempt.py" <<'PY'
import errno
def attempt(name, action):
    try:
        action()
        print("probe:", name, "READ")
    except OSError as e:
        print("probe:", name, errno.errorcode.get(e.errno, e.errno))
def read(path):
    with open(path, "rb") as f:
        f.read(1)
PY
chmod 0644 "${BASE}/bin/attempt.py"
cat > "${BASE}/probe.py" <<'PY'
import os, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin"))
from attempt import attempt, read
agent = sys.argv[1]
print("probe: id -u", subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip())
print("probe: uid", os.getuid(), "gid", os.getgid(), "groups", sorted(os.getgroups()))
attempt("agent_token", lambda: read(sys.argv[2]))
attempt("coordinator_tokens", lambda: read(sys.argv[3]))
attempt("credential_key", lambda: read(sys.argv[4]))
attempt("agent_environ", lambda: read("/proc/%s/environ" % agent))
attempt("agent_fd_list", lambda: os.listdir("/proc/%s/fd" % agent))
for fd in range(0, 8):
    attempt("agent_fd_%d" % fd, lambda: read("/proc/%s/fd/%d" % (agent, fd)))
token = os.environ.get("CHORUS_TOKEN", "")
print("probe: CHORUS_TOKEN of", token.split(":")[1] if token.startswith("chorus-job:") else "?",
      "TOKEN_FILE", os.environ.get("CHORUS_TOKEN_FILE", "-"), "TMPDIR", os.environ.get("TMPDIR"))
print("probe: tmpdir owner", os.stat(os.environ["TMPDIR"]).st_uid)
PY
chmod 0755 "${BASE}/probe.py"

# start_worker NAME [FLAG...]: a root agent (SLOTS slots, default 1) with the
# rank program above and the agent token, from --token_file or, with TOKEN_IN_ENV=1, from
# CHORUS_TOKEN; sets WORKER_PID.
start_worker() {
  local name=$1 auth=(--token_file "${BASE}/agent.token")
  shift
  [[ "${TOKEN_IN_ENV:-0}" == 1 ]] && auth=()
  env TMPDIR="${BASE}/tmp" ${TOKEN_IN_ENV:+CHORUS_TOKEN="${agent_token}"} "${WORKER}" \
    --coordinator "${addr}" --slots "${SLOTS:-1}" --host "${name}" "${auth[@]}" \
    --rank_binary "${BASE}/bin/chorus-rank" "$@" 2>"${TMP}/${name}.log" &
  WORKER_PID=$!
  track_pid "${WORKER_PID}"
  wait_for 'grep -q "connected to ${addr} as agent-" "${TMP}/${name}.log"' 20 \
    || fail "agent ${name} did not connect: $(tail -3 "${TMP}/${name}.log")"
}

stop_worker() { kill -TERM "${WORKER_PID}"; wait_exit "${WORKER_PID}" 20; }

# run_probe USER JOB: submits the probe as USER (its token in TMP) and waits;
# sets LOGS to the job's output and STATE to its final state.
run_probe() {
  local spec="${TMP}/probe-$2.textproto"
  printf 'name: "probe"\nprogram { argv: ["/usr/bin/python3", "%s", "%s", "%s", "%s", "%s"] working_dir: "%s" }\nresources { min_ranks: 1 max_ranks: 1 }\n' \
    "${BASE}/probe.py" "${WORKER_PID}" "${BASE}/agent.token" "${BASE}/tokens" \
    "${BASE}/state/job_credentials.key" "${BASE}" > "${spec}"
  local started=$(_lib_now_us)
  timeout "$(slack_seconds 60)" "${CHORUS}" --coordinator "${addr}" --token_file "${TMP}/$1.token" \
    submit --wait "${spec}" >"${TMP}/$2.out" 2>"${TMP}/$2.err"
  STATE=$(c --token_file "${TMP}/admin.token" status "$2" --json 2>/dev/null | json_get - job.state)
  LOGS=$(c --token_file "${TMP}/admin.token" logs "$2" 2>&1)
  echo "$2 ($1): ${STATE} in $(elapsed_since "${started}") s"
}

# check_refusals JOB: each secret the probe tried is refused or absent.
check_refusals() {
  local name got
  for name in agent_token coordinator_tokens credential_key agent_environ agent_fd_list \
    agent_fd_0 agent_fd_1 agent_fd_2 agent_fd_3; do
    got=$(sed -n "s/.*probe: ${name} \([A-Z0-9]*\)\$/\1/p" <<<"${LOGS}" | head -1)
    [[ "${got}" == EACCES || "${got}" == EPERM || "${got}" == ENOENT ]] \
      && pass "$1: ${name} refused (${got})" || fail "$1: ${name}: '${got}' logs=${LOGS}"
  done
  [[ "${LOGS}" == *"probe: CHORUS_TOKEN of $1 TOKEN_FILE -"* ]] \
    && pass "$1: CHORUS_TOKEN is the job's credential, CHORUS_TOKEN_FILE unset" \
    || fail "$1: token variables: ${LOGS}"
  [[ "${LOGS}" != *"${agent_token}"* && "${LOGS}" != *"${admin_token}"* ]] \
    && pass "$1: no token of the agent or the coordinator in the output" \
    || fail "$1: a secret token reached the program's output"
}

# --- 1. mapped users: alice's job runs as USER_A
start_worker plain
grep -Eq "^W[0-9].*ranks run as root, like this agent, unless the coordinator's token file maps" \
  "${TMP}/plain.log" && pass "the agent's start warns that unmapped jobs run as root" \
  || fail "no warning at the agent's start: $(head -5 "${TMP}/plain.log")"
run_probe alice job-000001
[[ "${STATE}" == SUCCEEDED ]] && pass "alice's probe SUCCEEDED" || fail "alice: ${STATE} $(cat "${TMP}/job-000001.err") ${LOGS}"
[[ "${LOGS}" == *"probe: id -u ${UID_A}"* \
   && "${LOGS}" == *"probe: uid ${UID_A} gid $(id -g "${USER_A}") groups []"* ]] \
  && pass "alice's program ran as ${USER_A} (uid ${UID_A}), its group, no other" || fail "alice uid: ${LOGS}"
[[ "${LOGS}" == *"probe: tmpdir owner ${UID_A}"* ]] && pass "its TMPDIR belongs to ${USER_A}" \
  || fail "alice TMPDIR: ${LOGS}"
check_refusals job-000001
stop_worker

# --- 2. --rank_uid_range: carol (mapped to none) gets a uid of the range;
# this agent's token comes from its environment, which keeps none of it.
TOKEN_IN_ENV=1 start_worker ranged --rank_uid_range "${RANGE_UID}-${RANGE_UID}"
! tr '\0' '\n' <"/proc/${WORKER_PID}/environ" | grep -q "${agent_token}" \
  && pass "the agent's CHORUS_TOKEN is gone from /proc/AGENT/environ once read" \
  || fail "the agent's token is still in /proc/${WORKER_PID}/environ"
grep -q "else each job gets a uid of its own from --rank_uid_range=${RANGE_UID}-${RANGE_UID}" \
  "${TMP}/ranged.log" && ! grep -q "ranks run as root" "${TMP}/ranged.log" \
  && pass "the agent says how it picks ranks' accounts, and no warning" \
  || fail "ranged agent's start: $(head -5 "${TMP}/ranged.log")"
run_probe carol job-000002
[[ "${STATE}" == SUCCEEDED ]] && pass "carol's probe SUCCEEDED" || fail "carol: ${STATE} $(cat "${TMP}/job-000002.err") ${LOGS}"
[[ "${LOGS}" == *"probe: id -u ${RANGE_UID}"* \
   && "${LOGS}" == *"probe: uid ${RANGE_UID} gid ${RANGE_UID} groups []"* ]] \
  && pass "carol's program ran as uid ${RANGE_UID} of --rank_uid_range" || fail "carol uid: ${LOGS}"
check_refusals job-000002
wait_for '! pgrep -u "${RANGE_UID}" >/dev/null && ! compgen -G "${BASE}/tmp/chorus-*" >/dev/null' 20 \
  && pass "once the job ended nothing runs as uid ${RANGE_UID} and its directory is gone" \
  || fail "leftovers of uid ${RANGE_UID}: $(pgrep -u "${RANGE_UID}" -a) $(ls "${BASE}/tmp")"
run_probe bob job-000003
[[ "${STATE}" == SUCCEEDED && "${LOGS}" == *"probe: uid ${UID_B} "* ]] \
  && pass "on that agent bob's job still runs as his mapped account (uid ${UID_B})" \
  || fail "bob: ${STATE} ${LOGS}"
stop_worker

# --- 3. another user's job: bob's checkpoints (in a shared directory and in
# the coordinator's store) and bob's running rank are out of alice's reach.
# Both users' ranks run on one agent; bob's trainer runs as bob, so it is
# copied beside chorus-rank where every uid may execute it.
cp "$(dirname "${WORKER}")/chorus-trainer" "${BASE}/bin/chorus-trainer"
chmod 0755 "${BASE}/bin/chorus-trainer"
SHARED="${BASE}/shared"
mkdir "${SHARED}" && chmod 1777 "${SHARED}"
SLOTS=2 start_worker pair
[[ ${failures} -eq 0 ]] || finish  # no agent: every job below would wait out its timeout
train_spec() {  # $1 = name, $2 = extra checkpoint fields
  printf 'name: "%s"\nmodel { mlp { hidden_sizes: [16] } }\ndata { synthetic { num_samples: 256 input_shape: [8] num_classes: 2 seed: 3 } }\ntraining { batch_size_per_rank: 16 epochs: 1 seed: 1 }\noptimizer { kind: SGD lr: 0.1 }\ncheckpoint { every_steps: 4 keep_last: 0 %s }\nresources { min_ranks: 1 max_ranks: 1 }\n' "$1" "$2"
}
train_spec shared "storage: SHARED_DIR shared_dir: '${SHARED}'" >"${TMP}/bob-shared.textproto"
train_spec stored "" >"${TMP}/bob-stored.textproto"
for spec in bob-shared bob-stored; do
  timeout "$(slack_seconds 90)" "${CHORUS}" --coordinator "${addr}" --token_file "${TMP}/bob.token" \
    submit --wait "${TMP}/${spec}.textproto" >"${TMP}/${spec}.out" 2>"${TMP}/${spec}.err" \
    || fail "bob's ${spec} job: $(cat "${TMP}/${spec}.err") $(tail -5 "${TMP}/pair.log")"
done
bob_shared=$(find "${SHARED}" -name model.pt -path "*job-000004*" | head -1)
bob_stored=$(find "${BASE}/state" -type f -path "*job-000005*" | head -1)
[[ -n "${bob_shared}" && -n "${bob_stored}" && "$(stat -c %u "${bob_shared}")" == "${UID_B}" ]] \
  && pass "bob's jobs left a SHARED_DIR checkpoint (owned by ${USER_B}) and one in the coordinator's store" \
  || fail "bob's checkpoints: shared '${bob_shared}' stored '${bob_stored}' $(ls -laR "${SHARED}" | head -20)"
printf 'name: "sleeper"\nprogram { argv: ["/bin/sleep", "%s"] working_dir: "%s" }\nresources { min_ranks: 1 max_ranks: 1 }\n' \
  "$(slack_seconds 60)" "${BASE}" >"${TMP}/bob-sleeper.textproto"
"${CHORUS}" --coordinator "${addr}" --token_file "${TMP}/bob.token" submit "${TMP}/bob-sleeper.textproto" \
  >"${TMP}/bob-sleeper.out" 2>&1 || fail "bob's sleeper: $(cat "${TMP}/bob-sleeper.out")"
wait_for 'pgrep -u "${UID_B}" -x sleep >/dev/null' 30 || fail "bob's sleeper never ran as ${USER_B}"
bob_rank=$(pgrep -u "${UID_B}" -f chorus-rank | head -1)
cat > "${BASE}/neighbour.py" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin"))
from attempt import attempt, read
shared_file, stored_file, rank = sys.argv[1:4]
attempt("shared_checkpoint", lambda: read(shared_file))
attempt("shared_job_dir", lambda: os.listdir(os.path.dirname(os.path.dirname(shared_file))))
attempt("stored_checkpoint", lambda: read(stored_file))
attempt("rank_environ", lambda: read("/proc/%s/environ" % rank))
attempt("rank_mem", lambda: read("/proc/%s/mem" % rank))
PY
chmod 0755 "${BASE}/neighbour.py"
printf 'name: "neighbour"\nprogram { argv: ["/usr/bin/python3", "%s", "%s", "%s", "%s"] working_dir: "%s" }\nresources { min_ranks: 1 max_ranks: 1 }\n' \
  "${BASE}/neighbour.py" "${bob_shared}" "${bob_stored}" "${bob_rank}" "${BASE}" >"${TMP}/alice-neighbour.textproto"
timeout "$(slack_seconds 60)" "${CHORUS}" --coordinator "${addr}" --token_file "${TMP}/alice.token" \
  submit --wait "${TMP}/alice-neighbour.textproto" >"${TMP}/alice-neighbour.out" 2>&1
LOGS=$(c --token_file "${TMP}/admin.token" logs job-000007 2>&1)
for name in shared_checkpoint shared_job_dir stored_checkpoint rank_environ rank_mem; do
  got=$(sed -n "s/.*probe: ${name} \([A-Z0-9]*\)\$/\1/p" <<<"${LOGS}" | head -1)
  [[ "${got}" == EACCES || "${got}" == EPERM ]] \
    && pass "alice's program cannot read bob's ${name} (${got})" || fail "bob's ${name}: '${got}' logs=${LOGS}"
done
c --token_file "${TMP}/bob.token" cancel job-000006 >/dev/null 2>&1 || fail "cancel bob's sleeper"
wait_for '! pgrep -u "${UID_B}" >/dev/null' 30 || fail "bob's sleeper still runs: $(pgrep -a -u "${UID_B}")"
stop_worker
kill -TERM "${COORDINATOR_PID}"
wait_exit "${COORDINATOR_PID}" 20 || fail "the coordinator did not stop on SIGTERM"

assert_no_leftovers "the isolation test"
wait_for '! pgrep -f -- "${BASE}" >/dev/null && ! pgrep -u "${UID_A},${UID_B},${RANGE_UID}" >/dev/null' 10 \
  && pass "nothing runs as the test's accounts or from ${BASE}" \
  || fail "left running: $(pgrep -a -u "${UID_A},${UID_B},${RANGE_UID}") $(pgrep -af -- "${BASE}")"
finish
