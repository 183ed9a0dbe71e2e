#!/usr/bin/env bash
# Observability end to end with a real Prometheus: a coordinator runs a
# 2-rank job whose rank 1 is slowed down every step (SLOW fault); Debian's
# Prometheus, started here on loopback with a generated config, scrapes the
# coordinator's /metrics every second. Checks, through Prometheus's HTTP
# API: chorus_rank_step advances and matches `chorus status --json`; the
# wait is attributed to rank 1 (the straggler), not to rank 0 (which waited);
# once the job has ended its per-rank series are gone from /metrics and from
# Prometheus's answers.
#
# Usage (from Bazel): observability_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
PROMETHEUS=${PROMETHEUS:-/usr/bin/prometheus}
[[ -x "${PROMETHEUS}" ]] || { fail "${PROMETHEUS} is missing; run deploy/setup.sh (Debian package prometheus)"; finish; }

# GET URL: prints the body; exits non-zero on a connection error or a status
# other than 200 (at most 5 s).
http_get() {
  python3 - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        sys.stdout.write(r.read().decode())
except Exception as e:
    sys.stderr.write("GET %s: %s\n" % (sys.argv[1], e))
    sys.exit(1)
PY
}

# prom_value QUERY: the value of the first series an instant query returns,
# or nothing when it returns none.
prom_value() {
  python3 - "http://127.0.0.1:${prom_port}/api/v1/query" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]})
try:
    with urllib.request.urlopen(url, timeout=5) as r:
        answer = json.load(r)
except Exception as e:
    sys.stderr.write("query %s: %s\n" % (sys.argv[2], e))
    sys.exit(1)
result = answer.get("data", {}).get("result", [])
if result:
    print(result[0]["value"][1])
PY
}

# metric_value TEXT NAME LABELS: the value of NAME{LABELS...} in a scrape
# (labels as the coordinator sorts them).
metric_value() { grep -F "$2{$3}" <<<"$1" | head -n 1 | awk '{print $2}'; }

# --- the coordinator, its HTTP port and a worker with two slots
start_cluster_with_http 2 || { fail "no coordinator with an HTTP port"; finish; }
http_port=${HTTP_PORT}
pass "HTTP port ${http_port}"

# --- Prometheus on loopback, scraping every second into its own storage
prom_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"${TMP}/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: chorus
    # Chorus's own "job" label (the training job) must win over the scrape
    # job's name (docs/observability.md).
    honor_labels: true
    static_configs:
      - targets: ["127.0.0.1:${http_port}"]
YAML
"${PROMETHEUS}" --config.file="${TMP}/prometheus.yml" --storage.tsdb.path="${TMP}/prometheus-data" \
  --web.listen-address="127.0.0.1:${prom_port}" 2>"${TMP}/prometheus.log" &
track_pid $!
wait_for 'http_get "http://127.0.0.1:${prom_port}/-/ready" >/dev/null 2>&1' 30 \
  && pass "Prometheus is ready on 127.0.0.1:${prom_port}" \
  || { fail "Prometheus did not start: $(tail -5 "${TMP}/prometheus.log")"; finish; }
wait_for '[[ "$(prom_value "up{job=\"chorus\"}")" == 1 ]]' 20 \
  && pass "Prometheus scrapes the coordinator (up == 1)" \
  || fail "target not up: $(http_get "http://127.0.0.1:${prom_port}/api/v1/targets")"

# --- a 2-rank job; rank 1 sleeps 0.1 s before each step's collectives from
# step 5, so that no step is shorter than 0.1 s: its 600 steps take at least
# a minute, however fast the machine. Everything up to the end of the
# straggler checks reads series that exist only while the job runs (they are
# dropped when it ends). Beside other work (load 8-14 on 2 cores; Note
# [Tests on a busy machine] in lib.sh) those checks ended 20-47 s after the
# submission, at step 67-129, and a job of 220 steps once ended before them.
# The job ends at its last step; a check after them says whether they did
# see it running.
steps=600
cat >"${TMP}/slow.textproto" <<SPEC
name: "observed"
model { mlp { hidden_sizes: [16] } }
data { synthetic { num_samples: 4096 input_shape: [8] num_classes: 2 } }
training { batch_size_per_rank: 16 max_steps: ${steps} log_every_steps: 5 }
resources { min_ranks: 2 max_ranks: 2 }
fault_injection { faults { kind: SLOW rank: 1 at_step: 5 duration_seconds: 0.1 } }
hang_detection { action: REPORT }
SPEC
submitted=$(_lib_now_us)
job=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" submit "${TMP}/slow.textproto" 2>"${TMP}/submit.err")
[[ "${job}" == job-000001 ]] && pass "submitted ${job}" || fail "submit: ${job}"

step_query="chorus_rank_step{job=\"${job}\",rank=\"0\"}"
wait_for 'v=$(prom_value "${step_query}"); [[ -n "${v}" && "${v}" -ge 10 ]]' 60 \
  && pass "Prometheus has rank 0's step (${v})" || fail "no chorus_rank_step in Prometheus: '${v}'"
first=$(prom_value "${step_query}")
wait_for 'second=$(prom_value "${step_query}"); [[ -n "${second}" && "${second}" -gt "${first}" ]]' 10 \
  && pass "chorus_rank_step advances in Prometheus (${first} -> ${second})" \
  || fail "chorus_rank_step stayed at ${first} ('${second}')"

# Prometheus's value is at most one scrape (1 s) and one heartbeat (1 s)
# older than status: between them, a few steps of 0.1 s at most.
prom_step=$(prom_value "${step_query}")
status=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" --json 2>&1)
status_step=$(json_get - 'ranks[0].step' <<<"${status}")
if [[ -n "${prom_step}" && -n "${status_step}" ]] && (( status_step >= prom_step && status_step - prom_step <= 40 )); then
  pass "Prometheus's step ${prom_step} matches status's ${status_step}"
