#!/usr/bin/env bash
# No secret, checkpoint or log Chorus writes is readable by another local
# user, whatever the umask (issue 57; Note [Private files] in
# common/private_files.h, Note [A shared checkpoint directory] in
# checkpoint/shared_dir_storage.cc). Under umask 000:
#   * `chorus up --state_dir` with a SHARED_DIR job: the state directory,
#     its tokens, job_credentials.key, the coordinator's database,
#     coordinator.log and worker.log, and the job's shared checkpoint
#     directory are 0700/0600; the shared root (1777, as several users
#     would share it) and the cluster's directory in it keep the sticky bit;
#   * a coordinator with --checkpoint_dir: every job's checkpoint files
#     0600 in 0700 directories, and `chorus export` still works;
#   * a world-writable shared root without the sticky bit fails the job
#     with a reason that says what to do;
#   * as root: a throwaway user (useradd, removed at exit) gets "Permission
#     denied" reading a checkpoint file of each kind, the credential key and
#     both logs, while a 0644 file beside them is readable to it.
#
# Usage (from Bazel): file_modes_e2e_test.sh CHORUS COORDINATOR WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
COORDINATOR=$(realpath "$2")
WORKER=$(realpath "$3")
umask 000

# The trees live under a directory every user may enter, so that a refusal
# the throwaway user meets comes from the modes Chorus gave, not from the
# test's own private TMP.
ROOT=$(mktemp -d /tmp/chorus-file-modes.XXXXXX)
chmod 0755 "${ROOT}"
on_exit "rm -rf '${ROOT}'"
SHARED="${ROOT}/shared"
mkdir "${SHARED}" && chmod 1777 "${SHARED}"

spec() {  # $1 = name, $2 = extra checkpoint fields
  cat <<SPEC
name: "$1"
model { mlp { hidden_sizes: [16] } }
data { synthetic { num_samples: 256 input_shape: [8] num_classes: 2 seed: 3 } }
training { batch_size_per_rank: 16 epochs: 1 seed: 1 }
optimizer { kind: SGD lr: 0.1 }
checkpoint { every_steps: 4 keep_last: 0 $2 }
resources { min_ranks: 1 max_ranks: 1 }
SPEC
}

# exposed DIR...: what under DIR (the directories included) others could
# read, write or enter, as `find -ls` lines.
exposed() { find "$@" -perm /077 -ls 2>&1; }

# --- chorus up --state_dir with a SHARED_DIR job
spec shared "storage: SHARED_DIR shared_dir: '${SHARED}'" >"${TMP}/shared.textproto"
out=$(timeout 180 "${CHORUS}" up --local 1 --state_dir "${ROOT}/up" "${TMP}/shared.textproto" \
        --json 2>"${TMP}/up.err")
last=$(tail -n 1 <<<"${out}")
shared_job=$(json_get - job_id <<<"${last}" 2>/dev/null)
[[ "$(json_get - state <<<"${last}" 2>/dev/null)" == SUCCEEDED ]] \
  && pass "chorus up: the SHARED_DIR job ${shared_job} succeeded under umask 000" \
  || fail "chorus up: '${last}' $(tail -5 "${TMP}/up.err")"
for f in state/job_credentials.key state/chorus.db tokens admin.token agent.token \
         coordinator.log worker.log; do
  [[ -s "${ROOT}/up/${f}" ]] || fail "chorus up left no ${ROOT}/up/${f}"
done
# The port files name a loopback port and nothing else; the 0700 directory
# keeps them from others all the same.
left=$(exposed "${ROOT}/up" ! -name port ! -name http_port)
[[ -z "${left}" ]] && pass "chorus up --state_dir: nothing others can reach ($(find "${ROOT}/up" | wc -l) entries)" \
  || fail "chorus up --state_dir: others can reach: ${left}"

space=$(find "${SHARED}" -mindepth 1 -maxdepth 1)
model=$(find "${space}/${shared_job}" -name model.pt 2>/dev/null | head -n 1)
[[ -n "${model}" && "$(stat -c %a "${space}")" == 1777 ]] \
  && pass "SHARED_DIR: the cluster's directory takes the root's mode 1777; a checkpoint is at ${model#"${SHARED}"/}" \
  || fail "SHARED_DIR: space '${space}' ($(stat -c %a "${space}" 2>&1)), model '${model}': $(ls -laR "${SHARED}" 2>&1 | head -20)"
left=$(exposed "${space}" -mindepth 1)
[[ -z "${left}" && "$(stat -c %a "${space}/${shared_job}")" == 700 ]] \
  && pass "SHARED_DIR: the job's directory is 0700 and nothing in it others can reach" \
  || fail "SHARED_DIR: others can reach: ${left}"

