#!/usr/bin/env bash
# The chorus package's Python half under pytest (python/chorus_test.py):
# state flattening and checkpoint structures, typed errors. The package is
# laid out as python/install.sh installs it, and the tests run from a copy so
# that `import chorus` finds the installed package (with its native module),
# not the source tree's.
#
# Usage (from Bazel): python_package_test.sh INSTALL_SH NATIVE_SO TESTS_PY
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

INSTALL=$(realpath "$1")
NATIVE=$(realpath "$2")
TESTS=$(realpath "$3")
PYTHON=/usr/bin/python3

if ! "${PYTHON}" -m pytest --version >/dev/null 2>&1; then
  fail "pytest is missing for ${PYTHON}: deploy/setup.sh installs it (python3-pytest)"; finish
fi
if ! out=$(install_python_package "${INSTALL}" "${NATIVE}" "${TMP}/site"); then
  fail "install.sh: ${out}"; finish
fi
mkdir -p "${TMP}/run"
cp "${TESTS}" "${TMP}/run/"
if out=$(cd "${TMP}/run" && PYTHONPATH="${TMP}/site" timeout "$(slack_seconds 120)" \
           "${PYTHON}" -m pytest -q -p no:cacheprovider "$(basename "${TESTS}")" 2>&1); then
  pass "pytest: $(tail -n 1 <<<"${out}")"
else
  fail "pytest: ${out}"
fi
finish
