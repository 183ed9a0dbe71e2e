# Shared helpers for the shell end-to-end tests in tests/.
#
# A test sources this file first thing (it sits beside the test in the
# runfiles tree), then reports with `pass` / `fail` and ends with `finish`:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   COORDINATOR=$(realpath "$1")
#   start_coordinator || exit 1
#   out=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" jobs --json)
#   [[ "$(json_get - 'jobs[0].state' <<<"${out}")" == PENDING ]] && pass "pending" || fail "${out}"
#   finish
#
# What it provides:
#   TMP                          the test's scratch directory (TEST_TMPDIR under Bazel)
#   pass MSG / fail MSG          print "ok: MSG" / "FAIL: MSG" and count them
#   finish                       print the counts; exit 0 only if nothing failed
#   wait_for CONDITION TIMEOUT   re-evaluate CONDITION (shell code, run in this
#                                shell) every 0.1 s until it succeeds (0) or
#                                TIMEOUT x TEST_SLACK seconds have passed (1)
#   wait_for_file FILE [TIMEOUT] wait until FILE exists and is not empty (20 s)
#   wait_exit PID TIMEOUT        wait until process PID has exited (0) or not (1)
#   TEST_SLACK                   how much longer than on a quiet machine a wait
#                                may take (CHORUS_TEST_SLACK, default 3)
#   slack_seconds S              S x TEST_SLACK, whole, for a call's own timeout
#   elapsed_since US             seconds (0.1 s precision) since _lib_now_us US
#   track_pid PID                kill PID with SIGKILL when the test exits
#   on_exit CODE                 run shell CODE when the test exits
#   on_timeout CODE              run shell CODE (what to show) if the test is
#                                terminated (SIGTERM: Bazel's test timeout)
#   start_coordinator [...]      start ${COORDINATOR} on 127.0.0.1 port 0
#   free_ports N                 N ports free on 127.0.0.1 that no connection
#                                takes meanwhile, for a service restarted on its
#                                old port
#   start_cluster_with_http SLOTS  that with its HTTP port (HTTP_PORT) and a
#                                ${WORKER} agent with SLOTS slots
#   up_small_job CHORUS NAME     `CHORUS up --local 2` of a small 2-rank job
#   assert_no_leftovers WHAT     no process whose command line names TMP runs
#   json_get FILE|- PATH         print one field of a JSON document
#   json_has FILE|- PATH VALUE   some value at PATH is VALUE (as json_get prints it)
#   install_python_package INSTALL_SH NATIVE_SO PREFIX
#                                the chorus package (//python) installed in PREFIX
#   check_sample_trace DIR WORLD SAMPLES
#                                what the sample traces of an elastic job in DIR
#                                (CHORUS_SAMPLE_TRACE) say: every sample of each
#                                epoch trained once, who finished with which
#                                parameters, who received which state
#
# Note [Tests on a busy machine]
# A TIMEOUT given to wait_for is what the condition needs on a quiet machine,
# with margin; wait_for allows TEST_SLACK times that (3 unless CHORUS_TEST_SLACK
# says otherwise), because beside other work (a CI runner's other jobs, a
# laptop's browser; tests/under_load.sh) every process of a test gets a fraction
# of a core. A deadline costs nothing when the condition holds early, so a
# generous one only makes a failing test slower to say so. A test that asserts a
# speed ("a new leader within N s") measures the time itself (elapsed_since) and
# states its bound so that it holds on a loaded machine too, or compares with a
# pace measured in the same run; it never relies on a fixed sleep being long
# enough.
#
# Thread-safety: none needed; it is sourced by one shell. Helpers that read
# JSON run python3 (whichever is first on PATH: only its json module is used),
# resolved once: a version manager's shim on PATH (pyenv's runs a shell script
# before every start) costs up to a second a call on a loaded machine, and a
# test makes hundreds of calls.
# Every variable the helpers keep starts with _lib_, so a CONDITION given to
# wait_for sees the caller's variables, not the helper's.

set -uo pipefail

TMP=${TEST_TMPDIR:-$(mktemp -d)}

