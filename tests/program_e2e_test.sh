#!/usr/bin/env bash
# Program jobs end to end (docs/programs.md), with `chorus up --local 2`.
#
#   program_e2e_test.sh CHORUS faults
#     bad program specs are refused at submit naming program.argv[0]; a
#     program that prints lines and exits 3 fails the job with its exit code
#     and last lines; `chorus up` claims no step or loss for a program that
#     reports nothing (wall_seconds > 0) and shows the step and loss of one
#     that sends a progress record; a program rank frozen with SIGSTOP is diagnosed DEAD in
#     `chorus status`; `chorus cancel` leaves no process behind.
#   program_e2e_test.sh CHORUS torchrun SCRIPT
#     the unmodified torchrun script SCRIPT (tests/bench/torchrun_fashion_mnist.py)
#     run as a program job succeeds with the accuracy it reaches under torchrun
#     (same arguments, same run), within 0.5 point.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHORUS=$1
MODE=$2

# `chorus up` writes the coordinator's port before it submits the job.
start_up() {  # $1 = name, $2 = spec; sets UP_PID and ADDR
  "${CHORUS}" up --local 2 --state_dir "${TMP}/$1" "$2" --json >"${TMP}/$1.out" 2>"${TMP}/$1.err" &
  UP_PID=$!
  track_pid "${UP_PID}"
  wait_for_file "${TMP}/$1/port" 30
  ADDR="127.0.0.1:$(cat "${TMP}/$1/port" 2>/dev/null)"
  wait_for '"${CHORUS}" --coordinator "${ADDR}" status job-000001 >/dev/null 2>&1' 60
}

alive() { kill -0 "$1" 2>/dev/null; }

