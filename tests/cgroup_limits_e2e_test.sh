#!/usr/bin/env bash
# Rank cgroups end to end (Note [Rank cgroups] in worker/agent/rank_cgroup.cc,
# docs/operating.md "Rank limits"): one agent with 2 slots.
#   - job A, a program allocating 16 MiB at a time past its 256 MiB
#     resources.memory_bytes, FAILS with "out of memory: the job's limit is
#     256 MiB per rank (resources.memory_bytes)", while job B, running on
#     the same agent all along, SUCCEEDS;
#   - job C forks sleepers until fork fails (then kills them): it stops below its
#     resources.max_processes (64), and the agent is still alive and runs
#     job D afterwards;
#   - no rank cgroup is left once the jobs end, nor the agent's own
#     directories once it stops.
# Needs root and writable cgroups (v1 or v2); skips, saying so, otherwise.
#
# Usage (from Bazel): cgroup_limits_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
PYTHON=/usr/bin/python3

if [[ "$(id -u)" != 0 ]]; then
  echo "SKIPPED: not root: the agent cannot create cgroups (run as root to test rank limits)"
  exit 0
fi
[[ -x "${PYTHON}" ]] || { echo "SKIPPED: no ${PYTHON} for the test's programs"; exit 0; }

field() { json_get - "$2" <<<"$1"; }
chorus() { timeout 30 "${CHORUS}" --coordinator "${COORDINATOR_ADDR}" "$@"; }
state() { field "$(chorus status "$1" --json 2>/dev/null)" job.state 2>/dev/null; }
reason() { field "$(chorus status "$1" --json 2>/dev/null)" job.reason 2>/dev/null; }

# The agent's cgroup directories (its log names them). Whatever is left
# under them when the test exits, however it exits, is killed and removed.
AGENT_DIRS=()
remove_cgroups() {
  local dir procs pid
  for dir in "${AGENT_DIRS[@]}"; do
    [[ -d "${dir}" ]] || continue
    for procs in $(find "${dir}" -name cgroup.procs 2>/dev/null); do
      for pid in $(cat "${procs}" 2>/dev/null); do kill -KILL "${pid}" 2>/dev/null; done
    done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      find "${dir}" -depth -type d -exec rmdir {} \; 2>/dev/null
      [[ -d "${dir}" ]] || break
      sleep 0.2
    done
  done
}
on_exit remove_cgroups

start_coordinator || { fail "no coordinator"; finish; }
"${WORKER}" --coordinator "${COORDINATOR_ADDR}" --slots 2 --host node-a 2>"${TMP}/node-a.log" &
AGENT_PID=$!
track_pid "${AGENT_PID}"
wait_for 'grep -q "connected to ${COORDINATOR_ADDR} as agent-" "${TMP}/node-a.log"' 20 \
  || { fail "agent did not connect: $(tail -3 "${TMP}/node-a.log")"; finish; }
if grep -q "ranks run without memory, process and CPU limits" "${TMP}/node-a.log"; then
  echo "SKIPPED: cgroups are not writable here: $(grep -o "ranks run without.*" "${TMP}/node-a.log")"
  exit 0
