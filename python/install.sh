#!/usr/bin/env bash
# Builds the chorus Python package (docs/python.md) and installs it where
# Debian's python3 finds it. Offline: it needs only what deploy/setup.sh
# installed (python3-torch, pybind11-dev) and this repository's Bazel build.
#
#   python/install.sh                 # into /usr/local/lib/python3.X/dist-packages
#   python/install.sh --prefix DIR    # into DIR/chorus (then PYTHONPATH=DIR)
#   python/install.sh --no-build --prefix DIR   # bazel-bin's build as it is
set -euo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "python/install.sh: $*" >&2; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=/usr/bin/python3
prefix=""
build=1
while (( $# > 0 )); do
  case "$1" in
    --prefix) [[ $# -ge 2 ]] || die "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

"${python}" -c "import torch" 2>/dev/null \
  || die "${python} cannot import torch: install python3-torch (deploy/setup.sh)"
if [[ -z "${prefix}" ]]; then
  prefix=$("${python}" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
fi
if (( build )); then
  (cd "${root}" && bazel build -c opt //python:_C.so) || die "bazel build //python:_C.so failed"
fi
native="${root}/bazel-bin/python/_C.so"
[[ -f "${native}" ]] || die "${native} is missing: run without --no-build"

mkdir -p "${prefix}/chorus"
install -m 0644 "${root}/python/chorus/__init__.py" "${prefix}/chorus/__init__.py"
install -m 0755 "${native}" "${prefix}/chorus/_C.so"
(cd / && PYTHONPATH="${prefix}" "${python}" -c "import chorus") \
  || die "installed into ${prefix}/chorus, but '${python} -c \"import chorus\"' fails there"
echo "installed the chorus package into ${prefix}/chorus"