else
  fail "Prometheus step '${prom_step}' vs chorus status --json step '${status_step}'"
fi
prom_host=$(python3 - "http://127.0.0.1:${prom_port}/api/v1/query" "${step_query}" <<'PY'
import json, sys, urllib.parse, urllib.request
with urllib.request.urlopen(sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]}), timeout=5) as r:
    print(json.load(r)["data"]["result"][0]["metric"]["host"])
PY
)
[[ -n "${prom_host}" && "${prom_host}" == "$(json_get - 'ranks[0].host' <<<"${status}")" ]] \
  && pass "series are labelled with the rank's host (${prom_host})" || fail "host label '${prom_host}' vs ${status}"

# --- straggler attribution: the others waited for rank 1, not for rank 0
caused_query="chorus_rank_caused_wait_seconds{job=\"${job}\""
wait_for 'c1=$(prom_value "${caused_query},rank=\"1\"}"); python3 -c "import sys; sys.exit(0 if float(\"${c1:-0}\") > 0.05 else 1)"' 20
c0=$(prom_value "${caused_query},rank=\"0\"}")
python3 -c "import sys; sys.exit(0 if float('${c1:-0}') > 0.05 and float('${c0:-1}') < 0.02 else 1)" \
  && pass "the wait is rank 1's (${c1} s per step), not rank 0's (${c0})" \
  || fail "caused wait: rank 1 '${c1}', rank 0 '${c0}'"
top=$(python3 - "http://127.0.0.1:${prom_port}/api/v1/query" "topk(1, chorus_rank_caused_wait_seconds)" <<'PY'
import json, sys, urllib.parse, urllib.request
with urllib.request.urlopen(sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]}), timeout=5) as r:
    print(json.load(r)["data"]["result"][0]["metric"]["rank"])
PY
)
[[ "${top}" == 1 ]] && pass "topk(1, chorus_rank_caused_wait_seconds) names rank 1" || fail "topk named rank '${top}'"
scrape=$(http_get "http://127.0.0.1:${http_port}/metrics")
wait0=$(metric_value "${scrape}" chorus_rank_comm_wait_seconds "host=\"$(json_get - 'ranks[0].host' <<<"${status}")\",job=\"${job}\",rank=\"0\"")
python3 -c "import sys; sys.exit(0 if float('${wait0:-0}') > 0.05 else 1)" \
  && pass "rank 0 waits ${wait0} s per step in the collective" || fail "rank 0's wait '${wait0}'"

# straggler_seen: a scrape of /metrics marks rank 1 STRAGGLER (MARK, the
# line) and `chorus status`, read right after that scrape (STATUS_TEXT), has
# a STRAGGLER diagnosis (DIAGNOSIS, the line). Both hold from rank 1's first
# slow report window until the job ends; taken together, they describe the
# same running job.
straggler_seen() {
  mark=$(http_get "http://127.0.0.1:${http_port}/metrics" \
    | grep "chorus_rank_diagnosed{.*kind=\"STRAGGLER\",rank=\"1\"} 1")
  [[ -n "${mark}" ]] || return 1
  status_text=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" 2>&1)
  diagnosis=$(grep STRAGGLER <<<"${status_text}")
  [[ -n "${diagnosis}" ]]
}
mark="" status_text="" diagnosis=""
wait_for straggler_seen 20
[[ -n "${mark}" ]] && pass "/metrics marks rank 1 diagnosed STRAGGLER" \
  || fail "no STRAGGLER mark on rank 1 ($("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" 2>&1 | head -n 1))"
[[ "${diagnosis}" == *"rank 1 computes for"*"the others wait for it ("*" s per step between them)"* ]] \
  && pass "the STRAGGLER diagnosis says how long the others waited: ${diagnosis}" \
  || fail "diagnosis: '${diagnosis}' in: ${status_text}"
# The checks above read a running job's series only if it still runs now.
status=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" --json 2>&1)
[[ "$(json_get - job.state <<<"${status}")" == RUNNING ]] \
  && pass "the checks above saw ${job} running ($(elapsed_since "${submitted}") s after it was submitted, at step $(json_get - 'ranks[0].step' <<<"${status}") of ${steps})" \
  || fail "${job} ended before the checks of its series did ($(elapsed_since "${submitted}") s after it was submitted; it has ${steps} steps of at least 0.1 s): $(json_get - job.state <<<"${status}")"

# --- the job ends: its per-rank series go away
wait_for '[[ "$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" --json 2>/dev/null | json_get - job.state)" == SUCCEEDED ]]' 90 \
  && pass "${job} succeeded" || fail "job did not succeed: $("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" 2>&1)"
scrape=$(http_get "http://127.0.0.1:${http_port}/metrics")
[[ -n "${scrape}" && "${scrape}" != *"job=\"${job}\""* ]] \
  && pass "no series of the ended job in /metrics" || fail "left in /metrics: $(grep -F "job=\"${job}\"" <<<"${scrape}" | head -3)"
[[ "${scrape}" == *'chorus_jobs_finished_total{state="SUCCEEDED"} 1'* ]] \
  && pass "chorus_jobs_finished_total counts it" || fail "$(grep chorus_jobs_finished <<<"${scrape}")"
wait_for '[[ -z "$(prom_value "${step_query}")" ]]' 10 \
  && pass "Prometheus no longer returns the ended job's chorus_rank_step (stale)" \
  || fail "Prometheus still has ${step_query}: $(prom_value "${step_query}")"

kill -TERM "${COORDINATOR_PID}"
wait_exit "${COORDINATOR_PID}" 20 || fail "coordinator did not stop within 20 s"
finish