# The interpreter python3 on PATH stands for (Note [Tests on a busy machine]);
# every `python3` in a test's shell runs it directly. Exported, so that a
# shell the test starts that sources this file again does not resolve it again.
if ! [[ -x "${CHORUS_TEST_PYTHON:-}" ]]; then
  CHORUS_TEST_PYTHON=$(command python3 -c 'import sys; print(sys.executable)' 2>/dev/null)
  [[ -x "${CHORUS_TEST_PYTHON}" ]] || CHORUS_TEST_PYTHON=$(command -v python3)
fi
export CHORUS_TEST_PYTHON
python3() { "${CHORUS_TEST_PYTHON}" "$@"; }

TEST_SLACK=${CHORUS_TEST_SLACK:-3}
if ! [[ "${TEST_SLACK}" =~ ^[0-9]+([.][0-9]+)?$ ]] \
   || ! awk -v s="${TEST_SLACK}" 'BEGIN { exit !(s >= 1) }'; then
  echo "lib.sh: CHORUS_TEST_SLACK must be a number >= 1, got '${TEST_SLACK}'" >&2
  exit 2
fi
failures=0
passes=0

pass() { echo "ok: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# Prints the counts and exits: 0 if every check passed, 1 otherwise.
finish() {
  echo "${passes} passed, ${failures} failure(s)"
  exit $((failures > 0))
}

# --- processes to clean up when the test exits, however it exits
_lib_pids=()
_lib_exit_code=()
track_pid() { _lib_pids+=("$1"); }
on_exit() { _lib_exit_code+=("$1"); }
_lib_cleanup() {
  local _lib_p _lib_code
  # Only processes that are still this shell's children: a pid that exited
  # long ago may belong to someone else by now.
  for _lib_p in "${_lib_pids[@]}"; do
    if [[ "$(ps -o ppid= -p "${_lib_p}" 2>/dev/null | tr -d ' ')" == "$$" ]]; then
      disown "${_lib_p}" 2>/dev/null  # no "Killed" line from the shell
      kill -KILL "${_lib_p}" 2>/dev/null
    fi
  done
  for _lib_code in "${_lib_exit_code[@]}"; do eval "${_lib_code}"; done
  return 0
}
trap _lib_cleanup EXIT

# Microseconds since the epoch.
_lib_now_us() { local t=${EPOCHREALTIME}; echo "${t/./}"; }

# Note [A test that times out says where]
# Bazel ends a test that outlives its size's timeout with SIGTERM, and its log
# then stops wherever the test was: a wait that never ended says nothing. So
# each wait_for writes what it waits for to ${TMP}/.lib_waiting (a file: waits
# also run in $(...) subshells), and on SIGTERM the test prints how long it
# ran, that wait, and what its on_timeout CODEs show (log tails), then exits.
_lib_start_us=$(_lib_now_us)
_lib_timeout_code=()
on_timeout() { _lib_timeout_code+=("$1"); }
_lib_terminated() {
  local _lib_code
  echo "TERMINATED after $(elapsed_since "${_lib_start_us}") s (SIGTERM: the test's timeout?)," \
    "in: $(cat "${TMP}/.lib_waiting" 2>/dev/null || echo "no wait")"
  for _lib_code in "${_lib_timeout_code[@]}"; do eval "${_lib_code}"; done
  exit 143
}
trap _lib_terminated TERM

# elapsed_since US: the seconds since US (a _lib_now_us reading), as 12.3.
elapsed_since() {
  local _lib_tenths=$(( ($(_lib_now_us) - $1) / 100000 ))
  echo "$((_lib_tenths / 10)).$((_lib_tenths % 10))"
}

# slack_seconds S: S (may be fractional) x TEST_SLACK, in whole seconds: the
# deadline wait_for allows for S, for a call that waits by itself (a CLI
# call's --timeout).
slack_seconds() { awk -v t="$1" -v s="${TEST_SLACK}" 'BEGIN { printf "%d", t * s }'; }

# wait_for CONDITION TIMEOUT: evaluates CONDITION every 0.1 s until it
# succeeds or TIMEOUT x TEST_SLACK seconds (TIMEOUT may be fractional) have
# passed. Assignments in CONDITION stay visible to the caller. Returns
# CONDITION's success.
wait_for() {
  local _lib_condition=$1 _lib_deadline
  _lib_deadline=$(( $(_lib_now_us) + $(awk -v t="$2" -v s="${TEST_SLACK}" \
    'BEGIN { printf "%d", t * s * 1000000 }') ))
  # Note [A test that times out says where]
  echo "wait_for (up to $2 x ${TEST_SLACK} s, from $(elapsed_since "${_lib_start_us}") s):" \
    "${_lib_condition}" >"${TMP}/.lib_waiting" 2>/dev/null
  while true; do
    eval "${_lib_condition}" && return 0
    (( $(_lib_now_us) >= _lib_deadline )) && return 1
    sleep 0.1
  done
}

# wait_for_file FILE [TIMEOUT]: FILE exists and is not empty (default 20 s).
wait_for_file() { local _lib_file=$1; wait_for '[[ -s "${_lib_file}" ]]' "${2:-20}"; }

# wait_exit PID TIMEOUT: returns 0 once process PID has exited.
wait_exit() { local _lib_pid=$1; wait_for '! kill -0 "${_lib_pid}" 2>/dev/null' "$2"; }

# scrape_up_metrics STATE_DIR PID OUT: in the background, while PID (a
# `chorus up --state_dir STATE_DIR`) runs, GETs its coordinator's /metrics
# every 0.25 s (port and admin token from STATE_DIR) into OUT, replaced
# whole, for at most 150 s. Sets SCRAPER_PID.
scrape_up_metrics() {
  python3 - "$1" "$2" "$3" <<'PY' &
import os, sys, time, urllib.request
state, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for _ in range(600):
    try:
        os.kill(pid, 0)
    except OSError:
        break
    try:
        port = open(state + "/http_port").read().strip()
        token = open(state + "/admin.token").read().strip()
        request = urllib.request.Request("http://127.0.0.1:%s/metrics" % port,
                                         headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(request, timeout=2) as response:
            body = response.read().decode()
        with open(out + ".tmp", "w") as f:
            f.write(body)
        os.replace(out + ".tmp", out)
    except Exception:
        pass  # not up yet, or gone
    time.sleep(0.25)
PY
  SCRAPER_PID=$!
  track_pid "${SCRAPER_PID}"
}
# rank_joins_via FILE WAY: chorus_rank_joins_total{via=WAY} in a scrape.
rank_joins_via() { sed -n "s/^chorus_rank_joins_total{via=\"$2\"} \([0-9]*\)\$/\1/p" "$1" 2>/dev/null; }

# start_coordinator [-l LISTEN] [-s STATE_DIR] [-p PORT_FILE] [-o LOG] [-n NETNS] [--] [FLAG...]
# Starts ${COORDINATOR} listening on LISTEN (default 127.0.0.1:0) with state
# in STATE_DIR (default a new directory under TMP), writing its port to
# PORT_FILE (default TMP/coordinator.port) and appending its stderr to LOG
# (default TMP/coordinator.log); inside network namespace NETNS if given.
# Other flags go to the coordinator as they are. Waits up to 20 s for the
# port and sets COORDINATOR_PID, COORDINATOR_PORT and COORDINATOR_ADDR
# (HOST:PORT with LISTEN's host); the process is killed when the test exits.
# Returns 1, after printing the log, if no port came.
start_coordinator() {
  local _lib_listen=127.0.0.1:0 _lib_state_dir="" _lib_port_file="${TMP}/coordinator.port"
  local _lib_log="${TMP}/coordinator.log" _lib_prefix=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -l) _lib_listen=$2; shift 2 ;;
      -s) _lib_state_dir=$2; shift 2 ;;
      -p) _lib_port_file=$2; shift 2 ;;
      -o) _lib_log=$2; shift 2 ;;
      -n) _lib_prefix=(ip netns exec "$2"); shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [[ -n "${_lib_state_dir}" ]] || _lib_state_dir=$(mktemp -d "${TMP}/state.XXXXXX")
  rm -f "${_lib_port_file}"
  "${_lib_prefix[@]}" "${COORDINATOR}" --listen "${_lib_listen}" --state_dir "${_lib_state_dir}" \
    --port_file "${_lib_port_file}" "$@" 2>>"${_lib_log}" &
  COORDINATOR_PID=$!
  track_pid "${COORDINATOR_PID}"
  if ! wait_for_file "${_lib_port_file}" 20; then
    echo "coordinator (${_lib_listen}, ${_lib_state_dir}) wrote no port within $(slack_seconds 20) s; its log:" >&2
    cat "${_lib_log}" >&2
    return 1
  fi
  COORDINATOR_PORT=$(cat "${_lib_port_file}")
  COORDINATOR_ADDR="${_lib_listen%:*}:${COORDINATOR_PORT}"
}

