#!/usr/bin/env bash
# The Scheduler keeps a small public surface (issue 39): at most 12 method
# declarations in the public part of `class Scheduler` (constructors and the
# view accessors agents(), ranks(), jobs() count; type aliases do not).
# Entry points belong in its views (SchedulerAgents, SchedulerRanks,
# SchedulerJobs), each holding all of its concept's.
#
# Usage: scheduler_surface_test.sh [REPOSITORY_ROOT]
#   Without an argument (as under Bazel) the root is where README.md, as
#   found in the runfiles, really lives.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

root=${1:-$(dirname "$(realpath README.md)")}
header="${root}/coordinator/scheduling/scheduler.h"
readonly kMaxPublicMethods=12

# Prints the public method declarations of `class Scheduler` in header $1,
# one per line.
public_methods() {
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
start = re.search(r"^class Scheduler \{\n public:\n", text, re.M)
if not start:
    sys.exit("no 'class Scheduler {' with a public part in " + sys.argv[1])
body = text[start.end():]
end = re.search(r"^ (private|protected):", body, re.M)
body = body[: end.start()] if end else body[: body.index("\n};")]
body = re.sub(r"//[^\n]*", "", body)
# Inline bodies count as one declaration.
while True:
    flat = re.sub(r"\{[^{}]*\}", ";", body)
    if flat == body:
        break
    body = flat
for decl in body.split(";"):
    decl = " ".join(decl.split())
    if "(" in decl and not decl.startswith(("using ", "static constexpr", "friend ")):
        print(decl)
PY
}

# The counter itself: a fixture with one method too many is caught, and
# aliases, comments and inline bodies are read right.
fixture=$(mktemp -d)
on_exit "rm -rf '${fixture}'"
{
  echo 'class Scheduler {'
  echo ' public:'
  echo '  using Done = std::function<void(int)>;  // not a method'
  echo '  Scheduler(int a,'
  echo '            int b);'
  echo '  Views& views() { return views_; }'
  for ((i = 0; i < 11; ++i)); do echo "  void M${i}();  // m(${i});"; done
  echo ' private:'
  echo '  void Hidden();'
  echo '};'
} >"${fixture}/scheduler.h"
n=$(public_methods "${fixture}/scheduler.h" | wc -l)
[[ "${n}" -eq 13 ]] && pass "the counter counts 13 public methods in the fixture" \
  || fail "the counter counts ${n} public methods in the fixture, not 13"

if [[ -f "${header}" ]]; then
  methods=$(public_methods "${header}")
  n=$(grep -c . <<<"${methods}")
  if [[ "${n}" -le "${kMaxPublicMethods}" ]]; then
    pass "class Scheduler has ${n} public methods (at most ${kMaxPublicMethods})"
  else
    fail "class Scheduler has ${n} public methods, more than ${kMaxPublicMethods}: put new entry points in its views (agents(), ranks(), jobs()) in coordinator/scheduling/scheduler.h:"$'\n'"${methods}"
  fi
else
  fail "no coordinator/scheduling/scheduler.h under '${root}'"
fi
finish
