#!/usr/bin/env bash
# The status page in a real browser: a 2-rank job whose rank 1 skips a
# collective (NEVER_JOINED) is opened in headless Chromium; the DOM must show
# rank 1's row highlighted with the NEVER_JOINED text and the loss chart
# drawn; a screenshot is kept as a test output. Also: the job list names the
# job, an unknown job's page is a clean 404, `chorus status` prints the page
# URL and `chorus top --once` marks the rank.
#
# Usage (from Bazel): status_page_e2e_test.sh COORDINATOR CHORUS WORKER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[[ -x "${CHROMIUM}" ]] || { fail "${CHROMIUM} is missing; run deploy/setup.sh (Debian package chromium)"; finish; }
SHOTS=${TEST_UNDECLARED_OUTPUTS_DIR:-${TMP}}

# GET URL: "STATUS BODY" (at most 5 s).
http_get() {
  python3 - "$1" <<'PY'
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except Exception as e:
    print("000", e)
PY
}

# Headless Chromium with its own profile, at most 60 s. It must reach
# nothing but loopback: background services are off, every other host name
# resolves to nothing and any other request goes to a dead local proxy.
chromium() {
  timeout 60 "${CHROMIUM}" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-domain-reliability --no-pings --no-default-browser-check \
    --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" --proxy-server=127.0.0.1:9 \
    --proxy-bypass-list="127.0.0.1" \
    --user-data-dir="${TMP}/chromium-profile" --window-size=1280,1600 \
    --virtual-time-budget=3000 "$@" 2>>"${TMP}/chromium.log"
}

start_cluster_with_http 2 || { fail "no coordinator with an HTTP port"; finish; }
base="http://127.0.0.1:${HTTP_PORT}"

cat >"${TMP}/skip.textproto" <<'SPEC'
name: "page-hang"
model { mlp { hidden_sizes: [16] } }
data { synthetic { num_samples: 4096 input_shape: [8] num_classes: 2 } }
training { batch_size_per_rank: 16 epochs: 1000 log_every_steps: 5 }
resources { min_ranks: 2 max_ranks: 2 }
fault_injection { faults { kind: SKIP_COLLECTIVE rank: 1 at_step: 40 duration_seconds: 60 } }
hang_detection { action: REPORT stall_after_seconds: 2 }
SPEC
job=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" submit "${TMP}/skip.textproto" 2>"${TMP}/submit.err")
[[ "${job}" == job-000001 ]] && pass "submitted ${job}" || fail "submit: ${job}"
wait_for '"${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" 2>/dev/null | grep -q NEVER_JOINED' 60 \
  && pass "the hang is diagnosed NEVER_JOINED" \
  || fail "no NEVER_JOINED: $("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" 2>&1)"

# --- chorus status names the page; chorus top marks the rank
status=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" status "${job}" 2>&1)
[[ "${status}" == *"  page ${base}/jobs/${job}"* ]] && pass "chorus status prints the page URL" \
  || fail "no page URL in: ${status}"
top=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" top "${job}" --once 2>&1)
grep -Eq '^1 .*<- NEVER_JOINED$' <<<"${top}" && pass "chorus top --once marks rank 1 NEVER_JOINED" \
  || fail "chorus top: ${top}"

# --- the page in a browser
chromium --dump-dom "${base}/jobs/${job}" >"${TMP}/job.html"
python3 - "${TMP}/job.html" <<'PY' && pass "the DOM highlights rank 1 with the NEVER_JOINED text and draws the charts" || fail "DOM check failed: $(head -c 3000 "${TMP}/job.html")"
import re, sys
dom = open(sys.argv[1]).read()
row = re.search(r'<tr data-rank="1" class="diagnosed">(.*?)</tr>', dom, re.S)
if not row:
    sys.exit("rank 1's row is not highlighted")
if 'NEVER_JOINED rank 1 has not entered collective #' not in row.group(1):
    sys.exit("rank 1's row lacks the diagnosis text: " + row.group(1))
