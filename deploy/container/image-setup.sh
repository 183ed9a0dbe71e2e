#!/bin/sh
# Prepares a Debian bookworm root file system for a Chorus image; runs inside
# it as root (a Containerfile RUN, or chroot from build.sh --rootfs).
# Usage: image-setup.sh coordinator|worker [--packages-installed]
#   Installs the role's packages (DIR/ROLE.packages, DIR being this script's
#   directory) unless --packages-installed, selects OpenBLAS for LibTorch
#   (worker), and creates the service user chorus (uid/gid 999) with its
#   state directory.
set -eu
role=${1:-}
dir=$(dirname "$0")
case "${role}" in
  coordinator) home=/var/lib/chorus ;;
  worker) home=/var/lib/chorus-worker ;;
  *) echo "image-setup.sh: usage: image-setup.sh coordinator|worker [--packages-installed]" >&2; exit 2 ;;
esac
if [ "${2:-}" != --packages-installed ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  grep -v '^#' "${dir}/${role}.packages" | xargs apt-get install -y --no-install-recommends
  rm -rf /var/lib/apt/lists/*
fi
if [ "${role}" = worker ]; then
  # LibTorch on the reference BLAS is ~17x slower than on OpenBLAS.
  arch=$(dpkg --print-architecture | sed 's/^amd64$/x86_64/; s/^arm64$/aarch64/')-linux-gnu
  for lib in libblas.so.3 liblapack.so.3; do
    update-alternatives --set "${lib}-${arch}" "/usr/lib/${arch}/openblas-openmp/${lib}"
  done
fi
getent group chorus >/dev/null || groupadd --system --gid 999 chorus
getent passwd chorus >/dev/null \
  || useradd --system --uid 999 --gid chorus --home-dir "${home}" --shell /usr/sbin/nologin chorus
install -d -o chorus -g chorus -m 0750 "${home}"