faults() {
  # --- bad specs are refused at submit, the field named
  printf '#!/bin/sh\nexit 0\n' > "${TMP}/plain.sh"; chmod 0644 "${TMP}/plain.sh"
  local name argv0 dir want out rc
  while IFS='|' read -r name argv0 dir want; do
    printf 'program { argv: "%s" %s }\n' "${argv0}" "${dir:+working_dir: \"${dir}\"}" > "${TMP}/${name}.textproto"
    out=$("${CHORUS}" --coordinator 127.0.0.1:1 submit "${TMP}/${name}.textproto" 2>&1); rc=$?
    [[ ${rc} -eq 2 && "${out}" == *"${want}"* ]] && pass "submit refuses ${name}: ${out##*$'\n'}" \
      || fail "submit ${name}: rc=${rc} out='${out}' want '${want}'"
    out=$("${CHORUS}" validate "${TMP}/${name}.textproto" 2>&1); rc=$?
    [[ ${rc} -eq 2 && "${out}" == *"${want}"* ]] && pass "validate refuses ${name}" \
      || fail "validate ${name}: rc=${rc} out='${out}'"
  done <<EOF
missing|${TMP}/no/such/train||program.argv[0]: ${TMP}/no/such/train does not exist
not_executable|${TMP}/plain.sh||program.argv[0]: ${TMP}/plain.sh is not executable (mode 0644)
unresolved|bin/train|${TMP}|program.argv[0]: relative path bin/train does not resolve against program.working_dir ${TMP} (${TMP}/bin/train does not exist)
EOF

  # --- a program that prints lines and exits 3 fails the job with both
  cat > "${TMP}/exit3.textproto" <<'SPEC'
name: "exits-3"
program {
  argv: ["/bin/bash", "-c",
         "if [[ $RANK == 1 ]]; then echo 'loading shard 1'; echo 'step 40 loss 0.51'; echo 'error: shard 1 is corrupt' >&2; exit 3; fi; exec sleep 60"]
}
resources { min_ranks: 2 }
SPEC
  out=$(timeout 90 "${CHORUS}" up --local 2 --state_dir "${TMP}/exit3" "${TMP}/exit3.textproto" --json 2>"${TMP}/exit3.err"); rc=$?
  local last reason
  last=$(tail -n 1 <<<"${out}")
  reason=$(json_get - reason <<<"${last}")
  [[ ${rc} -eq 1 && "$(json_get - state <<<"${last}")" == FAILED \
     && "${reason}" == "rank 1 ("*") exited with code 3; last output: loading shard 1 | step 40 loss 0.51 | error: shard 1 is corrupt" ]] \
    && pass "exit 3 fails the job: ${reason}" || fail "exit 3: rc=${rc} reason='${reason}' err=$(tail -3 "${TMP}/exit3.err")"
  assert_no_leftovers "a program that exited 3"

  # --- what `chorus up` says of a program: only what it reported, and its wall time
  cat > "${TMP}/quiet.textproto" <<'SPEC'
name: "quiet"
program { argv: ["/bin/bash", "-c", "sleep 2"] }
resources { min_ranks: 2 }
SPEC
  out=$(timeout 90 "${CHORUS}" up --local 2 --state_dir "${TMP}/quiet" "${TMP}/quiet.textproto" --json 2>"${TMP}/quiet.err"); rc=$?
  last=$(tail -n 1 <<<"${out}")
  local wall
  wall=$(json_get - final_metrics.wall_seconds <<<"${last}")
  [[ ${rc} -eq 0 && "$(json_get - state <<<"${last}")" == SUCCEEDED ]] \
    && ! json_get - final_metrics.steps <<<"${last}" >/dev/null \
    && ! json_get - final_metrics.train_loss <<<"${last}" >/dev/null \
    && awk -v w="${wall}" 'BEGIN { exit !(w > 0 && w < 90) }' \
    && grep -q '^job-000001 RUNNING$' "${TMP}/quiet.err" \
    && ! grep -Eq 'step 0|loss 0\.0000| 0 samples/s' "${TMP}/quiet.err" \
    && pass "a program that reports nothing: no step or loss claimed, wall_seconds ${wall}" \
    || fail "quiet program: rc=${rc} last='${last}' err=$(cat "${TMP}/quiet.err")"

  # The record tag byte P, then a RankHeartbeat with step 7 (field 4) and loss
  # 0.25 (field 11, a double): what rank 0 sends on the progress channel the
  # way ProgressSender does (worker/runtime/progress_channel.cc).
  cat > "${TMP}/progress.py" <<'PY'
import os, socket, struct, time
if os.environ["RANK"] == "0":
    channel = socket.socket(fileno=int(os.environ["CHORUS_PROGRESS_FD"]))
    channel.send(b"P" + bytes([0x20, 7, 0x59]) + struct.pack("<d", 0.25))
time.sleep(3)
PY
  cat > "${TMP}/progress.textproto" <<SPEC
name: "progress"
program { argv: ["/usr/bin/python3", "${TMP}/progress.py"] }
resources { min_ranks: 2 }
SPEC
  out=$(timeout 90 "${CHORUS}" up --local 2 --state_dir "${TMP}/progress" "${TMP}/progress.textproto" --json 2>"${TMP}/progress.err"); rc=$?
  last=$(tail -n 1 <<<"${out}")
  [[ ${rc} -eq 0 && "$(json_get - final_metrics.steps <<<"${last}")" == 7 \
     && "$(json_get - final_metrics.train_loss <<<"${last}")" == 0.25 ]] \
    && grep -q '^job-000001 RUNNING step 7 loss 0.2500$' "${TMP}/progress.err" \
    && pass "a program's progress record is its job's step and loss in chorus up" \
    || fail "progress program: rc=${rc} last='${last}' err=$(cat "${TMP}/progress.err")"

  # --- a frozen program rank is diagnosed DEAD; cancel then ends every process
  cat > "${TMP}/frozen.textproto" <<SPEC
name: "frozen"
program {
  argv: ["/bin/bash", "-c", "echo \$\$ > ${TMP}/program.\$RANK; exec sleep 120"]
}
resources { min_ranks: 2 }
hang_detection { dead_after_seconds: 3 }
SPEC
  start_up frozen "${TMP}/frozen.textproto"
  wait_for '[[ -s "${TMP}/program.0" && -s "${TMP}/program.1" ]]' 30 \
    && pass "both programs started" || fail "programs did not start: $(cat "${TMP}/frozen.err")"
  local p0 p1 s0 s1 status found=""
  p0=$(cat "${TMP}/program.0" 2>/dev/null); p1=$(cat "${TMP}/program.1" 2>/dev/null)
  # The supervisors: the rank pids `chorus status --json` lists.
  wait_for 'status=$("${CHORUS}" --coordinator "${ADDR}" status job-000001 --json 2>/dev/null)
            s0=$(json_get - "ranks[0].pid" <<<"${status}"); s1=$(json_get - "ranks[1].pid" <<<"${status}")
            [[ -n "${s0}" && "${s0}" != 0 && -n "${s1}" && "${s1}" != 0 ]]' 20
  [[ -n "${p1}" && "$(ps -o ppid= -p "${p1}" | tr -d ' ')" == "${s1}" ]] \
    && pass "rank 1's program (pid ${p1}) is its supervisor's (pid ${s1}) child" \
    || fail "program 1 pid '${p1}' parent $(ps -o ppid= -p "${p1}" 2>/dev/null) vs supervisor '${s1}'"
  # chorus-rank does not load LibTorch (it executes chorus-trainer only for
  # built-in jobs): a program's supervisor stays small.
  if [[ -r "/proc/${s1}/maps" ]] && ! grep -q libtorch "/proc/${s1}/maps"; then
    pass "the supervisor holds no LibTorch ($(awk '/VmRSS/ {print $2, $3}' "/proc/${s1}/status") resident)"
  else
    fail "supervisor ${s1} maps LibTorch: $(grep -m1 libtorch "/proc/${s1}/maps")"
  fi
  kill -STOP "${p1}"
  wait_for 'status=$("${CHORUS}" --coordinator "${ADDR}" status job-000001 2>/dev/null)
            found=$(grep "DEAD" <<<"${status}"); [[ -n "${found}" ]]' 30
  [[ "${found}" == *"DEAD rank 1 has sent no heartbeat for "*"stopped or not responding"* && "${found}" != *"rank 0"* ]] \
    && pass "status names the frozen rank: ${found}" || fail "no DEAD for rank 1 in: ${status}"
  alive "${s1}" && alive "${p1}" && pass "the frozen rank's processes are still there (not exited)" \
    || fail "supervisor ${s1} or program ${p1} is gone"
  kill -CONT "${p1}"
  out=$("${CHORUS}" --coordinator "${ADDR}" cancel job-000001 2>&1); rc=$?
  [[ ${rc} -eq 0 ]] && pass "cancel: ${out}" || fail "cancel rc=${rc} out='${out}'"
  wait_for '! alive "${p0}" && ! alive "${p1}" && ! alive "${s0}" && ! alive "${s1}"' 20 \
    && pass "cancel ended both programs and both supervisors" \
    || fail "left after cancel: $(ps -o pid,stat,args -p "${p0},${p1},${s0},${s1}" 2>&1)"
  wait_exit "${UP_PID}" 30 || fail "chorus up still running 30 s after the cancel"
  wait "${UP_PID}"; rc=$?
  [[ ${rc} -ne 0 && "$(json_get - state <<<"$(tail -n 1 "${TMP}/frozen.out")")" == CANCELLED ]] \
    && pass "chorus up ends with the job CANCELLED (exit ${rc})" \
    || fail "up rc=${rc} out=$(cat "${TMP}/frozen.out")"
  assert_no_leftovers "a cancelled program job"
}

