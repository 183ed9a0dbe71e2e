#!/usr/bin/env bash
# Installs the Chorus programs and the files an operator starts them with.
#
# Usage: bazel run //deploy:install -- --prefix /opt/chorus [--destdir ROOT]
#
#   PREFIX/bin/                 chorus, chorus-coordinator, chorus-worker, chorus-rank,
#                               chorus-trainer, chorus-script-export (each finds the
#                               others beside it)
#   PREFIX/share/chorus/        examples/ (job specs), systemd/ (units and /etc/chorus
#                               environment files), slurm/chorus.sbatch, kubernetes/, kubernetes-ha/,
#                               container/
#
# --destdir ROOT writes everything under ROOT/PREFIX (a staging tree for a
# package or an image) while the paths written into the files stay PREFIX.
# What the programs need from Debian at run time is listed in
# docs/operating.md; this installs nothing from Debian.
set -euo pipefail

die() { echo "install: error: $*" >&2; exit 2; }

prefix=""
destdir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) [[ $# -ge 2 ]] || die "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --destdir) [[ $# -ge 2 ]] || die "--destdir needs a directory"; destdir=$2; shift 2 ;;
    --destdir=*) destdir=${1#--destdir=}; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (usage: --prefix DIR [--destdir ROOT])" ;;
  esac
done
[[ -n "${prefix}" ]] || die "--prefix DIR is required, e.g. --prefix /opt/chorus"

# `bazel run` starts us inside the runfiles tree; relative paths the user
# typed are relative to where they typed them.
if [[ -n "${BUILD_WORKING_DIRECTORY:-}" ]]; then
  [[ "${prefix}" == /* ]] || prefix="${BUILD_WORKING_DIRECTORY}/${prefix}"
  [[ -z "${destdir}" || "${destdir}" == /* ]] || destdir="${BUILD_WORKING_DIRECTORY}/${destdir}"
fi
[[ "${prefix}" == /* ]] || prefix="$(pwd)/${prefix}"
[[ -z "${destdir}" || "${destdir}" == /* ]] || destdir="$(pwd)/${destdir}"

# The built programs and files: in this script's runfiles (bazel run) or the
# runfiles of a test that has //deploy:install as data.
runfiles=${RUNFILES_DIR:-}
[[ -n "${runfiles}" || ! -d "$0.runfiles" ]] || runfiles="$0.runfiles"
[[ -n "${runfiles}" ]] || runfiles=${TEST_SRCDIR:-}
[[ -n "${runfiles}" && -d "${runfiles}/chorus" ]] \
  || die "cannot find the built files; run this as \`bazel run //deploy:install -- --prefix DIR\`"
src="${runfiles}/chorus"

readonly PROGRAMS=(
  client/chorus
  coordinator/chorus-coordinator
  worker/chorus-worker
  worker/chorus-rank
  worker/chorus-trainer
  worker/chorus-script-export
)

root="${destdir}${prefix}"
mkdir -p "${root}/bin" "${root}/share/chorus" || die "cannot create ${root}"
for program in "${PROGRAMS[@]}"; do
  [[ -x "${src}/${program}" ]] || die "${src}/${program} is missing from the build"
  # Copies, not links into Bazel's output tree: the installed tree must
  # outlive `bazel clean`.
  install -m 0755 "${src}/${program}" "${root}/bin/" || die "cannot write ${root}/bin"
done

# Data files: their path below the repository is kept below share/chorus,
# except examples/, systemd and slurm files, which go where an operator looks.
shopt -s nullglob
for file in "${src}"/examples/*.textproto "${src}"/examples/*.json "${src}"/examples/*.yaml; do
  install -D -m 0644 "${file}" "${root}/share/chorus/examples/$(basename "${file}")"
done
for dir in systemd slurm kubernetes kubernetes-ha container; do
  [[ -d "${src}/deploy/${dir}" ]] || continue
  while IFS= read -r -d '' file; do
    rel=${file#"${src}/deploy/"}
    mode=0644
    [[ -x "${file}" ]] && mode=0755
    install -D -m "${mode}" "${file}" "${root}/share/chorus/${rel}"
  done < <(find -L "${src}/deploy/${dir}" -type f -print0)
done
# Units and scripts name the programs by their installed path.
while IFS= read -r -d '' file; do
  sed -i "s|@PREFIX@|${prefix}|g" "${file}"
done < <(find "${root}/share/chorus" -type f \( -name '*.service' -o -name '*.sbatch' \
  -o -name '*.conf' -o -name 'Containerfile*' \) -print0)

echo "install: installed Chorus into ${root} (bin/: ${PROGRAMS[*]##*/})"
