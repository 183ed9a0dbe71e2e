#!/usr/bin/env bash
# Elastic Python in process (docs/python.md "Elastic scripts"):
# examples/programs/python_elastic.py as a 2-rank `program` job with an
# elastic block and a spare slot. Rank 1's python is killed with SIGKILL
# mid-run: the job succeeds; rank 0's python keeps its process (same PID),
# joins generation 2 in it and redoes no step; the newcomer takes the
# newest state (model, momentum, data position) from rank 0; both end bit
# for bit with the parameters of an undisturbed run (2 ranks: every
# all-reduce adds the same two numbers, and the newcomer trains the lost
# rank's shard).
#
# With min_ranks 1 (Note [Staged growth] in coordinator/scheduling/staged_growth.h)
# the survivor forms generation 2 alone, in the same process and without a
# step redone; the newcomer's program starts before generation 3 forms and
# joins it itself, through its supervisor and node agent as every other
# join; both end together. There the example runs under a wrapper that
# paces its steps while it trains alone (below: "the survivor alone").
#
# Usage (from Bazel): python_elastic_e2e_test.sh CHORUS INIT_PY NATIVE_SO SCRIPT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$(realpath "$1")
INIT=$(realpath "$2")
NATIVE=$(realpath "$3")
SCRIPT=$(realpath "$4")
field() { json_get - "$2" <<<"$1"; }
lines() { grep -h -o "$2.*" "$1/worker.log" 2>/dev/null; }
digest_of() { grep -o "params_digest [0-9a-f]*" | cut -d' ' -f2 | sort -u; }

mkdir -p "${TMP}/site/chorus"
cp "${INIT}" "${TMP}/site/chorus/__init__.py"
cp "${NATIVE}" "${TMP}/site/chorus/_C.so"

# The example's arguments: 400 steps, 10 ms pause a step so that the test
# can act mid-run.
example_args="\"${SCRIPT}\", \"--steps=400\", \"--step_sleep_ms=10\""
# spec NAME [MIN_RANKS [ARGS]]: the job spec, its program python3 ARGS
# (default the example's).
spec() {
  cat <<SPEC
name: "$1"
program {
  argv: ["/usr/bin/python3", ${3:-${example_args}}]
  env { key: "PYTHONPATH" value: "${TMP}/site" }
}
resources { min_ranks: ${2:-2} max_ranks: 2 threads_per_rank: 1 }
elastic { max_restarts: 2 wait_seconds: 60 }
hang_detection { action: RESTART dead_after_seconds: 4 stall_after_seconds: 3 }
SPEC
}

# --- undisturbed reference run
spec reference > "${TMP}/ref.textproto"
out=$(timeout 120 "${CHORUS}" up --local 2 --state_dir "${TMP}/ref" "${TMP}/ref.textproto" --json \
  2>"${TMP}/ref.err"); rc=$?
ref_finals=$(lines "${TMP}/ref" "final: rank ")
ref_digest=$(digest_of <<<"${ref_finals}")
[[ ${rc} -eq 0 && "$(field "$(tail -n 1 <<<"${out}")" state)" == SUCCEEDED \
   && $(grep -c "generation 1 step 400 " <<<"${ref_finals}") -eq 2 && "${ref_digest}" =~ ^[0-9a-f]{16}$ ]] \
  && pass "undisturbed run: both ranks end at step 400 with parameters ${ref_digest}" \
  || fail "reference rc=${rc} finals='${ref_finals}' err=$(tail -3 "${TMP}/ref.err") $(tail -5 "${TMP}/ref/worker.log")"
[[ "$(field "$(tail -n 1 <<<"${out}")" final_metrics.steps)" == 400 ]] \
  && pass "the job's final step is the script's last (400)" || fail "final metrics: $(tail -n 1 <<<"${out}")"

# --- rank 1's python killed past step 150, with a spare slot
state="${TMP}/killed"
spec killed > "${TMP}/killed.textproto"
timeout 150 "${CHORUS}" up --local 3 --state_dir "${state}" "${TMP}/killed.textproto" --json \
  >"${TMP}/killed.out" 2>"${TMP}/killed.err" &
