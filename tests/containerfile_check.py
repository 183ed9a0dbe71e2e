"""Lints a Containerfile against the build context it is meant for.

Usage: containerfile_check.py CONTAINERFILE CONTEXT_DIR

What no container builder is needed for: every instruction is one the
Containerfile format has (continuation lines joined); the base is a
build argument whose default names a Debian bookworm tag (never latest);
every COPY source exists in the context and nothing is fetched with ADD;
the image runs as a numeric non-root USER; ENTRYPOINT is the exec (JSON)
form and names a program the context puts in the image; CMD, when given,
is the exec form too. Prints "ok: ..." / "FAIL: ..." lines; exits 1 on a
failure.
"""

import json
import os
import re
import sys

KNOWN = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
         "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def instructions(path):
    lines, current = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not current and (not line.strip() or line.lstrip().startswith("#")):
                continue
            current += line[:-1] + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                lines.append(current.strip())
                current = ""
    if current:
        lines.append(current.strip())
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if " " in l else "") for l in lines]


def main(containerfile, context):
    failures = []
    found = instructions(containerfile)
    unknown = [k for k, _ in found if k not in KNOWN]
    if unknown:
        failures.append(f"unknown instructions {unknown}")
    args = {}
    for key, value in found:
        if key == "ARG" and "=" in value:
            name, default = value.split("=", 1)
            args[name.strip()] = default.strip()
        if key == "FROM":
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)
            if not re.search(r"debian:bookworm[\w.-]*$", base):
                failures.append(f"FROM {value} -> {base}: not a pinned Debian bookworm tag")
            else:
                print(f"ok: FROM {base}")
        if key == "ADD" and re.search(r"https?://", value):
            failures.append(f"ADD fetches from the network: {value}")
        if key == "COPY":
            parts = [p for p in value.split() if not p.startswith("--")]
            for source in parts[:-1]:
                if not os.path.exists(os.path.join(context, source)):
                    failures.append(f"COPY source {source} is not in the context")
    users = [v for k, v in found if k == "USER"]
    if not users or not re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]):
        failures.append(f"USER {users[-1] if users else '(none)'}: must be a numeric non-root uid")
    else:
        print(f"ok: runs as USER {users[-1]}")
    for key in ("ENTRYPOINT", "CMD"):
        values = [v for k, v in found if k == key]
        if not values:
            if key == "ENTRYPOINT":
                failures.append("no ENTRYPOINT")
            continue
        try:
            form = json.loads(values[-1])
        except json.JSONDecodeError:
            failures.append(f"{key} is not the exec (JSON) form: {values[-1]}")
            continue
        if key == "ENTRYPOINT":
            program = os.path.join(context, form[0].lstrip("/"))
            if not os.access(program, os.X_OK):
                failures.append(f"ENTRYPOINT {form[0]} is not an executable the context installs")
            else:
                print(f"ok: ENTRYPOINT {form[0]} is in the context")
    for failure in failures:
        print(f"FAIL: {failure}")
    if not failures:
        print(f"ok: {len(found)} instructions")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
