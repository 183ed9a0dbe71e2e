#!/usr/bin/env bash
# The CMake package, checked the way a project that does not use Bazel uses
# it (CI runs this after the Bazel tests; docs/building.md "The CMake package"):
#   1. cmake/sources.cmake lists exactly what Bazel's //sdk:chorus builds;
#   2. the SDK configures, builds and installs into a temporary prefix,
#      whose include tree holds the SDK's headers and the API's under
#      chorus/ and nothing else, and whose headers include no header of
#      Chorus that is not installed;
#   3. examples/programs builds against the installed package with
#      find_package(Chorus), from a copy of the sources outside the tree;
#   4. those CMake-built programs pass the SDK's end-to-end checks
#      (tests/sdk_e2e_test.sh: accuracy, identical replicas, the hang
#      diagnosis, checkpoint and resume), run with the Bazel-built chorus.
# Needs the Bazel build of //client:chorus and its companions (bazel test
# //... has built them). Prints 'N passed, M failed' last.
#
#   tests/cmake_package_check.sh [--jobs N] [--work DIR] [--build-only]
#   --jobs N      compile jobs (default 2)
#   --work DIR    keep the build trees and the install prefix in DIR (default:
#                 a temporary directory, removed at exit). CMake builds
#                 incrementally, so a second run on the same DIR only
#                 rebuilds what changed.
#   --build-only  configure, build and install the SDK and build the
#                 examples against it (steps 2 and 3), then stop. .ci/run
#                 does this in the background, at the lowest CPU priority,
#                 while the Bazel phases run, and the full check later finds
#                 the builds done.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=2
work=""
build_only=0
while (($# > 0)); do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "cmake_package_check: unknown argument '$1' (see --help)"; exit 2 ;;
  esac
done

if [[ -n ${work} ]]; then
  mkdir -p "${work}" && work=$(cd "${work}" && pwd -P)
else
  work=$(mktemp -d)
  trap 'rm -rf "${work}"' EXIT
fi
passed=0
failed=0
check() {  # $1 = what, rest = the command; its output goes to ${work}/<n>.log
  local what=$1
  shift
  local log="${work}/step$((passed + failed)).log"
  local t0=${SECONDS}
  if "$@" >"${log}" 2>&1; then
    echo "ok: ${what} ($((SECONDS - t0)) s)"
    passed=$((passed + 1))
    return 0
  fi
  echo "FAIL: ${what} ($((SECONDS - t0)) s); the last lines of its output:"
  tail -n 30 "${log}" | sed 's/^/    /'
  failed=$((failed + 1))
  return 1
}
finish() {
  echo "${passed} passed, ${failed} failed"
  exit $((failed > 0))
}

# The list check asks Bazel; a build-only run stays off Bazel's server, which
# the phases it runs beside hold.
((build_only)) ||
  check "cmake/sources.cmake matches Bazel's //sdk:chorus" cmake/update_sources.sh --check
check "the SDK configures" cmake -S . -B "${work}/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="${work}/prefix" || finish
check "the SDK builds (libchorus)" cmake --build "${work}/build" -j "${jobs}" || finish
check "the SDK installs" cmake --install "${work}/build" || finish
installed_ok() {
  [[ -f "${work}/prefix/lib/cmake/Chorus/ChorusConfig.cmake" ]] &&
    [[ -f "${work}/prefix/include/chorus-sdk/chorus/chorus.h" ]] &&
    [[ -f "${work}/prefix/include/chorus-sdk/chorus/v1/coordinator.pb.h" ]] &&
    ls "${work}/prefix/lib/"libchorus.so* >/dev/null
}
check "the installed tree has the library, chorus/chorus.h, the API headers and the package file" \
  installed_ok
# The package ships the SDK's interface, not Chorus's internals: the
# installed include tree holds the SDK's headers (chorus/*.h) and the API's
# generated ones (chorus/v1/*.pb.h), and nothing outside chorus/. The SDK's
# headers only declare the internal types they mention (sdk/session.h's
# Store, sdk/progress.h's Clock), so none of them is installed.
only_chorus_headers() {
  local include="${work}/prefix/include/chorus-sdk" file header others=0 count=0
  while IFS= read -r file; do
    header=${file#"${include}/"}
    count=$((count + 1))
    [[ ${header} =~ ^chorus/[^/]+\.h$ || ${header} =~ ^chorus/v1/[^/]+\.pb\.h$ ]] && continue
    echo "installed but not the SDK's (outside chorus/ or not a header): ${header}"
    others=$((others + 1))
  done < <(find "${include}" -mindepth 1 ! -type d)
  echo "${count} files installed under include/chorus-sdk"
  ((count > 0 && others == 0))
}
check "the installed include tree holds only chorus/*.h and chorus/v1/*.pb.h" only_chorus_headers
# A quoted include in an installed SDK header names a dependency's header
# (absl/, grpcpp/) or one of the package's own, which must then be installed:
# "common/clock.h", say, would compile in the source tree and fail in a
# user's project.
includes_installed() {
  local include="${work}/prefix/include/chorus-sdk" file line path missing=0
  for file in "${include}"/chorus/*.h; do
    while IFS= read -r line; do
      [[ ${line} =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
      path=${BASH_REMATCH[1]}
      [[ ${path} == absl/* || ${path} == grpcpp/* ]] && continue
      [[ ${path} == chorus/* && -f "${include}/${path}" ]] && continue
      echo "${file#"${include}/"} includes \"${path}\", which the package does not install"
      missing=$((missing + 1))
    done <"${file}"
  done
  ((missing == 0))
}
check "the installed SDK headers include only installed headers (or Abseil's and gRPC's)" \
  includes_installed
# The examples from a copy elsewhere, so nothing of the source tree is on
# their include path but what the package provides and what they share
# (examples/common, beside examples/programs as in the tree).
# Copied with their times (-p), so that a second run on the same --work does
# not rebuild them.
mkdir -p "${work}/src/examples/programs" "${work}/src/examples/common"
cp -p examples/programs/CMakeLists.txt examples/programs/*.cc "${work}/src/examples/programs/"
find examples/common \( -name '*.h' -o -name '*.cc' \) ! -name '*_test.cc' \
  -exec cp -p {} "${work}/src/examples/common/" \;
check "examples/programs builds with find_package(Chorus)" \
  cmake -S "${work}/src/examples/programs" -B "${work}/examples-build" \
  -DCMAKE_PREFIX_PATH="${work}/prefix" || finish
check "the example programs link against the installed libchorus" \
  cmake --build "${work}/examples-build" -j "${jobs}" || finish
linked_ok() {
  # Not `ldd | grep -q`: grep exits at the first match, and under pipefail
  # the SIGPIPE that ldd may then get fails the check.
  local libs
  libs=$(ldd "${work}/examples-build/fashion_mnist_loop") || return 1
  [[ ${libs} == *"${work}/prefix/lib/libchorus.so"* ]]
}
check "fashion_mnist_loop loads libchorus from the install prefix" linked_ok
((build_only)) && finish

bazel build //client:chorus //coordinator:chorus-coordinator //worker:chorus-worker \
  //worker:chorus-rank >"${work}/bazel.log" 2>&1 || {
  echo "FAIL: the Bazel build of chorus"
  tail -n 20 "${work}/bazel.log"
  failed=$((failed + 1))
  finish
}
echo "=== tests/sdk_e2e_test.sh with the CMake-built programs"
bash tests/sdk_e2e_test.sh "$(bazel info bazel-bin 2>/dev/null)/client/chorus" \
  "${work}/examples-build/fashion_mnist_loop" "${work}/examples-build/actor_critic" \
  2>&1 | tee "${work}/e2e.log"
e2e=$(tail -n 1 "${work}/e2e.log")
if [[ ${e2e} =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failure ]]; then
  passed=$((passed + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
else
  echo "FAIL: sdk_e2e_test.sh printed no counts"
  failed=$((failed + 1))
fi
finish