up_pid=$!
track_pid "${up_pid}"
wait_for '[[ -n "$(lines "${state}" "progress: rank 1 step 150")" ]]' 90
victim=$(lines "${state}" "joined: rank 1 of 2 generation 1 pid " | head -n 1 | awk '{print $NF}')
survivor=$(lines "${state}" "joined: rank 0 of 2 generation 1 pid " | head -n 1 | awk '{print $NF}')
if [[ "${victim}" =~ ^[0-9]+$ ]] && kill -KILL "${victim}"; then
  pass "SIGKILL to rank 1's python (pid ${victim}) at $(lines "${state}" "progress: rank 1 " | tail -n 1)"
else
  fail "no rank 1 python to kill ('${victim}'); $(tail -3 "${TMP}/killed.err")"
fi
wait_exit "${up_pid}" 120 || fail "chorus up still running 120 s after the kill"
wait "${up_pid}"; rc=$?
last=$(tail -n 1 "${TMP}/killed.out")
finals=$(lines "${state}" "final: rank ")
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED ]] \
  && pass "the job succeeded" || fail "rc=${rc} '${last}' $(tail -3 "${TMP}/killed.err")"
[[ $(grep -c "generation 2 step 400 " <<<"${finals}") -eq 2 ]] \
  && pass "two ranks of generation 2 finished at step 400" || fail "finals '${finals}'"
rejoined=$(lines "${state}" "joined: rank 0 of 2 generation 2 pid " | awk '{print $NF}')
[[ -n "${survivor}" && "${rejoined}" == "${survivor}" ]] \
  && pass "rank 0 joined generation 2 in its own process (pid ${survivor})" \
  || fail "rank 0 rejoined as pid '${rejoined}' (was pid ${survivor})"
lost=$(lines "${state}" "lost: rank 0 at step " | head -n 1)
held=$(lines "${state}" "state: rank 0 generation 2 held ")
if [[ "${lost}" =~ at\ step\ ([0-9]+): && "${held}" == "state: rank 0 generation 2 held ${BASH_REMATCH[1]} now step ${BASH_REMATCH[1]} "* ]]; then
  pass "the survivor kept step ${BASH_REMATCH[1]}: no step redone (${held})"
else
  fail "survivor: lost '${lost}' state '${held}'"
fi
newcomer=$(lines "${state}" "state: rank 1 generation 2 held -1 now step ")
[[ "${newcomer}" =~ now\ step\ ([0-9]+) && ${BASH_REMATCH[1]} -ge 150 ]] \
  && pass "the newcomer took the newest state: ${newcomer}" || fail "newcomer state '${newcomer}'"
d=$(digest_of <<<"${finals}")
[[ -n "${d}" && "${d}" == "${ref_digest}" ]] \
  && pass "both ranks end bit for bit with the undisturbed run's parameters (${d})" \
  || fail "digests '${d}' vs undisturbed '${ref_digest}'"

# --- the same with min_ranks 1: staged growth
# The survivor alone: generation 3 forms only if the newcomer's python is up
# before the survivor, training alone in generation 2, has taken its last
# step. At its own pace the survivor takes the ~230 steps left after the
# kill in about 3 s, while the newcomer's python importing torch takes 2-4 s
# on a quiet machine and 30 s was seen beside other work (load 14 on 2
# cores). So the example runs under a wrapper that adds 0.2 s to each step
# it takes alone: some 45 s for the newcomer to come up, whatever the
# machine, and no longer a run when it comes early (the survivor then takes
# a few slow steps alone). The steps and their results are the example's.
cat >"${TMP}/paced_elastic.py" <<'PY'
import importlib.util, sys, time
import chorus

loaded = importlib.util.spec_from_file_location("python_elastic", sys.argv[1])
example = importlib.util.module_from_spec(loaded)
loaded.loader.exec_module(example)


class PacedTrainer(example.Trainer):
    def train_step(self):
        super().train_step()
        if chorus.world_size() == 1:
            time.sleep(0.2)