# start_agent HOST SLOTS: a ${WORKER} agent named HOST with SLOTS slots,
# connected to ${COORDINATOR_ADDR} (start_coordinator), logging to
# TMP/HOST.log; waits up to 20 s for it to connect (fails the test, saying
# why, if it does not). Its pid is appended to AGENT_PIDS; it is killed when
# the test exits.
AGENT_PIDS=()
start_agent() {
  local _lib_agent_log="${TMP}/$1.log"
  "${WORKER}" --coordinator "${COORDINATOR_ADDR}" --slots "$2" --host "$1" 2>"${_lib_agent_log}" &
  track_pid $!
  AGENT_PIDS+=($!)
  wait_for 'grep -q "connected to ${COORDINATOR_ADDR} as agent-" "${_lib_agent_log}"' 20 \
    || fail "agent $1 did not connect: $(tail -3 "${_lib_agent_log}")"
}

# install_python_package INSTALL_SH NATIVE_SO PREFIX: python/install.sh
# --no-build into PREFIX, from a repository laid out in TMP/repo the way
# install.sh reads it (chorus/__init__.py beside install.sh, _C.so under
# bazel-bin/python). Prints install.sh's output; its exit status.
install_python_package() {
  local repo="${TMP}/repo"
  mkdir -p "${repo}/python/chorus" "${repo}/bazel-bin/python"
  cp "$1" "${repo}/python/install.sh"
  cp "$(dirname "$1")/chorus/__init__.py" "${repo}/python/chorus/"
  cp "$2" "${repo}/bazel-bin/python/_C.so"
  "${repo}/python/install.sh" --no-build --prefix "$3" 2>&1
}

