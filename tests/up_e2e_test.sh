#!/usr/bin/env bash
# End to end: `chorus up --local 2` runs a real job through a coordinator, a
# node agent and two rank processes; a failing job reports why; Ctrl-C
# cancels and leaves nothing running.
#
# Usage (from Bazel): up_e2e_test.sh CHORUS
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
# Reads field $2 of the JSON line $1 (`chorus up --json` ends with one).
field() { json_get - "$2" <<<"$1"; }

cat > "${TMP}/job.textproto" <<'SPEC'
name: "e2e"
model { mlp { hidden_sizes: [32] } }
data { synthetic { num_samples: 2048 input_shape: [16] num_classes: 4 seed: 5 } }
training { batch_size_per_rank: 32 epochs: 3 seed: 1 log_every_steps: 16 }
optimizer { kind: SGD lr: 0.1 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
SPEC

# --- a job that succeeds
out=$(timeout 120 "${CHORUS}" up --local 2 --state_dir "${TMP}/ok" "${TMP}/job.textproto" --json 2>"${TMP}/ok.err"); rc=$?
last=$(echo "${out}" | tail -n 1)
if [[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED && "$(field "${last}" final_metrics.steps)" == 96 ]]; then
  pass "up --local 2 succeeded: ${last}"
else
  fail "up rc=${rc} out='${out}' err=$(tail -5 "${TMP}/ok.err")"
fi
acc=$(field "${last}" final_metrics.test_accuracy)
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.7) }' && pass "test accuracy ${acc} > 0.7" \
  || fail "test accuracy '${acc}' not above 0.7"
grep -q "RUNNING step" "${TMP}/ok.err" && pass "progress lines" || fail "no progress lines"
assert_no_leftovers "a successful job"

# --- a CUDA job: chorus up starts CPU agents, so it refuses at once and says
# what to run instead (it would otherwise wait for CUDA slots forever)
sed 's|resources { min_ranks: 2 max_ranks: 2 }|resources { min_ranks: 1 max_ranks: 1 device: CUDA }|' \
  "${TMP}/job.textproto" > "${TMP}/cuda.textproto"
out=$(timeout 60 "${CHORUS}" up --local 1 --state_dir "${TMP}/cuda" "${TMP}/cuda.textproto" 2>&1); rc=$?
[[ ${rc} -eq 2 && "${out}" == *"resources.device is CUDA, but chorus up --local starts CPU agents"* \
    && "${out}" == *"chorus-worker --device cuda"* ]] \
  && pass "up refuses a CUDA job, naming what to run" || fail "CUDA up rc=${rc} out='${out}'"
assert_no_leftovers "a refused CUDA job"

# --- a job whose ranks fail: the reason names the file and the package
sed 's|data { synthetic .* }|data { fashion_mnist { dir: "/nonexistent/fashion" } }|' "${TMP}/job.textproto" \
  > "${TMP}/bad.textproto"
out=$(timeout 120 "${CHORUS}" up --local 2 --state_dir "${TMP}/bad" "${TMP}/bad.textproto" --json 2>"${TMP}/bad.err"); rc=$?
last=$(echo "${out}" | tail -n 1)
reason=$(field "${last}" reason)
[[ ${rc} -eq 1 && "$(field "${last}" state)" == FAILED && "${reason}" == *"/nonexistent/fashion/train-images-idx3-ubyte.gz"* \
   && "${reason}" == *"dataset-fashion-mnist"* ]] && pass "failed job explains itself" \
  || fail "bad job rc=${rc} out='${out}'"
assert_no_leftovers "a failed job"

# --- Ctrl-C cancels the job and tears everything down
sed 's/epochs: 3/epochs: 100000/' "${TMP}/job.textproto" > "${TMP}/long.textproto"
"${CHORUS}" up --local 2 --state_dir "${TMP}/long" "${TMP}/long.textproto" 2>"${TMP}/long.err" &
up_pid=$!
wait_for 'grep -q "RUNNING step" "${TMP}/long.err"' 30 \
  || fail "long job never reported progress: $(tail -3 "${TMP}/long.err")"
# Heartbeats: every rank shows its step and phase in `chorus status` (and rank
# 0's metrics have a step too). A step counts once it is past 0 (JSON leaves
# zeros out), so ranks that start slowly on a loaded machine get a minute.
long_addr="127.0.0.1:$(cat "${TMP}/long/port")"
status=""
heartbeats_in() {
  [[ $(json_get - 'ranks[*].phase' <<<"$1" | wc -l) -ge 2 && $(json_get - 'ranks[*].step' <<<"$1" | wc -l) -ge 2 ]] \
    && json_get - job.latest_metrics.step <<<"$1" >/dev/null
}
wait_for 'status=$("${CHORUS}" --coordinator "${long_addr}" status job-000001 --json 2>/dev/null)
          heartbeats_in "${status}" 2>/dev/null' 60 \
  && pass "both ranks heartbeat their step and phase" || fail "no heartbeats in status: ${status}"
"${CHORUS}" --coordinator "${long_addr}" status job-000001 2>&1 | grep -E "^  [01] " | head -2
# The status page's login URL opens the page in a browser: the login sets a
# session cookie and redirects to the job list; without it the page is 401.
login_url=$(grep -o 'status page http://[^ ]*' "${TMP}/long.err" | cut -d' ' -f3)
python3 - "${login_url}" <<'PY' && pass "the printed login URL opens the status page" \
  || fail "login URL '${login_url:0:40}...' did not open the page"
import http.cookiejar, sys, urllib.error, urllib.request
url = sys.argv[1]
assert "/login?token=" in url, "no login URL printed"
page = url.split("/login")[0] + "/"
try:
    urllib.request.urlopen(page, timeout=5)
    sys.exit("the page opened without a login")
