#!/usr/bin/env bash
# The systemd units as installed by //deploy:install pass
# `systemd-analyze verify` with no warning (ExecStart names the installed
# programs, so the check that they are executable is real), their hardening
# scores stay low (`systemd-analyze security --offline`), the environment
# files are NAME=VALUE lines, and the sysusers file creates the service user
# in a scratch root. No systemd needs to run as PID 1 for any of this.
#
# Usage (from Bazel): systemd_units_test.sh INSTALL
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

INSTALL=$1
PREFIX="${TMP}/opt/chorus"
UNITS="${PREFIX}/share/chorus/systemd"
command -v systemd-analyze >/dev/null || { fail "systemd-analyze missing: run deploy/setup.sh"; finish; }

"${INSTALL}" --prefix "${PREFIX}" >"${TMP}/install.log" 2>&1 \
  || { fail "install: $(cat "${TMP}/install.log")"; finish; }

# verify_quietly UNIT...: rc 0 and nothing printed (bad values are only warnings).
verify_quietly() { local out; out=$(systemd-analyze verify "$@" 2>&1) && [[ -z "${out}" ]] || { echo "${out}"; return 1; }; }

units=("${UNITS}/chorus-coordinator.service" "${UNITS}/chorus-worker.service")
out=$(verify_quietly "${units[@]}") && pass "systemd-analyze verify: both units clean" \
  || fail "systemd-analyze verify: ${out}"
for u in "${units[@]}"; do
  grep -q "^ExecStart=${PREFIX}/bin/chorus-" "${u}" && pass "$(basename "${u}") starts the installed program" \
    || fail "$(basename "${u}"): $(grep ExecStart "${u}")"
  for setting in User=chorus Restart=on-failure ProtectSystem=strict NoNewPrivileges=yes \
                 'CapabilityBoundingSet=$' 'EnvironmentFile=/etc/chorus/'; do
    grep -q "^${setting}" "${u}" || fail "$(basename "${u}") lacks ${setting}"
  done
done
grep -q '^StateDirectory=chorus$' "${units[0]}" && grep -q -- '--state_dir /var/lib/chorus' "${units[0]}" \
  && pass "coordinator state in /var/lib/chorus" || fail "coordinator state dir: $(grep -i state "${units[0]}")"
grep -q '^ExecStart=.*chorus-worker' "${units[1]}" && grep -q '^CHORUS_SLOTS=auto' "${UNITS}/worker.conf" \
  && pass "worker offers --slots auto" || fail "worker.conf: $(cat "${UNITS}/worker.conf")"

# The check can fail: a unit that points at a missing program, or carries a
# value systemd ignores, is reported.
sed "s|^ExecStart=${PREFIX}|ExecStart=${TMP}/nowhere|" "${units[0]}" > "${TMP}/chorus-coordinator.service"
out=$(verify_quietly "${TMP}/chorus-coordinator.service") \
  && fail "a unit with a missing program passed" || pass "a missing program is caught: ${out}"
sed 's/^ProtectSystem=strict/ProtectSystem=maybe/' "${units[1]}" > "${TMP}/chorus-worker.service"
out=$(verify_quietly "${TMP}/chorus-worker.service") \
  && fail "a unit with a bad value passed" || pass "a bad value is caught: ${out}"