# Note [Ports that stay free]
# A test that starts a service again on its old port (a coordinator killed
# with kill -9, etcd members stopped and started) needs that port to stay free
# while the service is down. A port that bind(0) gave lies in the kernel's
# ephemeral range (ip_local_port_range), from which every outgoing connection
# takes its source port: meanwhile any of the test's hundreds of connections
# (CLI calls, a reconnecting agent, etcd clients retrying) may take it, and the
# restarted service then cannot bind it. free_ports N picks N distinct ports
# below that range, which the kernel never hands out by itself, each free to
# bind now; where the range leaves no room below it (it starts under 12000),
# ports from bind(0).
free_ports() {
  "${CHORUS_TEST_PYTHON}" - "$1" <<'PY'
import random, socket, sys
want = int(sys.argv[1])
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 0
pick = random.SystemRandom()
ports = []
for _ in range(100 * want):
    if len(ports) == want:
        break
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", pick.randrange(10000, low) if low > 12000 else 0))
        port = s.getsockname()[1]
    except OSError:
        continue
    finally:
        s.close()
    if port not in ports:
        ports.append(port)
print(*ports)
PY
}

# start_etcd_member NAME: one etcd member named NAME on loopback free ports,
# data in TMP/etcd, log in TMP/etcd.log, killed when the test exits. The
# ports are free when picked, but another process may take one before etcd
# binds it; an etcd that exits at start is such a collision, and it starts
# again on fresh ports and a fresh data directory (at most 3 tries). Sets
# ETCD_CLIENT_PORT and ETCD_PID; returns 1 if no try became healthy.
start_etcd_member() {
  local _lib_attempt _lib_peer_port _lib_healthy
  for _lib_attempt in 1 2 3; do
    read -r ETCD_CLIENT_PORT _lib_peer_port < <(free_ports 2)
    rm -rf "${TMP}/etcd"
    /usr/bin/etcd --name "$1" --data-dir "${TMP}/etcd" \
      --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
      --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
      --listen-peer-urls "http://127.0.0.1:${_lib_peer_port}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${_lib_peer_port}" \
      --initial-cluster "$1=http://127.0.0.1:${_lib_peer_port}" \
      --heartbeat-interval 50 --election-timeout 500 >>"${TMP}/etcd.log" 2>&1 &
    ETCD_PID=$!
    track_pid "${ETCD_PID}"
    _lib_healthy="/usr/bin/etcdctl --endpoints 127.0.0.1:${ETCD_CLIENT_PORT} endpoint health >/dev/null 2>&1"
    wait_for "! kill -0 ${ETCD_PID} 2>/dev/null || ${_lib_healthy}" 60
    if kill -0 "${ETCD_PID}" 2>/dev/null && eval "${_lib_healthy}"; then return 0; fi
    echo "etcd try ${_lib_attempt}: it exited or was not healthy in 60 s; again on fresh ports" >&2
    kill -9 "${ETCD_PID}" 2>/dev/null; wait "${ETCD_PID}" 2>/dev/null
  done
  return 1
}

