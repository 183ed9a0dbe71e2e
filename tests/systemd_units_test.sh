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

# Environment files: comments, blank lines and NAME=VALUE only.
for conf in coordinator.conf worker.conf; do
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