# --- a coordinator with --checkpoint_dir, storage COORDINATOR
start_coordinator -s "${ROOT}/state" -- --checkpoint_dir "${ROOT}/checkpoints" \
  || { fail "no coordinator started"; finish; }
addr=${COORDINATOR_ADDR}
start_agent node-a 1
state_of() { "${CHORUS}" --coordinator "${addr}" status "$1" --json 2>/dev/null | json_get - job.state 2>/dev/null; }
spec stored "" >"${TMP}/stored.textproto"
stored_job=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/stored.textproto" 2>"${TMP}/submit.err")
wait_for '[[ "$(state_of "${stored_job}")" == SUCCEEDED ]]' 60 \
  && pass "--checkpoint_dir: ${stored_job} succeeded" \
  || fail "--checkpoint_dir: ${stored_job} is '$(state_of "${stored_job}")' $(cat "${TMP}/submit.err")"
stored_model=$(find "${ROOT}/checkpoints/${stored_job}" -name model.pt 2>/dev/null | head -n 1)
left=$(exposed "${ROOT}/checkpoints" "${ROOT}/state")
[[ -n "${stored_model}" && -z "${left}" ]] \
  && pass "--checkpoint_dir: files 0600 in 0700 directories ($(find "${ROOT}/checkpoints" | wc -l) entries)" \
  || fail "--checkpoint_dir: model '${stored_model}'; others can reach: ${left}"
"${CHORUS}" --coordinator "${addr}" export "${stored_job}" -o "${TMP}/exported.pt" 2>"${TMP}/export.err" \
  && [[ -s "${TMP}/exported.pt" ]] \
  && pass "--checkpoint_dir: chorus export still reads the private checkpoint" \
  || fail "--checkpoint_dir: export: $(cat "${TMP}/export.err")"

# --- a world-writable shared root without the sticky bit is refused
mkdir "${ROOT}/open" && chmod 0777 "${ROOT}/open"
spec open "storage: SHARED_DIR shared_dir: '${ROOT}/open'" >"${TMP}/open.textproto"
open_job=$("${CHORUS}" --coordinator "${addr}" submit "${TMP}/open.textproto" 2>"${TMP}/submit.err")
wait_for '[[ "$(state_of "${open_job}")" == FAILED ]]' 60
reason=$("${CHORUS}" --coordinator "${addr}" status "${open_job}" --json 2>/dev/null | json_get - job.reason 2>/dev/null)
[[ "${reason}" == *"${ROOT}/open is writable by every user (mode 0777) but lacks the sticky bit"*"chmod 1777 ${ROOT}/open"* ]] \
  && pass "a world-writable shared root without the sticky bit fails the job saying how to fix it" \
  || fail "open shared root: $(state_of "${open_job}"): '${reason}'"
[[ -z "$(ls -A "${ROOT}/open")" ]] && pass "nothing was written into it" \
  || fail "written into the open root: $(ls -A "${ROOT}/open")"

# --- another local user reads none of it
if [[ $(id -u) -ne 0 ]]; then
  echo "skipped: reading as another user needs root (useradd, setpriv)"
  finish
fi
user="chorus-modes-$$"
if ! useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "${user}" 2>"${TMP}/useradd.err"; then
  fail "useradd ${user}: $(cat "${TMP}/useradd.err")"
  finish
fi
on_exit "userdel '${user}' 2>/dev/null"
as_user() { setpriv --reuid="${user}" --regid="${user}" --clear-groups "$@"; }
echo readable >"${ROOT}/control" && chmod 0644 "${ROOT}/control"
[[ "$(as_user cat "${ROOT}/control" 2>&1)" == readable ]] \
  && pass "${user} reads a 0644 file beside the trees (the path is open to it)" \
  || fail "${user} cannot read ${ROOT}/control: the checks below would prove nothing"
for f in "${model}" "${stored_model}" "${ROOT}/up/state/job_credentials.key" \
         "${ROOT}/up/worker.log" "${ROOT}/up/coordinator.log" "${ROOT}/up/admin.token"; do
  err=$(as_user cat "${f}" 2>&1 >/dev/null)
  [[ "${err}" == *"Permission denied"* ]] && pass "${user} may not read ${f#"${ROOT}"/}" \
    || fail "${user} reading ${f}: '${err}'"
done
err=$(as_user mkdir "${space}/${shared_job}/planted" 2>&1)
[[ "${err}" == *"Permission denied"* ]] && pass "${user} may not write into ${shared_job}'s shared directory" \
  || fail "${user} writing into ${space}/${shared_job}: '${err}'"
err=$(as_user mkdir "${space}/job-of-${user}" 2>&1)
[[ -z "${err}" && -d "${space}/job-of-${user}" ]] \
  && pass "${user} may make a job directory of its own beside it (1777, as /tmp)" \
  || fail "${user} making a directory in ${space}: '${err}'"
finish