except urllib.error.HTTPError as e:
    assert e.code == 401, e.code
jar = http.cookiejar.CookieJar()
opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
with opener.open(url, timeout=5) as r:
    body = r.read().decode()
    assert r.status == 200 and r.geturl() == page, (r.status, r.geturl())
    assert 'data-page="jobs"' in body, body[:200]
assert [c.name for c in jar] == ["chorus_session"], [c.name for c in jar]
with opener.open(page.rstrip("/") + "/api/jobs", timeout=5) as r:
    assert '"users":[' in r.read().decode()
PY
token=${login_url##*token=}
[[ -n "${token}" ]] && ! grep -qF "${token}" "${TMP}/long/coordinator.log" "${TMP}/long/worker.log" \
  && pass "the token is in no log" || fail "the admin token is in a log of ${TMP}/long"
# Each rank runs on its own share of the agent's CPUs (two slots: Note [Binding
# ranks to CPUs] in common/cpu_binding.cc), given to it in CHORUS_CPUS.
if (( $(nproc) >= 2 )); then
  worker_pid=$(pgrep -P "${up_pid}" -f chorus-worker | head -1)
  binding=""
  for p in $(pgrep -P "${worker_pid:-0}"); do
    binding+="$(grep ^Cpus_allowed_list "/proc/${p}/status" | cut -f2) $(tr '\0' '\n' <"/proc/${p}/environ" | grep ^CHORUS_CPUS=)"$'\n'
  done
  python3 - "$(grep ^Cpus_allowed_list "/proc/${worker_pid:-0}/status" | cut -f2)" "${binding}" <<'PY' \
    && pass "each rank is bound to its own CPUs: $(echo ${binding})" \
    || fail "ranks' CPUs (agent's: $(grep ^Cpus_allowed_list "/proc/${worker_pid:-0}/status" 2>&1)): '${binding}'"
import sys
def cpus(text):
    out = set()
    for item in text.split(","):
        a, _, b = item.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out
agent = cpus(sys.argv[1])
ranks = [line.split() for line in sys.argv[2].strip().splitlines()]
sets = [cpus(r[0]) for r in ranks]
assert len(sets) == 2, ranks
assert all(r[1] == "CHORUS_CPUS=" + r[0] for r in ranks), ranks
assert not (sets[0] & sets[1]) and sets[0] | sets[1] == agent, (agent, sets)
PY
fi
interrupt_at=$(date +%s%N)
kill -INT "${up_pid}"
if wait_exit "${up_pid}" 30; then
  wait "${up_pid}"; rc=$?
  took_ms=$(( ($(date +%s%N) - interrupt_at) / 1000000 ))
  [[ ${rc} -eq 130 ]] && pass "Ctrl-C exits 130" || fail "Ctrl-C exit code ${rc}"
  # Ranks stop on SIGTERM at once; escalating to SIGKILL (10 s) would mean they ignored it.
  (( took_ms < 9000 )) && pass "Ctrl-C tore everything down in ${took_ms} ms" \
    || fail "Ctrl-C took ${took_ms} ms: did a rank ignore SIGTERM?"
  grep -q "CANCELLED" "${TMP}/long.err" && pass "job cancelled" || fail "no CANCELLED in $(tail -3 "${TMP}/long.err")"
else
  fail "chorus up still running 30 s after Ctrl-C"
  kill -KILL "${up_pid}"
fi
assert_no_leftovers "Ctrl-C"

# --- submit --wait against a coordinator and an agent started by hand
COORDINATOR=coordinator/chorus-coordinator
WORKER=worker/chorus-worker
start_coordinator -s "${TMP}/manual" -p "${TMP}/manual.port" -o "${TMP}/manual-coordinator.log" \
  || fail "no coordinator started"
coordinator_pid=${COORDINATOR_PID}
addr=${COORDINATOR_ADDR}
"${WORKER}" --coordinator "${addr}" --slots 2 2>"${TMP}/manual-worker.log" &
worker_pid=$!
out=$(timeout 120 "${CHORUS}" --coordinator "${addr}" submit --wait "${TMP}/job.textproto" 2>"${TMP}/wait.err"); rc=$?
[[ ${rc} -eq 0 && "${out}" == "job-000001" ]] && grep -q "job-000001 SUCCEEDED" "${TMP}/wait.err" \
  && pass "submit --wait exits 0 on success" || fail "submit --wait rc=${rc} out='${out}' $(tail -2 "${TMP}/wait.err")"
out=$(timeout 120 "${CHORUS}" --coordinator "${addr}" submit --wait --json "${TMP}/bad.textproto" 2>"${TMP}/wait-bad.err"); rc=$?
[[ ${rc} -eq 1 && "$(json_get - state <<<"${out}")" == FAILED ]] && grep -q "dataset-fashion-mnist" "${TMP}/wait-bad.err" \
  && pass "submit --wait exits 1 with the reason" || fail "failing submit --wait rc=${rc} out='${out}'"
kill -TERM "${worker_pid}"; wait "${worker_pid}"
kill -TERM "${coordinator_pid}"; wait "${coordinator_pid}"
assert_no_leftovers "submit --wait"

# --- bad input
"${CHORUS}" up --local 1 "${TMP}/job.textproto" >/dev/null 2>"${TMP}/small.err"; rc=$?
[[ ${rc} -eq 2 ]] && grep -q "min_ranks = 2 slots; --local gives 1" "${TMP}/small.err" \
  && pass "too few slots is refused" || fail "too few slots rc=${rc}"

finish
