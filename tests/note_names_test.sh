#!/usr/bin/env bash
# Every Note a file cites is defined exactly once (tools/note_names.py says
# what a definition is): first the tool on small trees made here, then on
# the repository.
#
# Usage: note_names_test.sh [REPOSITORY_ROOT]
#   Without an argument (as under Bazel) the root is where README.md, as
#   found in the runfiles, really lives: the test reads every source file,
#   which no test can declare as inputs.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

root=${1:-$(dirname "$(realpath README.md)")}
tool="${root}/tools/note_names.py"
[[ -x "${tool}" ]] || { fail "no tools/note_names.py under '${root}'"; finish; }

tree=$(mktemp -d)
on_exit "rm -rf '${tree}'"
mkdir -p "${tree}/good" "${tree}/bad"
# A definition (the name alone on a comment line, its explanation below),
# cited inline, across a wrapped comment, and at the start of a test's line.
cat >"${tree}/good/lease.cc" <<'CC'
// Note [Leader lease]
// The leader is whoever holds the key.
int Lead();  // Note [Leader lease]
// It waits (Note
// [Leader lease] above).
CC
cat >"${tree}/good/lease_test.cc" <<'CC'
// Note [Leader lease]
// A test's line that starts with the name cites it.
CC
printf '# Note [Leader lease] in lease.cc\n' >"${tree}/good/notes.md"
out=$(python3 "${tool}" "${tree}/good")
rc=$?
[[ ${rc} -eq 0 && ${out} == *"1 Notes defined, 4 citations, 0 problem(s)"* ]] \
  && pass "a Note defined once and cited four ways passes" \
  || fail "the good tree: exit ${rc}, output: ${out}"

# Defined twice, and cited but defined nowhere (a "Note [X]: text" line
# cites; it does not define).
cat >"${tree}/bad/a.cc" <<'CC'
// Note [One rank]
// Alone, the average is the tensor.
CC
cat >"${tree}/bad/b.cc" <<'CC'
// Note [One rank]
// A communicator of one rank has nothing to average.
// Note [Store quotas]: the job is the namespace.
CC
out=$(python3 "${tool}" "${tree}/bad")
rc=$?
[[ ${rc} -eq 1 ]] && pass "a tree with problems exits 1" || fail "the bad tree exited ${rc}"
[[ ${out} == *"Note [One rank] is defined 2 times: a.cc:1, b.cc:1"* ]] \
  && pass "a Note defined twice is named with both places" \
  || fail "no duplicate reported: ${out}"
[[ ${out} == *"Note [Store quotas] is cited but defined nowhere: b.cc:3"* ]] \
  && pass "a Note cited but never defined is named with its citation" \
  || fail "no missing Note reported: ${out}"

out=$(cd "${root}" && python3 "${tool}")
rc=$?
[[ ${rc} -eq 0 ]] && pass "the repository: $(echo "${out}" | tail -n 1)" \
  || fail "the repository's Notes:"$'\n'"${out}"
finish