if re.search(r'<tr data-rank="0" class="diagnosed">', dom):
    sys.exit("rank 0 (which waits) is highlighted too")
chart = re.search(r'id="loss-chart".*?<canvas[^>]*?\bwidth="(\d+)"[^>]*?\bheight="(\d+)"', dom, re.S)
if not chart or int(chart.group(1)) == 0 or int(chart.group(2)) == 0:
    sys.exit("the loss chart has no drawn canvas")
if 'class="u-title">loss / eval accuracy<' not in dom:
    sys.exit("the loss chart has no title")
PY
chromium --screenshot="${SHOTS}/job_page.png" "${base}/jobs/${job}" >/dev/null
[[ -s "${SHOTS}/job_page.png" ]] && pass "screenshot kept: ${SHOTS}/job_page.png ($(wc -c <"${SHOTS}/job_page.png") bytes)" \
  || fail "no screenshot: $(tail -3 "${TMP}/chromium.log")"
# A second job waits for the slots the first holds: the Queue section shows
# it with its reason, the Users section the slots and jobs of the user.
queued=$("${CHORUS}" --coordinator "${COORDINATOR_ADDR}" submit "${TMP}/skip.textproto" 2>"${TMP}/submit2.err")
chromium --dump-dom "${base}/" >"${TMP}/jobs.html"
grep -q "href=\"/jobs/${job}\"" "${TMP}/jobs.html" && pass "the job list links the job" \
  || fail "job list: $(head -c 2000 "${TMP}/jobs.html")"
python3 - "${TMP}/jobs.html" "${queued}" <<'PY' && pass "the Queue and Users sections show the waiting job and the user's slots" || fail "queue/users: $(grep -o '<h2>Queue.*' "${TMP}/jobs.html" | head -c 3000)"
import re, sys
dom, queued = open(sys.argv[1]).read(), sys.argv[2]
row = re.search(r'<tr data-queued="%s">(.*?)</tr>' % re.escape(queued), dom, re.S)
if not row:
    sys.exit("no queue row for " + queued)
if 'CPU reservation' not in row.group(1) or 'waiting for 2 free CPU slots' not in row.group(1):
    sys.exit("the queue row lacks the reservation or the reason: " + row.group(1))
user = re.search(r'<tr data-user="">(.*?)</tr>', dom, re.S)
if not user or '>anonymous<' not in user.group(1) or '>2 CPU<' not in user.group(1):
    sys.exit("no Users row for the anonymous user with 2 CPU slots")
PY
"${CHORUS}" --coordinator "${COORDINATOR_ADDR}" cancel "${queued}" >/dev/null 2>&1

# --- the JSON behind the live refresh, and a clean 404
api=$(http_get "${base}/api/jobs/${job}")
[[ "${api}" == "200 {\"status\":"* && "${api}" == *'"kind":"NEVER_JOINED"'* ]] \
  && pass "/api/jobs/${job} carries the diagnosis" || fail "api: ${api:0:300}"
missing=$(http_get "${base}/jobs/job-999999")
[[ "${missing}" == "404 "*"There is no job &quot;job-999999&quot; on this coordinator."* ]] \
  && pass "an unknown job's page is a clean 404" || fail "unknown job: ${missing:0:300}"
[[ "$(http_get "${base}/api/jobs/job-999999")" == '404 {"error":"no job job-999999"}' ]] \
  && pass "and its JSON too" || fail "unknown job JSON: $(http_get "${base}/api/jobs/job-999999")"
asset=$(http_get "${base}/assets/uplot.js")
[[ "${asset}" == "200 "*"uPlot"* ]] && pass "the charting library is served from the binary" || fail "uplot.js: ${asset:0:100}"

"${CHORUS}" --coordinator "${COORDINATOR_ADDR}" cancel "${job}" >/dev/null 2>&1
kill -TERM "${COORDINATOR_PID}"
wait_exit "${COORDINATOR_PID}" 20 || fail "coordinator did not stop within 20 s"
finish
