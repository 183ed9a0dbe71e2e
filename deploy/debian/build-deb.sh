#!/usr/bin/env bash
# Builds chorus_VERSION_ARCH.deb with dpkg-deb from the installed tree.
#
# Usage: bazel run //deploy:deb -- --output DIR
#
# The package installs the programs in /usr/bin, the examples and deploy
# files in /usr/share/chorus, the systemd units in /lib/systemd/system, the
# service user (sysusers.d) and /etc/chorus (tmpfiles.d), and
# /etc/chorus/coordinator.conf and worker.conf as conffiles. Its postinst
# creates the user and /etc/chorus; it enables no service. Depends: the
# run-time libraries (deploy/container/*.packages).
set -euo pipefail

die() { echo "build-deb: error: $*" >&2; exit 2; }

output=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --output) [[ $# -ge 2 ]] || die "--output needs a directory"; output=$2; shift 2 ;;
    --output=*) output=${1#--output=}; shift ;;
    *) die "unknown argument '$1' (usage: --output DIR)" ;;
  esac
done
[[ -n "${output}" ]] || die "--output DIR is required"
if [[ -n "${BUILD_WORKING_DIRECTORY:-}" && "${output}" != /* ]]; then
  output="${BUILD_WORKING_DIRECTORY}/${output}"
fi
command -v dpkg-deb >/dev/null || die "dpkg-deb is not installed"

runfiles=${RUNFILES_DIR:-}
[[ -n "${runfiles}" || ! -d "$0.runfiles" ]] || runfiles="$0.runfiles"
[[ -n "${runfiles}" ]] || runfiles=${TEST_SRCDIR:-}
src="${runfiles}/chorus"
[[ -x "${src}/deploy/install" ]] || die "cannot find //deploy:install; run this as \`bazel run //deploy:deb\`"

stage=$(mktemp -d)
trap 'rm -rf "${stage}"' EXIT
root="${stage}/root"
RUNFILES_DIR="${runfiles}" "${src}/deploy/install" --prefix /usr --destdir "${root}" >/dev/null \
  || die "installing into the package tree failed"

share="${root}/usr/share/chorus"
install -d "${root}/lib/systemd/system" "${root}/usr/lib/sysusers.d" "${root}/usr/lib/tmpfiles.d" \
  "${root}/etc/chorus" "${root}/DEBIAN"
mv "${share}"/systemd/*.service "${root}/lib/systemd/system/"
mv "${share}/systemd/chorus.sysusers.conf" "${root}/usr/lib/sysusers.d/chorus.conf"
mv "${share}/systemd/chorus.tmpfiles.conf" "${root}/usr/lib/tmpfiles.d/chorus.conf"
mv "${share}/systemd/coordinator.conf" "${share}/systemd/worker.conf" "${root}/etc/chorus/"
chmod 0640 "${root}"/etc/chorus/*.conf

version=$("${root}/usr/bin/chorus" version | awk '{print $2}')
[[ "${version}" =~ ^[0-9] ]] || die "cannot read the version from chorus version"
arch=$(dpkg --print-architecture)
depends=$(cat "${src}/deploy/container/coordinator.packages" "${src}/deploy/container/worker.packages" \
  | grep -v '^#' | grep -v '^dataset-' | sort -u | paste -sd, - | sed 's/,/, /g')
size=$(du -sk --exclude=DEBIAN "${root}" | cut -f1)

cat > "${root}/DEBIAN/control" <<CONTROL
Package: chorus
Version: ${version}
Architecture: ${arch}
Section: science
Priority: optional
Maintainer: Chorus maintainers <chorus@localhost>
Installed-Size: ${size}
Depends: ${depends}, systemd
Recommends: dataset-fashion-mnist
Description: distributed data-parallel training service
 Chorus trains LibTorch models across machines: a coordinator (rendezvous,
 job queue, checkpoints, hang detection), a node agent per machine that runs
 the rank processes, and the chorus command line. This package holds the
 programs, systemd units, a Slurm script and Kubernetes manifests.
CONTROL
printf '/etc/chorus/coordinator.conf\n/etc/chorus/worker.conf\n' > "${root}/DEBIAN/conffiles"
cat > "${root}/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  systemd-sysusers chorus.conf
  systemd-tmpfiles --create chorus.conf
  chgrp chorus /etc/chorus/coordinator.conf /etc/chorus/worker.conf
  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
fi
POSTINST
chmod 0755 "${root}/DEBIAN/postinst"

mkdir -p "${output}"
deb="${output}/chorus_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "${root}" "${deb}" >/dev/null || die "dpkg-deb failed"
echo "build-deb: wrote ${deb}"
