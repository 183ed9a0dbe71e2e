#!/usr/bin/env bash
# deploy/slurm/chorus.sbatch against a real Slurm (Debian's slurmctld, slurmd
# and munge), configured here on loopback: its own munge key and socket, its
# own ports, config and state under a temporary directory; everything is
# stopped at the end. Two Slurm nodes of one CPU each (two slurmd, `-N`, on
# this machine, both at 127.0.0.1 with their own ports), so every job is a
# two-node allocation: one agent per node, each offering its node's slot.
#   1. sbatch the script with a short Fashion-MNIST job: Slurm records the
#      batch job COMPLETED (`sacct --completion`, which reads the
#      jobcomp/filetxt log: there is no slurmdbd here, so plain `sacct` has no
#      accounting to read) with exit code 0:0, and the job's output shows the
#      Chorus job SUCCEEDED.
#   2. sbatch a long job, scancel it once it trains: Slurm records it
#      CANCELLED and no Chorus process (coordinator, agent, rank) is left.
# Needs root (slurmd starts jobs as their user) and the packages slurmctld,
# slurmd, slurm-client and munge (deploy/setup.sh).
#
# Usage (from Bazel): slurm_e2e_test.sh INSTALL
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

INSTALL=$1
DATA=/usr/share/datasets/fashion-mnist
for tool in munged slurmctld slurmd sbatch scancel sacct scontrol sinfo; do
  command -v "${tool}" >/dev/null || { fail "${tool} missing: run deploy/setup.sh (slurm-wlm, munge)"; finish; }
done
[[ ${EUID} -eq 0 ]] || { fail "needs root: slurmd runs jobs as the submitting user"; finish; }

