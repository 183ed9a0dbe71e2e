#!/usr/bin/env bash
# The documentation stays inside the repository and stays readable: every
# link in README.md and docs/*.md is relative, resolves to a file or
# directory of the repository (and an #anchor to a heading of the page it
# names), README.md is a front page under 15000 bytes, and no source file,
# script or page cites a design document that is not in the repository
# ("DESIGN.md"): what a comment points at, a newcomer can open.
#
# Usage: docs_links_test.sh [REPOSITORY_ROOT]
#   Without an argument (as under Bazel) the root is where README.md, as
#   found in the runfiles, really lives: links name directories and files
#   no test can declare as inputs.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

root=${1:-$(dirname "$(realpath README.md)")}
[[ -f "${root}/README.md" && -d "${root}/docs" ]] || { fail "no README.md and docs/ under '${root}'"; finish; }

size=$(wc -c <"${root}/README.md")
(( size < 15000 )) && pass "README.md is ${size} bytes" || fail "README.md is ${size} bytes; keep it under 15000 (move detail to docs/)"

# Prints one line per bad link: FILE: [TEXT](TARGET): WHY; and "checked N links" last.
report=$(python3 - "${root}" <<'PY'
import os, re, sys

root = os.path.realpath(sys.argv[1])
pages = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))

def slug(heading):
    # GitHub's anchors: lower case, punctuation other than '-' and '_' dropped, spaces to '-'.
    text = re.sub(r"[`*_]|\[|\]|\([^)]*\)", lambda m: "_" if m.group(0) == "_" else "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")

def anchors(path):
    found, in_code = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found

def links(path):
    in_code = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for m in re.finditer(r"\[([^\]]*)\]\(([^)\s]*)\)", line):
            yield n, m.group(1), m.group(2)

bad, count = [], 0
for page in pages:
    path = os.path.join(root, page)
    for n, text, target in links(path):
        count += 1
        where = "%s:%d: [%s](%s)" % (page, n, text, target)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("/"):
            bad.append(where + ": points outside the repository; link a file in it")
            continue
        file_part, _, anchor = target.partition("#")
        resolved = os.path.realpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if resolved != root and not resolved.startswith(root + os.sep):
            bad.append(where + ": leaves the repository")
        elif not os.path.exists(resolved):
            bad.append(where + ": %s does not exist" % os.path.relpath(resolved, root))
        elif anchor:
            if not resolved.endswith(".md"):
                bad.append(where + ": an anchor into a file that is not markdown")
            elif anchor not in anchors(resolved):
                bad.append(where + ": %s has no heading #%s" % (os.path.relpath(resolved, root), anchor))
for line in bad:
    print(line)
print("checked %d links in %d pages" % (count, len(pages)))
PY
)
summary=$(tail -n 1 <<<"${report}")
bad=$(sed '$d' <<<"${report}")
echo "${summary}"
[[ -z "${bad}" && "${summary}" == checked* ]] \
  && pass "every link in README.md and docs/ resolves inside the repository" \
  || fail "bad links:"$'\n'"${bad}"
[[ "${summary}" =~ ^checked\ ([0-9]+) && ${BASH_REMATCH[1]} -gt 50 ]] \
  && pass "the pages have links to check (${BASH_REMATCH[1]})" || fail "found no links: '${report}'"

# Citations of a document outside the repository (this test excepted: it
# names the pattern; Bazel's output links and git's own files skipped).
outside=$(cd "${root}" && grep -rnI --exclude-dir='.git' --exclude-dir='bazel-*' \
  --exclude='docs_links_test.sh' -e 'DESIGN\.md' . || true)
[[ -z "${outside}" ]] \
  && pass "no file cites DESIGN.md, which is not in the repository" \
  || fail "these cite DESIGN.md, which is not in the repository; point at docs/ instead:"$'\n'"${outside}"

finish