# start_cluster_with_http SLOTS: a coordinator (start_coordinator) with its
# HTTP port (/metrics, the status page) on loopback port 0, and one
# ${WORKER} agent with SLOTS slots logging to TMP/worker.log (killed when the
# test exits). Sets HTTP_PORT besides start_coordinator's variables. Returns
# 1, saying why, if the coordinator wrote no port or no HTTP port.
start_cluster_with_http() {
  start_coordinator -- --http_port_file "${TMP}/http.port" || return 1
  HTTP_PORT=$(cat "${TMP}/http.port" 2>/dev/null)
  if ! [[ "${HTTP_PORT}" =~ ^[0-9]+$ && "${HTTP_PORT}" -gt 0 ]]; then
    echo "no HTTP port in ${TMP}/http.port: '${HTTP_PORT}'" >&2
    return 1
  fi
  "${WORKER}" --coordinator "${COORDINATOR_ADDR}" --slots "$1" 2>"${TMP}/worker.log" &
  track_pid $!
}

# up_small_job CHORUS NAME: runs a small training job named NAME (an MLP on
# 512 synthetic samples, 2 ranks, 8 steps) with `CHORUS up --local 2 --json`
# from TMP, state in TMP/up, stderr in TMP/up.err, at most 120 s; sets UP_RC
# (its exit code), UP_OUT (its stdout) and UP_LAST (the JSON line). For
# checking that an installed or unpacked tree runs a job on its own.
up_small_job() {
  cat >"${TMP}/job.textproto" <<SPEC
name: "$2"
model { mlp { hidden_sizes: [16] } }
data { synthetic { num_samples: 512 input_shape: [8] num_classes: 2 seed: 3 } }
training { batch_size_per_rank: 32 epochs: 1 seed: 1 }
optimizer { kind: SGD lr: 0.1 }
resources { min_ranks: 2 max_ranks: 2 }
SPEC
  UP_OUT=$(cd "${TMP}" && timeout 120 "$1" up --local 2 --state_dir "${TMP}/up" \
    "${TMP}/job.textproto" --json 2>"${TMP}/up.err")
  UP_RC=$?
  UP_LAST=$(tail -n 1 <<<"${UP_OUT}")
}