# Short paths: munge's socket path must fit in sockaddr_un.
S=$(mktemp -d /tmp/chorus-slurm.XXXXXX)
# At exit, in this order: cancel what is left, shut Slurm down (its daemons
# need munge for that), stop munge, kill what did not stop, remove S.
daemons=()
stop_everything() {
  local pid
  scancel --quiet --full --signal=KILL --partition=chorus 2>/dev/null
  scontrol shutdown >/dev/null 2>&1
  for pid in "${daemons[@]}"; do wait_exit "${pid}" 15 || kill -KILL "${pid}" 2>/dev/null; done
  [[ -n "${munged_pid:-}" ]] && { kill -TERM "${munged_pid}" 2>/dev/null; wait_exit "${munged_pid}" 5 || kill -KILL "${munged_pid}" 2>/dev/null; }
  pkill -KILL -f -- "${S}/opt/chorus/bin/" 2>/dev/null
  # The jobs' output and Chorus' logs, for a failure's post-mortem.
  [[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]] && cp -r "${S}/jobs" "${S}/log" "${TEST_UNDECLARED_OUTPUTS_DIR}/" 2>/dev/null
  rm -rf "${S}"
}
on_exit stop_everything
PREFIX="${S}/opt/chorus"
"${INSTALL}" --prefix "${PREFIX}" >"${TMP}/install.log" 2>&1 \
  || { fail "install: $(cat "${TMP}/install.log")"; finish; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# --- munge: a fresh key, a socket of our own
mkdir -p "${S}/munge" "${S}/etc" "${S}/ctld" "${S}/spool" "${S}/log" "${S}/jobs"
chmod 755 "${S}" "${S}/munge"
head -c 128 /dev/urandom > "${S}/munge/munge.key" && chmod 400 "${S}/munge/munge.key"
munged --foreground --force --socket="${S}/munge/munge.sock" --key-file="${S}/munge/munge.key" \
  --log-file="${S}/log/munged.log" --pid-file="${S}/munge/munged.pid" \
  --seed-file="${S}/munge/munged.seed" 2>>"${S}/log/munged.out" &
munged_pid=$!
wait_for '[[ -S "${S}/munge/munge.sock" ]]' 20 || { fail "munged: $(cat "${S}/log/munged.out")"; finish; }

# --- Slurm: two nodes (this machine twice, as 127.0.0.1), one partition
host=$(hostname -s)
export SLURM_CONF="${S}/etc/slurm.conf"
cat > "${SLURM_CONF}" <<CONF
ClusterName=choruse2e
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=${S}/munge/munge.sock
CredType=cred/munge
StateSaveLocation=${S}/ctld
SlurmdSpoolDir=${S}/spool-%n
SlurmctldPidFile=${S}/slurmctld.pid
SlurmdPidFile=${S}/slurmd-%n.pid
SlurmctldLogFile=${S}/log/slurmctld.log
SlurmdLogFile=${S}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=${S}/log/jobcomp.txt
KillWait=10
MinJobAge=600
NodeName=chorus1 NodeHostname=${host} NodeAddr=127.0.0.1 Port=$(free_port) CPUs=1 State=UNKNOWN
NodeName=chorus2 NodeHostname=${host} NodeAddr=127.0.0.1 Port=$(free_port) CPUs=1 State=UNKNOWN
PartitionName=chorus Nodes=chorus1,chorus2 Default=YES MaxTime=10 State=UP
CONF
slurmctld -D -f "${SLURM_CONF}" >>"${S}/log/slurmctld.out" 2>&1 &
daemons+=($!)
for node in chorus1 chorus2; do
  slurmd -D -N "${node}" -f "${SLURM_CONF}" >>"${S}/log/slurmd-${node}.out" 2>&1 &
  daemons+=($!)
done
if wait_for '[[ "$(sinfo -h -o "%D %t" 2>/dev/null)" == "2 idle" ]]' 60; then
  pass "slurmctld + slurmd up: $(sinfo -h -o '%P %D %t %c')"
else
  fail "no idle Slurm node in 60 s: $(sinfo 2>&1) $(tail -5 "${S}"/log/slurm*.log)"
  finish
fi

# job_state ID: the state slurmctld holds for batch job ID.
job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
ended() { [[ "$(job_state "$1")" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]; }
chorus_processes() { pgrep -f -- "${PREFIX}/bin/chorus" || true; }

# --- 1. a short Fashion-MNIST job runs to completion
cat > "${S}/jobs/fashion.textproto" <<SPEC
name: "slurm-fashion"
model { mlp { hidden_sizes: [128] } }
data { fashion_mnist { dir: "${DATA}" train_limit: 20000 } }
training { batch_size_per_rank: 64 epochs: 1 seed: 1 log_every_steps: 20 }
optimizer { kind: SGD lr: 0.05 momentum: 0.9 }
resources { min_ranks: 2 max_ranks: 2 }
SPEC
started=$(date +%s)
job=$(cd "${S}/jobs" && sbatch --parsable --exclusive --nodes 2 --time 5 --output "${S}/jobs/%j.out" \
  "${PREFIX}/share/chorus/slurm/chorus.sbatch" fashion.textproto)
[[ "${job}" =~ ^[0-9]+$ ]] && pass "sbatch: job ${job}" || { fail "sbatch printed '${job}'"; finish; }
wait_for "ended ${job}" 240 || fail "job ${job} still $(job_state "${job}") after 240 s"
completion=$(sacct --completion -j "${job}" -n -P -o JobID,State,ExitCode 2>&1)
[[ "${completion}" == "${job}|COMPLETED|0:0" ]] \
  && pass "sacct --completion: ${completion} ($(( $(date +%s) - started )) s)" \
  || fail "sacct --completion: '${completion}'; output: $(tail -20 "${S}/jobs/${job}.out")"
grep -q "SUCCEEDED" "${S}/jobs/${job}.out" && pass "the Chorus job SUCCEEDED: $(grep SUCCEEDED "${S}/jobs/${job}.out" | tail -1)" \
  || fail "no SUCCEEDED in the job output: $(tail -20 "${S}/jobs/${job}.out")"
acc=$(grep -o 'SUCCEEDED .*test acc [0-9.]*' "${S}/jobs/${job}.out" | awk '{print $NF}')
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.7) }' && pass "Fashion-MNIST test accuracy ${acc} > 0.7" \
  || fail "test accuracy '${acc}' not above 0.7"