torchrun_case() {
  local script python=/usr/bin/python3
  script=$(realpath "$1")
  # The same script and arguments both ways; 2 epochs keep it short.
  local args=(--epochs 2)
  cat > "${TMP}/torchrun.yaml" <<SPEC
name: torchrun-script
program:
  argv: [${python}, ${script}$(printf ', "%s"' "${args[@]}")]
  env: {GLOO_SOCKET_IFNAME: lo}
resources: {min_ranks: 2}
SPEC
  local out rc ours peer
  out=$(timeout 240 "${CHORUS}" up --local 2 --state_dir "${TMP}/ours" "${TMP}/torchrun.yaml" --json 2>"${TMP}/ours.err"); rc=$?
  ours=$(grep -m 1 -o 'FINAL {.*' "${TMP}/ours/worker.log" | sed 's/^FINAL //')
  [[ ${rc} -eq 0 && "$(json_get - state <<<"$(tail -n 1 <<<"${out}")")" == SUCCEEDED && -n "${ours}" ]] \
    && pass "the torchrun script ran as a program job: ${ours}" \
    || fail "program job rc=${rc} out='${out}' err=$(tail -5 "${TMP}/ours.err")"

  mkdir -p "${TMP}/peer_logs"
  OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo timeout 240 "${python}" -m torch.distributed.run \
    --standalone --nproc_per_node 2 --redirects 1 --tee 1 --log_dir "${TMP}/peer_logs" \
    "${script}" "${args[@]}" >"${TMP}/peer.out" 2>"${TMP}/peer.err"; rc=$?
  peer=$(grep -m 1 -o 'FINAL {.*' "${TMP}/peer.out" | sed 's/^FINAL //')
  [[ ${rc} -eq 0 && -n "${peer}" ]] && pass "the same script under torchrun: ${peer}" \
    || fail "torchrun rc=${rc} err=$(tail -5 "${TMP}/peer.err")"
  local a b
  a=$(json_get - test_accuracy <<<"${ours}"); b=$(json_get - test_accuracy <<<"${peer}")
  awk -v a="${a:-0}" -v b="${b:-1}" 'BEGIN { exit !(a >= b - 0.005 && a >= 0.85) }' \
    && pass "accuracy as a program job ${a} vs ${b} under torchrun (within 0.5 point)" \
    || fail "accuracy as a program job '${a}' vs '${b}' under torchrun"
  assert_no_leftovers "the torchrun script as a program job"
}

case "${MODE}" in
  faults) faults ;;
  torchrun) torchrun_case "$3" ;;
  *) fail "unknown mode '${MODE}'" ;;
esac
finish
