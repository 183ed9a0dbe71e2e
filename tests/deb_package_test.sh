#!/usr/bin/env bash
# //deploy:deb builds a Debian package with dpkg-deb: its control fields,
# conffiles and maintainer script are right, it holds the programs, units,
# sysusers/tmpfiles files and /etc/chorus files where Debian puts them, and
# the programs unpacked from it run (--help, and chorus up from the unpacked
# /usr/bin trains a job). The package is not installed on this machine.
#
# Usage (from Bazel): deb_package_test.sh DEB_BUILDER
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUILDER=$1
out=$("${BUILDER}" --output "${TMP}/out" 2>&1); rc=$?
deb=$(ls "${TMP}"/out/chorus_*.deb 2>/dev/null | head -n 1)
[[ ${rc} -eq 0 && -s "${deb}" ]] && pass "built $(basename "${deb}") ($(du -k "${deb}" | cut -f1) KiB)" \
  || { fail "build-deb rc=${rc}: ${out}"; finish; }

info=$(dpkg-deb --info "${deb}")
field() { dpkg-deb --field "${deb}" "$1"; }
[[ "$(field Package)" == chorus && "$(field Version)" =~ ^[0-9]+\.[0-9]+ \
   && "$(field Architecture)" == "$(dpkg --print-architecture)" ]] \
  && pass "control: chorus $(field Version) $(field Architecture)" || fail "control: ${info}"
depends=$(field Depends)
for p in libtorch1.13 libgloo0 libgrpc++1.51 libsqlite3-0 libopenblas0-openmp systemd; do
  [[ ", ${depends}," == *", ${p},"* ]] || fail "Depends lacks ${p}: ${depends}"
done
[[ "${depends}" != *dataset-* && "$(field Recommends)" == dataset-fashion-mnist ]] \
  && pass "Depends has the run-time libraries; the data set is only recommended" \
  || fail "Depends '${depends}' / Recommends '$(field Recommends)'"

contents=$(dpkg-deb --contents "${deb}" | awk '{print $1, $2, $NF}')
for f in ./usr/bin/chorus ./usr/bin/chorus-coordinator ./usr/bin/chorus-worker ./usr/bin/chorus-rank ./usr/bin/chorus-trainer \
         ./lib/systemd/system/chorus-coordinator.service ./lib/systemd/system/chorus-worker.service \
         ./usr/lib/sysusers.d/chorus.conf ./usr/lib/tmpfiles.d/chorus.conf ./etc/chorus/worker.conf \
         ./usr/share/chorus/slurm/chorus.sbatch ./usr/share/chorus/kubernetes/kustomization.yaml; do
  grep -q " ${f}\$" <<<"${contents}" || fail "the package lacks ${f}"
done
grep -q '^-rwxr-xr-x root/root .*/usr/bin/chorus-worker$' <<<"${contents}" \
  && pass "programs owned by root, mode 0755" || fail "$(grep chorus-worker <<<"${contents}")"
grep -q '^-rw-r----- root/root .*/etc/chorus/worker.conf$' <<<"${contents}" \
  && pass "/etc/chorus files 0640" || fail "$(grep worker.conf <<<"${contents}")"

dpkg-deb --control "${deb}" "${TMP}/control"
[[ "$(cat "${TMP}/control/conffiles")" == $'/etc/chorus/coordinator.conf\n/etc/chorus/worker.conf' ]] \
  && pass "conffiles" || fail "conffiles: $(cat "${TMP}/control/conffiles")"
sh -n "${TMP}/control/postinst" && grep -q 'systemd-sysusers chorus.conf' "${TMP}/control/postinst" \
  && ! grep -q 'systemctl enable' "${TMP}/control/postinst" \
  && pass "postinst creates the user and enables nothing" || fail "postinst: $(cat "${TMP}/control/postinst")"

dpkg-deb --extract "${deb}" "${TMP}/root"
grep -q '^ExecStart=/usr/bin/chorus-worker ' "${TMP}/root/lib/systemd/system/chorus-worker.service" \
  && pass "the unit starts /usr/bin/chorus-worker" \
  || fail "$(grep ExecStart "${TMP}/root/lib/systemd/system/chorus-worker.service")"
help=$("${TMP}/root/usr/bin/chorus-worker" --help 2>&1) && [[ "${help}" == *"--slots"* ]] \
  && pass "unpacked chorus-worker --help" || fail "chorus-worker --help: ${help}"
up_small_job "${TMP}/root/usr/bin/chorus" deb
[[ ${UP_RC} -eq 0 && "$(json_get - state <<<"${UP_LAST}")" == SUCCEEDED ]] \
  && pass "chorus up --local 2 from the unpacked package" \
  || fail "chorus up rc=${UP_RC}: ${UP_OUT} $(tail -3 "${TMP}/up.err")"
assert_no_leftovers "a job from the unpacked package"
finish
