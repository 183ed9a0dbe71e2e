#!/usr/bin/env bash
# `chorus checkpoint` reaches ranks as SIGUSR1 from their agent. A rank whose
# libraries are still loading has no handler yet, and SIGUSR1's default
# action kills it: the agent starts ranks with SIGUSR1 blocked, and
# chorus-rank unblocks it once its handler is installed, so an early request
# waits instead. Checked at both ends: chorus-rank started with SIGUSR1
# blocked and sent one at once survives it (started without, it is killed),
# and the agent really starts its rank processes with SIGUSR1 blocked (and
# nothing else).
#
# Usage (from Bazel): rank_signal_e2e_test.sh COORDINATOR CHORUS WORKER RANK
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COORDINATOR=$(realpath "$1")
CHORUS=$(realpath "$2")
WORKER=$(realpath "$3")
RANK=$(realpath "$4")

# --- chorus-rank: SIGUSR1 the moment it starts (no job environment, so it
# exits 1 saying what is missing, unless the signal kills it first)
out=$(python3 - "${RANK}" <<'PY' 2>&1
import os, signal, subprocess, sys
def start(blocked):
    how = signal.SIG_BLOCK if blocked else signal.SIG_UNBLOCK
    old = signal.pthread_sigmask(how, {signal.SIGUSR1})
    p = subprocess.Popen([sys.argv[1]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    os.kill(p.pid, signal.SIGUSR1)
    _, err = p.communicate(timeout=60)
    return p.returncode, b"must be set" in err
print("blocked", [start(True) for _ in range(5)])
print("unblocked", [start(False) for _ in range(2)])
PY
)
[[ "${out}" == *"blocked [(1, True), (1, True), (1, True), (1, True), (1, True)]"* ]] \
  && pass "a rank started with SIGUSR1 blocked survives one sent at once (exit 1: no job environment)" \
  || fail "rank with SIGUSR1 blocked: ${out}"
# The race the mask closes: without it the signal lands before the handler.
[[ "${out}" == *"unblocked [(-10, False), (-10, False)]"* ]] \
  && pass "without the mask the same signal kills it (the race is real)" \
  || echo "note: without the mask the rank was not killed this time: ${out}"

# --- the agent starts its ranks with SIGUSR1 (and only it) blocked
start_coordinator -s "${TMP}/state" || fail "no coordinator started"
addr=${COORDINATOR_ADDR:-}
# (Python, not sh: a shell resets its signal mask when it starts.)
cat > "${TMP}/fake_rank.py" <<FAKE
#!/usr/bin/env python3
import os
blk = [l.split()[1] for l in open("/proc/self/status") if l.startswith("SigBlk:")][0]
open("${TMP}/sigblk.%d" % os.getpid(), "w").write(blk + "\\n")
FAKE
chmod +x "${TMP}/fake_rank.py"
"${WORKER}" --coordinator "${addr}" --slots 1 --rank_binary "${TMP}/fake_rank.py" 2>"${TMP}/worker.log" &
track_pid $!
printf 'model { mlp { hidden_sizes: [8] } }\ndata { synthetic { num_samples: 64 input_shape: [4] num_classes: 2 } }\nresources { min_ranks: 1 max_ranks: 1 }\n' \
  > "${TMP}/job.textproto"
"${CHORUS}" --coordinator "${addr}" submit "${TMP}/job.textproto" >/dev/null 2>"${TMP}/submit.err" \
  || fail "submit: $(cat "${TMP}/submit.err")"
blk=""
wait_for 'f=$(ls "${TMP}"/sigblk.* 2>/dev/null | head -n 1); [[ -n "${f}" && -s "${f}" ]] && blk=$(cat "${f}")' 15
# SIGUSR1 is signal 10: bit 9 of the mask, 0x200.
[[ "${blk}" == "0000000000000200" ]] && pass "the agent started the rank with SigBlk ${blk} (SIGUSR1 only)" \
  || fail "rank's blocked signals: '${blk}' (worker log: $(tail -3 "${TMP}/worker.log"))"

finish