example.Trainer = PacedTrainer
sys.argv = sys.argv[1:]
sys.exit(example.main())
PY
state="${TMP}/staged"
spec staged 1 "\"${TMP}/paced_elastic.py\", ${example_args}" > "${TMP}/staged.textproto"
timeout 150 "${CHORUS}" up --local 3 --state_dir "${state}" "${TMP}/staged.textproto" --json \
  >"${TMP}/staged.out" 2>"${TMP}/staged.err" &
up_pid=$!
track_pid "${up_pid}"
scrape_up_metrics "${state}" "${up_pid}" "${TMP}/staged.metrics"
wait_for '[[ -n "$(lines "${state}" "progress: rank 1 step 150")" ]]' 90
victim=$(lines "${state}" "joined: rank 1 of 2 generation 1 pid " | head -n 1 | awk '{print $NF}')
survivor=$(lines "${state}" "joined: rank 0 of 2 generation 1 pid " | head -n 1 | awk '{print $NF}')
[[ "${victim}" =~ ^[0-9]+$ ]] && kill -KILL "${victim}" \
  && pass "staged: SIGKILL to rank 1's python (pid ${victim})" || fail "staged: no victim '${victim}'"
wait_exit "${up_pid}" 120 || fail "staged: chorus up still running 120 s after the kill"
wait "${up_pid}"; rc=$?
last=$(tail -n 1 "${TMP}/staged.out")
[[ ${rc} -eq 0 && "$(field "${last}" state)" == SUCCEEDED ]] \
  && pass "staged: the job succeeded" || fail "staged: rc=${rc} '${last}' $(tail -3 "${TMP}/staged.err")"
# Every join went through the node agent: the newcomer's chorus-rank's
# first join, and its program's join of generation 3 through its
# supervisor (Note [The first join through the agent] in
# worker/rank_main.cc).
wait_exit "${SCRAPER_PID}" 10 || fail "staged: the /metrics scraper still runs"
via_rank=$(rank_joins_via "${TMP}/staged.metrics" rank)
via_agent=$(rank_joins_via "${TMP}/staged.metrics" agent)
[[ "${via_rank}" == 0 && "${via_agent}" =~ ^[0-9]+$ && "${via_agent}" -ge 5 ]] \
  && pass "staged: ${via_agent} joins via the agent, 0 via a rank's own Join" \
  || fail "staged: chorus_rank_joins_total via agent '${via_agent}', via rank '${via_rank}'"
alone=$(lines "${state}" "joined: rank 0 of 1 generation 2 pid " | awk '{print $NF}')
grown=$(lines "${state}" "joined: rank 0 of 2 generation 3 pid " | awk '{print $NF}')
[[ -n "${survivor}" && "${alone}" == "${survivor}" && "${grown}" == "${survivor}" ]] \
  && pass "staged: rank 0 formed generation 2 alone and joined generation 3, in its own process" \
  || fail "staged: rank 0 pids: generation 1 '${survivor}', 2 '${alone}', 3 '${grown}'"
lost=$(lines "${state}" "lost: rank 0 at step " | head -n 1)
held=$(lines "${state}" "state: rank 0 generation 2 held ")
if [[ "${lost}" =~ at\ step\ ([0-9]+): && "${held}" == "state: rank 0 generation 2 held ${BASH_REMATCH[1]} now step ${BASH_REMATCH[1]} "* ]]; then
  pass "staged: the survivor kept step ${BASH_REMATCH[1]}: no step redone"
else
  fail "staged: lost '${lost}' state '${held}'"
fi
newcomer=$(lines "${state}" "state: rank 1 generation 3 held -1 now step ")
[[ -n "$(lines "${state}" "joined: rank 1 of 2 generation 3 pid ")" && -n "${newcomer}" ]] \
  && pass "staged: the newcomer joined generation 3 and took the newest state: ${newcomer}" \
  || fail "staged: newcomer '$(lines "${state}" "rank 1 of 2 generation 3")'"
finals=$(lines "${state}" "final: rank ")
[[ $(grep -c "generation 3 step 400 " <<<"${finals}") -eq 2 && $(digest_of <<<"${finals}" | grep -c .) -eq 1 ]] \
  && pass "staged: both ranks of generation 3 end at step 400 with the same parameters" \
  || fail "staged: finals '${finals}'"

assert_no_leftovers "elastic Python programs"
finish
