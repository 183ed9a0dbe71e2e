#!/usr/bin/env bash
# Restart-all end to end (Note [Restart-all] in coordinator/scheduling/running_job.h,
# docs/programs.md): an unmodified torchrun script
# (tests/bench/torchrun_checkpointed_mlp.py: an MLP on seeded random data
# that saves a checkpoint every step and resumes from it when
# TORCHELASTIC_RESTART_COUNT > 0) runs as a 2-rank program job with
# `elastic { max_restarts: 3 }` on one 2-slot agent. Rank 1's python is
# killed with SIGKILL mid-run. Every rank is stopped and started again in
# generation 2, in new processes that see torchrun's variables with
# TORCHELASTIC_RESTART_COUNT=1; they resume from the checkpoint, not from
# step 0; the job succeeds with restarts 1 (one failure, one restart), and
# both ranks end bit for bit with the parameters of an undisturbed run of
# the same job.
#
# Usage (from Bazel): restart_all_e2e_test.sh COORDINATOR CHORUS WORKER SCRIPT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
SCRIPT=$(realpath "$4")
STEPS=40
field() { json_get - "$2" <<<"$1"; }
chorus() { timeout 30 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" "$@"; }
# Job $1's lines of the script that contain $2, from the coordinator's log
# store (one record per line: the agent's own log may interleave two ranks'
# lines written at the same moment). Complete once the job has ended.
lines() { chorus logs "$1" 2>/dev/null | grep -o "torchrun-mlp: .*" | grep -- "$2"; }
# What the script's progress file $1 (JSON lines, each one write) says of
# its first incarnation's rank $2: the pid, or whether it finished step $3.
first_pid() { sed -n "s/.*\"event\": \"pid\", \"rank\": $2, \"pid\": \([0-9]*\), \"restart\": 0,.*/\1/p" "$1" 2>/dev/null | head -n 1; }
stepped() { grep -q "\"event\": \"step\", \"rank\": $2, \"restart\": 0, \"step\": $3," "$1" 2>/dev/null; }
state() { field "$(chorus status "$1" --json 2>/dev/null)" job.state 2>/dev/null; }

start_coordinator || { fail "no coordinator"; finish; }
start_agent node-a 2

# $1 = name: submits the job, prints its id.
submit() {
  cat > "${TMP}/$1.textproto" <<SPEC
name: "$1"
program {
  argv: ["/usr/bin/python3", "${SCRIPT}", "--ckpt", "${TMP}/$1.pt", "--steps", "${STEPS}",
         "--step_sleep", "0.05", "--progress", "${TMP}/$1.jsonl"]
  env { key: "GLOO_SOCKET_IFNAME" value: "lo" }
}
resources { min_ranks: 2 max_ranks: 2 threads_per_rank: 1 }
elastic { max_restarts: 3 }
SPEC
  chorus submit "${TMP}/$1.textproto" 2>>"${TMP}/submit.err"
}

# --- an undisturbed run: the parameters to end with
ref=$(submit reference)
[[ "${ref}" == job-* ]] || fail "submit reference: '${ref}' $(cat "${TMP}/submit.err")"
wait_for '[[ "$(state "${ref}")" == SUCCEEDED ]]' 40 \
  || fail "reference run: $(chorus status "${ref}") $(tail -5 "${TMP}/node-a.log")"
ref_digest=$(lines "${ref}" "final rank " | grep -o "params_digest [0-9a-f]*" | sort -u)
[[ "${ref_digest}" =~ ^params_digest\ [0-9a-f]{16}$ ]] \
  && pass "undisturbed run: ${ref_digest} after ${STEPS} steps" \
  || fail "reference finals: '$(lines "${ref}" "final rank ")'"

# --- the same job, rank 1's python killed mid-run
job=$(submit killed)
[[ "${job}" == job-* ]] || fail "submit: '${job}' $(cat "${TMP}/submit.err")"
progress="${TMP}/killed.jsonl"
wait_for 'stepped "${progress}" 1 10' 30 \
  || fail "rank 1 never reached step 10: $(chorus status "${job}") $(tail -5 "${TMP}/node-a.log")"
victim=$(first_pid "${progress}" 1)
survivor=$(first_pid "${progress}" 0)
if [[ "${victim}" =~ ^[0-9]+$ ]] && kill -KILL "${victim}"; then
  pass "SIGKILL to rank 1's python (pid ${victim}) after its step 10"
else
  fail "no rank 1 python to kill: '${victim}'"
fi
wait_for '[[ "$(state "${job}")" == SUCCEEDED ]]' 40 \
  && pass "the job succeeded" || fail "job: $(chorus status "${job}") $(tail -5 "${TMP}/node-a.log")"

status=$(chorus status "${job}" --json)
[[ "$(field "${status}" job.restarts)" == 1 && "$(field "${status}" job.generation)" == 2 ]] \
  && pass "one failure, one restart: restarts 1, generation 2" \
  || fail "restarts '$(field "${status}" job.restarts)' generation '$(field "${status}" job.generation)'"

# Every rank started again, in a new process, with torchrun's variables.
for rank in 0 1; do
  started=$(lines "${job}" "start rank ${rank} pid " | tail -n +2)
  pid=$(awk '{print $6}' <<<"${started}")
  want="start rank ${rank} pid ${pid} restart_count 1 max_restarts 3 run_id ${job} group_rank 0"
  want+=" role_rank ${rank} role_world_size 2 group_world_size 1 local_world_size 2"
  want+=" role_name default use_agent_store False"
  [[ $(grep -c . <<<"${started}") -eq 1 && "${started}" == "torchrun-mlp: ${want}" \
     && "${pid}" != "${victim}" && "${pid}" != "${survivor}" ]] \
    && pass "rank ${rank} restarted in a new process (pid ${pid}) with TORCHELASTIC_RESTART_COUNT=1" \
    || fail "rank ${rank}'s restart: '${started}' (generation 1: ${survivor} and ${victim})"
done
resumed=$(lines "${job}" "restart 1 resumed_step " | awk '{print $NF}' | sort -u)
[[ $(grep -c . <<<"${resumed}") -eq 1 && "${resumed}" -ge 5 && "${resumed}" -lt "${STEPS}" ]] \
  && pass "both ranks resumed from the checkpoint of step ${resumed}, not from step 0" \
  || fail "resumed steps: '$(lines "${job}" "resumed_step")'"

finals=$(lines "${job}" "final rank ")
digest=$(grep -o "params_digest [0-9a-f]*" <<<"${finals}" | sort -u)
[[ $(grep -c "restart 1 step ${STEPS} " <<<"${finals}") -eq 2 && "${digest}" == "${ref_digest}" ]] \
  && pass "both ranks end at step ${STEPS} bit for bit with the undisturbed run (${digest})" \
  || fail "finals '${finals}' vs undisturbed '${ref_digest}'"

events=$(chorus watch "${job}" 2>&1)
[[ "${events}" == *"restart-all for generation 2 after rank 1 ("*"): stopping the 1 running rank(s)"* \
   && "${events}" == *"2 -> 2 ranks (restart-all: every rank started again), restart 1 of 3"* ]] \
  && pass "watch shows the restart-all" || fail "watch: ${events}"

# The agent and the coordinator go; no script may be left behind.
kill "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
wait "${AGENT_PIDS[@]}" "${COORDINATOR_PID}" 2>/dev/null
assert_no_leftovers "a restart-all"
finish