# One agent per node, each offering that node's one CPU.
offers=$(grep -o 'on chorus[12] offers [0-9]* CPU slot' "${S}/jobs/chorus-${job}/coordinator.log" | sort -u | paste -sd';')
[[ "${offers}" == "on chorus1 offers 1 CPU slot;on chorus2 offers 1 CPU slot" ]] \
  && pass "one agent per node with its slots: ${offers}" || fail "agents: '${offers}'"
[[ -s "${S}/jobs/chorus-${job}/coordinator.log" ]] && pass "coordinator state kept in chorus-${job}/" \
  || fail "no coordinator log under ${S}/jobs/chorus-${job}"
wait_for '[[ -z "$(chorus_processes)" ]]' 20 && pass "no Chorus process after the job" \
  || fail "left after job ${job}: $(ps -o pid,args -p "$(chorus_processes | paste -sd,)")"

# --- 2. scancel mid-training leaves nothing behind
sed -e 's/epochs: 1/epochs: 1000/' -e 's/name: "slurm-fashion"/name: "slurm-cancel"/' \
  "${S}/jobs/fashion.textproto" > "${S}/jobs/long.textproto"
job=$(cd "${S}/jobs" && sbatch --parsable --exclusive --nodes 2 --time 5 --output "${S}/jobs/%j.out" \
  "${PREFIX}/share/chorus/slurm/chorus.sbatch" long.textproto)
[[ "${job}" =~ ^[0-9]+$ ]] && pass "sbatch: long job ${job}" || { fail "sbatch printed '${job}'"; finish; }
if wait_for 'grep -q "RUNNING step [1-9]" "${S}/jobs/${job}.out" 2>/dev/null' 120; then
  pass "long job trains: $(grep -o 'RUNNING step [0-9]*' "${S}/jobs/${job}.out" | tail -1)"
else
  fail "long job ${job} never trained: $(tail -10 "${S}/jobs/${job}.out" 2>&1)"
fi
# A built-in job's ranks run as chorus-trainer (chorus-rank executes it).
ranks=$(pgrep -fc -- "${PREFIX}/bin/chorus-trainer")
[[ ${ranks} -eq 2 ]] && pass "2 rank processes before scancel" || fail "${ranks} rank processes before scancel"
scancel "${job}"
wait_for "ended ${job}" 60 || fail "job ${job} still $(job_state "${job}") 60 s after scancel"
[[ "$(job_state "${job}")" == CANCELLED ]] && pass "scancel: job ${job} CANCELLED" \
  || fail "after scancel job ${job} is $(job_state "${job}")"
wait_for '[[ -z "$(chorus_processes)" ]]' 30 && pass "no Chorus process after scancel" \
  || fail "left after scancel: $(ps -o pid,args -p "$(chorus_processes | paste -sd,)")"
# The script's own teardown ran (not only Slurm's SIGKILL after KillWait).
# Slurm sends SIGTERM to the script and to chorus submit at once: either the
# script's trap runs first ("cancelled") or chorus submit ends first and the
# script tears down on its way out; both stop Chorus themselves.
grep -q "chorus.sbatch: stopping Chorus" "${S}/jobs/${job}.out" \
  && grep -q "coordinator stopped" "${S}/jobs/chorus-${job}/coordinator.log" \
  && pass "the script stopped Chorus itself" \
  || fail "no clean teardown: $(tail -3 "${S}/jobs/${job}.out") / $(tail -2 "${S}/jobs/chorus-${job}/coordinator.log")"
completion=$(sacct --completion -j "${job}" -n -P -o JobID,State 2>&1)
[[ "${completion}" == "${job}|CANCELLED" ]] && pass "sacct --completion: ${completion}" \
  || fail "sacct --completion after scancel: '${completion}'"
finish
