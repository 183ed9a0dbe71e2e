#!/usr/bin/env bash
# Builds a Chorus image: coordinator or worker (README.md).
#
# Usage: deploy/container/build.sh coordinator|worker [options]
#   --tree DIR       an installed tree staged with
#                    `bazel run //deploy:install -- --prefix /opt/chorus --destdir DIR`
#                    (default: run that now, from this checkout)
#   --context DIR    assemble the build context here (default: a new temporary
#                    directory); it must not exist or be empty
#   --context-only   assemble the context, print its path and stop
#   --tag NAME       image name (default chorus-ROLE:VERSION)
#   --base IMAGE     base image for the Containerfile (default Debian bookworm-slim;
#                    the CUDA variant: README.md)
#   --rootfs OUT.tar no image registry needed: make the root file system with
#                    mmdebstrap from the Debian mirror apt uses, write it to
#                    OUT.tar and, when podman is installed, import it as --tag
# Without --rootfs it runs `podman build` (or `buildah bud`) on Containerfile.ROLE.
set -euo pipefail

die() { echo "build.sh: error: $*" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)

role=${1:-}
case "${role}" in
  coordinator) programs=(chorus-coordinator chorus); examples=0 ;;
  worker) programs=(chorus-worker chorus-rank chorus-trainer chorus-script-export chorus); examples=1 ;;
  *) die "usage: build.sh coordinator|worker [--tree DIR] [--context DIR] [--context-only] [--tag NAME] [--base IMAGE] [--rootfs OUT.tar]" ;;
esac
shift
tree="" context="" context_only=0 tag="" base="" rootfs=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tree) tree=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --context-only) context_only=1; shift ;;
    --tag) tag=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --rootfs) rootfs=$2; shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done

if [[ -z "${tree}" ]]; then
  command -v bazel >/dev/null || die "no --tree given and no bazel to build one"
  tree=$(mktemp -d)
  (cd "${here}/../.." && bazel run //deploy:install -- --prefix /opt/chorus --destdir "${tree}") \
    || die "bazel run //deploy:install failed"
fi
[[ -x "${tree}/opt/chorus/bin/chorus" ]] || die "${tree}/opt/chorus/bin has no Chorus programs"
version=$("${tree}/opt/chorus/bin/chorus" version 2>/dev/null | awk '{print $2}')
tag=${tag:-chorus-${role}:${version:-latest}}

if [[ -z "${context}" ]]; then
  context=$(mktemp -d)
elif [[ -e "${context}" && -n "$(ls -A "${context}")" ]]; then
  die "--context ${context} is not empty"
fi
mkdir -p "${context}/opt/chorus/bin" "${context}/chorus-image"
for program in "${programs[@]}"; do
  cp "${tree}/opt/chorus/bin/${program}" "${context}/opt/chorus/bin/" \
    || die "${program} is missing from ${tree}/opt/chorus/bin"
done
if ((examples)); then
  mkdir -p "${context}/opt/chorus/share/chorus"
  cp -r "${tree}/opt/chorus/share/chorus/examples" "${context}/opt/chorus/share/chorus/"
fi
cp "${here}/image-setup.sh" "${here}/${role}.packages" "${context}/chorus-image/"
cp "${here}/Containerfile.${role}" "${context}/Containerfile"
if ((context_only)); then
  echo "${context}"
  exit 0
fi

if [[ -n "${rootfs}" ]]; then
  command -v mmdebstrap >/dev/null || die "--rootfs needs mmdebstrap (apt-get install mmdebstrap)"
  packages=$(grep -v '^#' "${here}/${role}.packages" | paste -sd, -)
  # passwd: image-setup.sh creates the service user (bookworm-slim has it).
  mmdebstrap --variant=essential --include="passwd,${packages}" \
    --customize-hook="copy-in ${context}/chorus-image /tmp" \
    --customize-hook="chroot \"\$1\" sh /tmp/chorus-image/image-setup.sh ${role} --packages-installed" \
    --customize-hook='rm -rf "$1/tmp/chorus-image"' \
    --customize-hook="copy-in ${context}/opt /" \
    bookworm "${rootfs}" || die "mmdebstrap failed"
  if command -v podman >/dev/null; then
    # What the Containerfile says after FROM/RUN/COPY, as image config.
    changes=()
    while IFS= read -r line; do changes+=(--change "${line}"); done \
      < <(grep -E '^(USER|WORKDIR|VOLUME|EXPOSE|ENV|ENTRYPOINT|CMD) ' "${here}/Containerfile.${role}")
    podman import "${changes[@]}" "${rootfs}" "${tag}" || die "podman import failed"
    echo "build.sh: imported ${rootfs} as ${tag}"
  else
    echo "build.sh: wrote ${rootfs}; import it with podman import (README.md)"
  fi
  exit 0
fi

build_args=()
[[ -n "${base}" ]] && build_args=(--build-arg "BASE=${base}")
if command -v podman >/dev/null; then
  podman build "${build_args[@]}" -t "${tag}" "${context}"
elif command -v buildah >/dev/null; then
  buildah bud "${build_args[@]}" -t "${tag}" "${context}"
else
  die "neither podman nor buildah is installed (apt-get install podman); the context is ${context}"
fi
