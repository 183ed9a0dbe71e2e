#!/usr/bin/env bash
# Functions stay short: no function in the C++ sources (tests and examples
# aside) is longer than 80 lines, except those listed in
# tests/long_functions.txt, and those may not grow. A list entry that is now
# shorter is reported so the list can be tightened.
#
# Usage: function_length_test.sh [REPOSITORY_ROOT]
#   Without an argument (as under Bazel) the root is where README.md, as
#   found in the runfiles, really lives: the test reads every source file,
#   which no test can declare as inputs.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

root=${1:-$(dirname "$(realpath README.md)")}
[[ -x "${root}/tools/function_lengths.py" ]] || { fail "no tools/function_lengths.py under '${root}'"; finish; }

# The measuring tool itself: a method written in a class body of a header
# and a function of a .cc are both measured, tests are not.
fixture=$(mktemp -d)
on_exit "rm -rf '${fixture}'"
{
  echo 'namespace x {'
  echo 'class Widget {'
  echo ' public:'
  echo '  int Long(int a,'
  echo '           int b) {'
  for ((i = 0; i < 85; ++i)); do echo "    a += b;  // {"; done
  echo '    return a;'
  echo '  }'
  echo '  int Short() { return 1; }'
  echo '};'
  echo '}  // namespace x'
} > "${fixture}/widget.h"
{
  echo 'int Free() {'
  for ((i = 0; i < 90; ++i)); do echo '  call("}");'; done
  echo '}'
} > "${fixture}/free.cc"
cp "${fixture}/free.cc" "${fixture}/free_test.cc"
measured=$("${root}/tools/function_lengths.py" --over 80 "${fixture}" | awk '{print $1, $3}' | sort | tr '\n' ' ')
[[ "${measured}" == "89 Long 92 Free " ]] \
  && pass "the tool measures class-body methods in headers and .cc functions, not tests" \
  || fail "the tool measured '${measured}', expected '89 Long 92 Free '"

report=$(python3 - "${root}" <<'PY'
import subprocess, sys
root = sys.argv[1]
limit = 80
allowed = {}
for line in open(root + "/tests/long_functions.txt"):
    if line.strip() and not line.startswith("#"):
        n, path, name = line.split()
        allowed[(path, name)] = int(n)
rows = subprocess.run([root + "/tools/function_lengths.py", "--over", str(limit), root],
                      capture_output=True, text=True, check=True).stdout.split("\n")
seen = set()
for row in filter(None, rows):
    n, where, name = row.split()
    path = where.rsplit(":", 1)[0]
    key = (path, name)
    seen.add(key)
    if key not in allowed:
        print(f"BAD {where} {name} is {n} lines; split it (at most {limit})")
    elif int(n) > allowed[key]:
        print(f"BAD {where} {name} grew to {n} lines (listed at {allowed[key]}); split it")
    elif int(n) < allowed[key]:
        print(f"NOTE {path} {name} is {n} lines now: lower its entry in tests/long_functions.txt")
for key, n in sorted(allowed.items()):
    if key not in seen:
        print(f"NOTE {key[0]} {key[1]} is within {limit} lines now: delete its entry")
print(f"COUNT {len(seen)}")
PY
)
echo "${report}" | grep '^NOTE' | sed 's/^NOTE /note: /'
bad=$(echo "${report}" | grep '^BAD' | sed 's/^BAD //')
count=$(echo "${report}" | sed -n 's/^COUNT //p')
[[ -n "${count}" ]] && pass "read the sources (${count} function(s) over 80 lines, all listed)" \
  || fail "the function length report did not finish: ${report}"
[[ -z "${bad}" ]] && pass "no function is new over 80 lines or longer than listed" \
  || fail "functions too long:"$'\n'"${bad}"
finish