fi
line=$(grep -o "each rank runs in a cgroup of its own .*" "${TMP}/node-a.log")
IFS=', ' read -r -a AGENT_DIRS <<<"${line#*) under }"
[[ ${#AGENT_DIRS[@]} -ge 1 && -d "${AGENT_DIRS[0]}" ]] \
  && pass "the agent made its cgroups: ${AGENT_DIRS[*]}" || fail "agent cgroups: '${line}'"
rank_cgroups() { find "${AGENT_DIRS[@]}" -mindepth 1 -type d 2>/dev/null; }

# $1 = name, $2 = resources, then the program's argv as JSON strings.
submit() {
  local name=$1 resources=$2
  shift 2
  local argv
  argv=$(printf '%s, ' "$@")
  printf 'name: "%s"\nprogram { argv: [%s] }\nresources { %s }\n' \
    "${name}" "${argv%, }" "${resources}" > "${TMP}/${name}.textproto"
  chorus submit "${TMP}/${name}.textproto" 2>>"${TMP}/submit.err"
}

# --- B runs until the test lets it go, A runs out of memory beside it
b=$(submit neighbour "memory_bytes: 268435456" '"/bin/sh"' '"-c"' \
  "\"i=0; while [ \$i -lt 1200 ] && ! [ -e ${TMP}/release ]; do sleep 0.1; i=\$((i+1)); done; [ -e ${TMP}/release ] && echo released\"")
[[ "${b}" == job-* ]] || fail "submit B: '${b}' $(cat "${TMP}/submit.err")"
wait_for '[[ "$(state "${b}")" == RUNNING ]]' 30 || fail "B is not running: $(state "${b}")"
start=$(_lib_now_us)
a=$(submit allocator "memory_bytes: 268435456" "\"${PYTHON}\"" '"-c"' \
  '"import time\nheld = []\nfor i in range(120):\n    held.append(bytearray(16 << 20))\n    print(\"allocated\", 16 * len(held), \"MiB\", flush=True)\n    time.sleep(0.01)\nprint(\"allocated all of it\")"')
[[ "${a}" == job-* ]] || fail "submit A: '${a}' $(cat "${TMP}/submit.err")"
wait_for '[[ "$(state "${a}")" == FAILED ]]' 60 || fail "A did not fail: $(state "${a}")"
want="out of memory: the job's limit is 256 MiB per rank (resources.memory_bytes)"
why=$(reason "${a}")
[[ "${why}" == "rank 0 (node-a, pid "*") was killed: ${want}; last output: "*"allocated "*" MiB"* ]] \
  && pass "A failed in $(elapsed_since "${start}") s: ${why}" || fail "A's reason: '${why}'"
logs=$(chorus logs "${a}" 2>&1)
[[ "${logs}" == *"${want}"* ]] && pass "chorus logs says it too" || fail "chorus logs of A: ${logs}"
most=$(grep -o "allocated [0-9]* MiB" <<<"${logs}" | tail -n 1 | grep -o "[0-9]*")
[[ -n "${most}" && "${most}" -le 256 ]] && pass "A got no further than ${most} MiB" \
  || fail "A allocated '${most}' MiB past a 256 MiB limit"
[[ "$(state "${b}")" == RUNNING ]] && pass "B still runs beside it" || fail "B: $(state "${b}")"
touch "${TMP}/release"
wait_for '[[ "$(state "${b}")" == SUCCEEDED ]]' 30 \
  && pass "B, on the same agent, SUCCEEDED" || fail "B: $(state "${b}") $(reason "${b}")"

# --- C forks until pids.max refuses; the agent lives on and runs D
c=$(submit forker "max_processes: 64" "\"${PYTHON}\"" '"-c"' \
  '"import os, signal, time\nchildren = []\nfor i in range(1000):\n    try:\n        pid = os.fork()\n    except OSError as e:\n        print(\"fork refused:\", e, flush=True)\n        break\n    if pid == 0:\n        time.sleep(120)\n        os._exit(0)\n    children.append(pid)\nprint(\"forked\", len(children), flush=True)\nfor pid in children:\n    os.kill(pid, signal.SIGKILL)\n    os.waitpid(pid, 0)"')
[[ "${c}" == job-* ]] || fail "submit C: '${c}' $(cat "${TMP}/submit.err")"
wait_for '[[ "$(state "${c}")" == SUCCEEDED || "$(state "${c}")" == FAILED ]]' 60 \
  || fail "C did not end: $(state "${c}")"
logs=$(chorus logs "${c}" 2>&1)
forked=$(grep -o "forked [0-9]*" <<<"${logs}" | grep -o "[0-9]*")
[[ "$(state "${c}")" == SUCCEEDED && -n "${forked}" && "${forked}" -gt 0 && "${forked}" -lt 64 \
   && "${logs}" == *"fork refused"* ]] \
  && pass "the fork storm stopped at pids.max: ${forked} children of at most 64 tasks" \
  || fail "C: $(state "${c}") forked '${forked}': $(tail -3 <<<"${logs}")"
kill -0 "${AGENT_PID}" 2>/dev/null && pass "the agent survived both" || fail "the agent died"
d=$(submit after '' '"/bin/echo"' '"still here"')
wait_for '[[ "$(state "${d}")" == SUCCEEDED ]]' 30 \
  && pass "the agent runs another job afterwards" || fail "D: $(state "${d}") $(reason "${d}")"

# --- nothing left: no rank cgroup now, no agent directory once it stops
wait_for '[[ -z "$(rank_cgroups)" ]]' 10 && pass "no rank cgroup left" \
  || fail "rank cgroups left: $(rank_cgroups)"
kill -TERM "${AGENT_PID}" "${COORDINATOR_PID}"
wait_exit "${AGENT_PID}" 20 || fail "the agent did not stop on SIGTERM"
wait_exit "${COORDINATOR_PID}" 20 || fail "the coordinator did not stop on SIGTERM"
left=$(for dir in "${AGENT_DIRS[@]}"; do [[ -d "${dir}" ]] && echo "${dir}"; done)
[[ -z "${left}" ]] && pass "the agent removed its cgroups as it stopped" \
  || fail "left after the agent stopped: ${left}"
assert_no_leftovers "the cgroup jobs"
finish