# Exposure (0 = locked down, 10 = none): the coordinator needs only its state
# directory and the network; the worker runs LibTorch and may open GPUs.
for pair in chorus-coordinator:20 chorus-worker:40; do
  unit=${pair%%:*} limit=${pair##*:}
  score=$(systemd-analyze security --offline=true "${UNITS}/${unit}.service" 2>&1 | awk '/Overall exposure/ {print $(NF-2)}')
  if systemd-analyze security --offline=true --threshold="${limit}" "${UNITS}/${unit}.service" >/dev/null 2>&1; then
    pass "${unit} exposure ${score} <= $((limit / 10)).0"
  else
    fail "${unit} exposure ${score} above $((limit / 10)).0"
  fi
done

# Three machines with etcd (docs/ha.md): the etcd unit, and the coordinator
# unit with its HA drop-in (systemd-analyze reads UNIT.d/ beside the unit).
out=$(verify_quietly "${UNITS}/chorus-etcd.service" "${units[0]}") \
  && pass "systemd-analyze verify: chorus-etcd.service and the coordinator with its HA drop-in clean" \
  || fail "systemd-analyze verify (HA): ${out}"
[[ -f "${UNITS}/chorus-coordinator.service.d/ha.conf" ]] \
  && grep -q '^ReadWritePaths=/srv/chorus-checkpoints$' "${UNITS}/chorus-coordinator.service.d/ha.conf" \
  && grep -q -- '--checkpoint_dir /srv/chorus-checkpoints' "${UNITS}/coordinator-ha.conf" \
  && pass "the HA drop-in lets the coordinator write coordinator-ha.conf's --checkpoint_dir" \
  || fail "HA drop-in: $(cat "${UNITS}/chorus-coordinator.service.d/ha.conf" 2>&1)"
if systemd-analyze security --offline=true --threshold=20 "${UNITS}/chorus-etcd.service" >/dev/null 2>&1; then
  pass "chorus-etcd exposure <= 2.0"
else
  fail "chorus-etcd exposure: $(systemd-analyze security --offline=true "${UNITS}/chorus-etcd.service" 2>&1 | tail -1)"
fi
cp -r "${UNITS}" "${TMP}/units-bad"
sed -i 's/^ReadWritePaths=/ReadWritePath=/' "${TMP}/units-bad/chorus-coordinator.service.d/ha.conf"
out=$(verify_quietly "${TMP}/units-bad/chorus-coordinator.service") \
  && fail "a drop-in with a bad key passed" || pass "a bad drop-in key is caught: ${out}"
# Every ETCD_ variable is a flag of the installed etcd (ETCD_INITIAL_CLUSTER
# is --initial-cluster).
etcd_help=$(/usr/bin/etcd --help 2>&1)
unknown=""
for name in $(sed -n 's/^\(ETCD_[A-Z_]*\)=.*/\1/p' "${UNITS}/etcd.conf"); do
  flag=$(tr 'A-Z_' 'a-z-' <<<"${name#ETCD_}")
  grep -q -- "--${flag}\b" <<<"${etcd_help}" || unknown+=" ${name}"
done
[[ -z "${unknown}" ]] && pass "etcd.conf: every variable is an etcd flag" || fail "etcd.conf: not etcd's:${unknown}"
flags=$(sed -n 's/^CHORUS_COORDINATOR_FLAGS=//p' "${UNITS}/coordinator-ha.conf")
# shellcheck disable=SC2086
out=$("${PREFIX}/bin/chorus-coordinator" --state_dir /var/lib/chorus ${flags} --check_flags 2>&1) \
  && pass "coordinator-ha.conf's flags are sound: ${out}" || fail "coordinator-ha.conf's flags: ${out}"
# shellcheck disable=SC2086
out=$("${PREFIX}/bin/chorus-coordinator" --state_dir /var/lib/chorus ${flags/--advertise_address 10.0.0.1:29650/} \
      --check_flags 2>&1) \
  && fail "--listen 0.0.0.0 without --advertise_address passed" \
  || { [[ ${out} == *"give --advertise_address"* ]] && pass "a wildcard address to publish is refused: ${out}" \
       || fail "wildcard message: ${out}"; }

# Environment files: comments, blank lines and NAME=VALUE only.
for conf in coordinator.conf worker.conf coordinator-ha.conf etcd.conf; do
  bad=$(grep -vnE '^(#.*|[[:space:]]*|[A-Z_][A-Z0-9_]*=.*)$' "${UNITS}/${conf}")
  [[ -z "${bad}" ]] && pass "${conf} is an environment file" || fail "${conf}: ${bad}"
done

# The shipped flags are sound together: once the checkpoint data port was the
# HTTP port's default, and the HTTP port moved to a random one unannounced.
flags=$(sed -n 's/^CHORUS_COORDINATOR_FLAGS=//p' "${UNITS}/coordinator.conf")
# shellcheck disable=SC2086
out=$("${PREFIX}/bin/chorus-coordinator" --state_dir /var/lib/chorus ${flags} --check_flags 2>&1) \
  && pass "coordinator.conf's flags are sound: ${out}" || fail "coordinator.conf's flags: ${out}"
out=$("${PREFIX}/bin/chorus-coordinator" --listen 0.0.0.0:29650 --checkpoint_data_port 29651 \
      --check_flags 2>&1) \
  && fail "a data port on the HTTP port passed --check_flags" \
  || { [[ ${out} == *"--checkpoint_data_port 29651 is also the HTTP port"* ]] \
       && pass "--check_flags names the collision: ${out}" || fail "collision message: ${out}"; }

# The service user, created by systemd-sysusers in a scratch root.
mkdir -p "${TMP}/root/etc"
if systemd-sysusers --root="${TMP}/root" "${UNITS}/chorus.sysusers.conf" >/dev/null 2>&1 \
   && grep -q '^chorus:x:[0-9]*:[0-9]*:.*:/var/lib/chorus:/usr/sbin/nologin$' "${TMP}/root/etc/passwd"; then
  pass "sysusers creates the chorus user: $(grep '^chorus:' "${TMP}/root/etc/passwd")"
else
  fail "sysusers: $(cat "${TMP}/root/etc/passwd" 2>&1)"
fi
finish