# assert_no_leftovers WHAT: passes if no process started by this test (its
# command line names TMP, which is unique to the test) still runs; otherwise
# fails naming them and kills them.
assert_no_leftovers() {
  local _lib_left
  _lib_left=$(pgrep -f -- "${TMP}" | grep -v "^$$\$" || true)
  if [[ -z "${_lib_left}" ]]; then
    pass "no processes left ($1)"
  else
    fail "left running after $1: $(ps -o pid,args -p "${_lib_left//$'\n'/,}")"
    pkill -KILL -f -- "${TMP}"
  fi
}

# json_get FILE|- PATH: parses the JSON document in FILE (or on stdin for -)
# and prints the value at PATH, e.g. 'final_metrics.steps', 'jobs[0].state',
# 'checkpoints[-1].files[0].name'. A string prints as itself, a number, true,
# false or null as in JSON, an object or array as compact JSON. `[*]` takes
# every element of an array, printing one value per line and skipping
# elements that lack the rest of the path; an empty PATH is the whole
# document. Returns 1 (printing nothing) if
# the path is not in the document, 2 if it is not JSON.
json_get() { python3 -c "${_lib_json_get_py}" "$1" "$2"; }
_lib_json_get_py=$(cat <<'PY'
import json, re, sys

source, path = sys.argv[1], sys.argv[2]
try:
    text = sys.stdin.read() if source == "-" else open(source).read()
    document = json.loads(text)
except (OSError, ValueError) as e:
    sys.stderr.write("json_get: %s is not a JSON document: %s\n" % (source, e))
    sys.exit(2)

steps = []
for part in path.split("."):
    m = re.fullmatch(r"([^\[\]]*)((?:\[(?:-?\d+|\*)\])*)", part)
    if m is None:
        sys.stderr.write("json_get: bad path %r\n" % path)
        sys.exit(2)
    if m.group(1):
        steps.append(m.group(1))
    steps.extend(i if i == "*" else int(i) for i in re.findall(r"\[(-?\d+|\*)\]", m.group(2)))

def walk(value, steps):
    if not steps:
        yield value
        return
    step, rest = steps[0], steps[1:]
    if step == "*":
        if isinstance(value, list):
            for element in value:
                yield from walk(element, rest)
    elif isinstance(step, int):
        if isinstance(value, list) and -len(value) <= step < len(value):
            yield from walk(value[step], rest)
    elif isinstance(value, dict) and step in value:
        yield from walk(value[step], rest)

found = list(walk(document, steps))
for value in found:
    print(value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
sys.exit(0 if found else 1)
PY
)

# json_has FILE|- PATH VALUE: succeeds if one of the values json_get prints
# for PATH (one per line with `[*]`) is exactly VALUE.
json_has() {
  local _lib_values
  _lib_values=$(json_get "$1" "$2") || return 1
  grep -qxF -- "$3" <<<"${_lib_values}"
}

# check_sample_trace DIR WORLD SAMPLES: reads the sample traces that the rank
# processes of a job of WORLD ranks wrote into DIR (CHORUS_SAMPLE_TRACE=DIR;
# worker/train/sample_trace.h), an epoch being SAMPLES samples. For each step
# the entries of the newest generation that trained it count. Prints, per
# process (DIR/PID.trace) in the order of its lines,
#   "state PID GEN RANK SOURCE STEP HAD"  the state it received after a
#                                         re-formation (HAD -1: a newcomer)
#   "final PID GEN RANK STEP CRC"         its parameters after the last step
# then "error ..." for a step whose generation lacks a rank or an epoch whose
# samples are not each sample once, "interrupted EPOCH" for an epoch that
# more than one generation trained, and last "epochs E steps S".
check_sample_trace() {
  python3 - "$1" "$2" "$3" <<'PY'
import collections, glob, os, sys
directory, world, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = collections.defaultdict(lambda: collections.defaultdict(dict))
for path in sorted(glob.glob(os.path.join(directory, "*.trace"))):
    pid = os.path.basename(path).split(".")[0]
    for line in open(path):
        f = line.split()
        if f[0] == "step":
            gen, rank, step, epoch = map(int, f[1:5])
            steps[step][gen][rank] = (epoch, [int(i) for i in f[5].split(",")])
        elif f[0] == "final":
            print("final", pid, *f[1:])
        elif f[0] == "state":
            print("state", pid, f[1], f[2], f[4], f[6], f[8])
by_epoch = collections.defaultdict(list)
gens_of_epoch = collections.defaultdict(set)
for step in sorted(steps):
    gen = max(steps[step])  # the generation that completed the step
    ranks = steps[step][gen]
    if sorted(ranks) != list(range(world)):
        print("error step %d generation %d has ranks %s" % (step, gen, sorted(ranks)))
    for epoch, idx in ranks.values():
        by_epoch[epoch].extend(idx)
        gens_of_epoch[epoch].add(gen)
for epoch in sorted(by_epoch):
    idx = sorted(by_epoch[epoch])
    if idx != list(range(samples)):
        dup = len(idx) - len(set(idx))
        print("error epoch %d: %d samples, %d distinct, %d repeated" % (epoch, len(idx), len(set(idx)), dup))
    if len(gens_of_epoch[epoch]) > 1:
        print("interrupted", epoch)
print("epochs", len(by_epoch), "steps", len(steps))
PY
}
