#!/usr/bin/env bash
# The Scheduler keeps a small public surface: at most 16 method declarations
# in the public part of `class Scheduler` (constructors and accessors count;
# type aliases do not), and no class beside it that only forwards to it
# (one that holds a `Scheduler&`). Its entry points are grouped by caller:
# an agent's stream is one entry point per event (hello, message, end), not
# one per message kind; reads belong in ClusterReads (cluster_reads.h).
# RunningJob, the state of one job the Scheduler keeps, has no public field
# that can be written: its state changes through its transitions
# (running_job.h).
#
# Usage: scheduler_surface_test.sh [REPOSITORY_ROOT]
#   Without an argument (as under Bazel) the root is where README.md, as
#   found in the runfiles, really lives.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

root=${1:-$(dirname "$(realpath README.md)")}
header="${root}/coordinator/scheduling/scheduler.h"
readonly kMaxPublicMethods=16

# Prints the public declarations of class or struct $3 in header $2, one
# per line, flattened (comments dropped, an inline body counting as one
# declaration), that are $1: "methods" (constructors and accessors
# included; type aliases not) or "fields" (data members that are not const
# or static).
public_declarations() {
  python3 - "$@" <<'PY'
import re, sys
kind, path, name = sys.argv[1:4]
text = open(path).read()
start = re.search(r"^(class|struct) " + name + r" \{\n", text, re.M)
if not start:
    sys.exit("no 'class/struct " + name + " {' in " + path)
body = text[start.end():]
body = body[: body.index("\n};")]
public = start.group(1) == "struct"  # until it says otherwise
body = re.sub(r"//[^\n]*", "", body)
while True:
    flat = re.sub(r"\{[^{}]*\}", ";", body)
    if flat == body:
        break
    body = flat
for part in re.split(r"^ (public|private|protected):", body, flags=re.M):
    if part in ("public", "private", "protected"):
        public = part == "public"
        continue
    for decl in part.split(";") if public else []:
        decl = " ".join(decl.split())
        left = decl.split("=", 1)[0]
        if kind == "methods":
            keep = "(" in decl and not decl.startswith(("using ", "static constexpr", "friend "))
        else:
            keep = decl and "(" not in left and "operator" not in left and not decl.startswith(
                ("const ", "static ", "using ", "enum ", "struct ", "class ", "friend ",
                 "inline ", "constexpr "))
        if keep:
            print(decl)
PY
}
public_methods() { public_declarations methods "$1" Scheduler; }

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
    fail "class Scheduler has ${n} public methods, more than ${kMaxPublicMethods}: route a new kind of message through an existing entry point (as OnAgentMessage does), or put reads in ClusterReads (coordinator/scheduling/cluster_reads.h):"$'\n'"${methods}"
  fi
else
  fail "no coordinator/scheduling/scheduler.h under '${root}'"
fi

# Classes in header $1 other than Scheduler that hold a Scheduler& (views
# that forward to it), one per line.
forwarding_views() {
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for m in re.finditer(r"^(?:class|struct) (\w+)[^;{]*\{(.*?)^\};", text, re.M | re.S):
    if m.group(1) != "Scheduler" and re.search(r"\bScheduler&\s*\w+_?;", m.group(2)):
        print(m.group(1))
PY
}
{
  echo 'class SchedulerJobs {'
  echo ' public:'
  echo '  void Cancel();'
  echo ' private:'
  echo '  Scheduler& scheduler_;'
  echo '};'
  echo 'struct Options {'
  echo '  int n = 0;'
  echo '};'
} >"${fixture}/views.h"
[[ "$(forwarding_views "${fixture}/views.h")" == "SchedulerJobs" ]] &&
  pass "the view finder finds the fixture's forwarding class and only it" ||
  fail "the view finder found '$(forwarding_views "${fixture}/views.h")' in the fixture, not SchedulerJobs"
if [[ -f "${header}" ]]; then
  views=$(forwarding_views "${header}")
  [[ -z "${views}" ]] && pass "no class in scheduler.h forwards to the Scheduler" ||
    fail "classes in scheduler.h that forward to the Scheduler: $(echo ${views}); give their entry points to the Scheduler or to a unit that does the work"
fi

{
  echo 'struct Job {'
  echo '  explicit Job(int n) : n_(n) {}'
  echo '  int n() const { return n_; }'
  echo '  const int limit = 3;'
  echo '  absl::Time until = absl::InfinitePast();  // a field'
  echo '  enum class Fate { kStays, kGone };'
  echo '  struct Groups {'
  echo '    int count = 0;'
  echo '  };'
  echo '  std::vector<int> ranks;'
  echo '  void Set(int n) { n_ = n; }'
  echo ' private:'
  echo '  int n_ = 0;'
  echo '};'
} >"${fixture}/job.h"
fields=$(public_declarations fields "${fixture}/job.h" Job | sed 's/ =.*//' | tr '\n' ',')
[[ "${fields}" == "absl::Time until,std::vector<int> ranks," ]] &&
  pass "the field finder finds the fixture's two public mutable fields and only them" ||
  fail "the field finder found '${fields}' in the fixture, not 'absl::Time until,std::vector<int> ranks,'"
job_header="${root}/coordinator/scheduling/running_job.h"
if [[ -f "${job_header}" ]]; then
  fields=$(public_declarations fields "${job_header}" RunningJob)
  [[ -z "${fields}" ]] && pass "RunningJob has no public mutable field" ||
    fail "RunningJob's public mutable fields: ${fields//$'\n'/; }; make them private, changed by a named transition"
else
  fail "no coordinator/scheduling/running_job.h under '${root}'"
fi
finish
