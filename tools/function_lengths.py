#!/usr/bin/env python3
"""Lines of each function defined in Chorus' C++ sources, longest first.

Usage: tools/function_lengths.py [--over N] [ROOT]

Reads every .cc and .h file under ROOT (default: the repository this script
is in) except tests (*_test.cc, *_test.h), examples/ and Bazel's output
links, and prints one line per function longer than N lines (default 0: all
of them):

  LINES PATH:LINE NAME

A function is a brace block opened at namespace level or in a class body
whose head is not a class, struct, enum, union or initializer; its lines run from the first line
of its signature to its closing brace. String and character literals, raw
strings and comments are skipped when braces are counted. Good enough for
code formatted as this repository's is (clang-format, Google style), which is
all it is asked to read.
"""
import os
import re
import sys

SKIP_DIRS = (".git", "bazel-", "third_party", "examples")
TYPE_HEAD = re.compile(r"^(template\s*<.*>\s*)?(class|struct|enum|union)\b")
ACCESS = re.compile(r"^(public|protected|private)\s*:\s*")
NAME = re.compile(r"([A-Za-z_~][\w:~]*(?:operator\S+)?)\s*\(")


def code_of(line, state):
    """The line without literals and comments; `state` carries raw strings
    and block comments across lines."""
    out = []
    i = 0
    while i < len(line):
        if state.get("raw"):
            end = line.find(state["raw"], i)
            if end < 0:
                return "".join(out)
            i = end + len(state["raw"])
            state["raw"] = None
            continue
        if state.get("comment"):
            end = line.find("*/", i)
            if end < 0:
                return "".join(out)
            i = end + 2
            state["comment"] = False
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["comment"] = True
            i += 2
            continue
        raw = re.match(r'R"([^(\s]*)\(', line[i:])
        if raw and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            state["raw"] = ")" + raw.group(1) + '"'
            i += raw.end()
            continue
        if c in "\"'":
            j = i + 1
            while j < len(line) and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def signature_start(lines, i):
    """The first line of the signature whose body opens on line i."""
    s = i
    while s > 0:
        prev = lines[s - 1].strip()
        if (not prev or prev.startswith(("//", "#", "/*", "*")) or ACCESS.match(prev)
                or code_of(lines[s - 1], {}).rstrip().endswith((";", "}", "{"))):
            break
        s -= 1
    return s


def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    state = {}
    depth = 0
    # Open blocks a function may be written in (class bodies) or that are
    # not functions (initializers, enums), and the function being read:
    # (kind, depth before the block opened, first line).
    blocks = []
    found = []
    for i, raw in enumerate(lines):
        code = code_of(raw, state)
        stripped = code.strip()
        # Namespace braces do not nest functions.
        if re.match(r"^(inline\s+)?namespace\b[^{]*\{\s*$", stripped) or re.match(
                r'^extern\s+"C"', raw.strip()):
            continue
        if re.match(r"^\}\s*$", stripped) and re.search(r"//\s*namespace", raw):
            continue
        opens, closes = code.count("{"), code.count("}")
        inside = blocks[-1][0] if blocks else "namespace"
        if inside in ("namespace", "type") and opens > closes:
            head = stripped
            if TYPE_HEAD.match(ACCESS.sub("", head)):
                blocks.append(("type", depth, i))
            elif re.search(r"=\s*\{?\s*$", head.split("{")[0]):
                blocks.append(("other", depth, i))
            else:
                blocks.append(("function", depth, signature_start(lines, i)))
        depth = max(0, depth + opens - closes)
        while blocks and depth <= blocks[-1][1]:
            kind, _, start = blocks.pop()
            if kind == "function":
                signature = " ".join(lines[start:i + 1][:4])
                name = NAME.search(signature)
                found.append((i - start + 1, start + 1, name.group(1) if name else "?"))
    return found


def main(argv):
    over = 0
    args = list(argv)
    if args[:1] == ["--over"]:
        over = int(args[1])
        args = args[2:]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    rows = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(SKIP_DIRS))
        for f in sorted(files):
            if f.endswith((".cc", ".h")) and not f.endswith(("_test.cc", "_test.h")):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                rows += [(n, rel, line, name) for n, line, name in functions(path) if n > over]
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    for n, rel, line, name in rows:
        print(f"{n:4d} {rel}:{line} {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
