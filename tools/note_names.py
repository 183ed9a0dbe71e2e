#!/usr/bin/env python3
"""Checks the Note convention: every Note a file cites is defined exactly once.

A Note (docs/architecture.md, "Reading the code") holds reasoning that
several places rely on. It is defined where a comment line holds nothing but
its name, with the explanation on the comment lines right below it:

    // Note [Leader lease]
    // The leader is whoever created the key PREFIX/leader, ...

Every other mention is a citation: "(Note [Leader lease] in
etcd_leadership.cc)", also when a comment wraps it across lines, and also
"// Note [X]: ..." at the start of a line, which is how a test or a code
line cites the Note it checks. Tests and docs never define a Note.

Prints each Note defined more than once (with every place) and each one
cited but never defined (with up to three citations); exits 1 if there is
any, 0 otherwise.

Usage: note_names.py [ROOT] [--list]
  ROOT    the repository root (default: the current directory); its files
          are those git lists there, else every file under it
  --list  print every defined Note and where, then check as usual
"""

import collections
import os
import re
import subprocess
import sys

SOURCE = re.compile(r'(\.(cc|h|cu|sh|py|bzl|proto|cmake|md)|BUILD|CMakeLists\.txt|\.ci/run)$')
# A comment line that holds only a Note's name (Starlark docstrings have no
# comment marker).
DEFINITION = re.compile(r'^\s*(//+|#+)?\s*Note \[([^\]\n]+)\]\s*$')
# A citation, also one that a comment wraps: "Note [Joins through\n// the agent]".
CITATION = re.compile(r'Note\s*(?:(?://+|#+)\s*)?\[((?:[^\]\n]|\n\s*(?://+|#+)?\s*)+)\]')


# This checker and its test, which write about Notes and define none.
IGNORED = {'tools/note_names.py', 'tests/note_names_test.sh'}


def files_of(root):
  try:
    listed = subprocess.run(['git', '-C', root, 'ls-files'], capture_output=True, text=True,
                            check=True).stdout.split('\n')
  except (OSError, subprocess.CalledProcessError):
    listed = []
    for folder, dirs, names in os.walk(root):
      dirs[:] = [d for d in dirs if not d.startswith(('.', 'bazel-'))]
      listed += [os.path.relpath(os.path.join(folder, n), root) for n in names]
  return sorted(f for f in listed if f and SOURCE.search(f) and f not in IGNORED)


def explains(marker, below):
  """Whether `below` is the explanation under a definition line: comment text
  with the same marker, or (no marker: a docstring) any text."""
  if marker is None:
    return below.strip() != '' and DEFINITION.match(below) is None
  stripped = below.lstrip()
  return stripped.startswith(marker) and stripped[len(marker):].strip() != '' \
      and DEFINITION.match(below) is None


def defines_none(path):
  return path.endswith('.md') or re.search(r'_test\.(cc|sh|py)$', path) is not None


def scan(root):
  defined = collections.defaultdict(list)
  cited = collections.defaultdict(list)
  for path in files_of(root):
    try:
      with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
        text = f.read()
    except OSError:
      continue
    lines = text.split('\n')
    definition_lines = set()
    if not defines_none(path):
      for i, line in enumerate(lines):
        match = DEFINITION.match(line)
        if match and i + 1 < len(lines) and explains(match.group(1), lines[i + 1]):
          defined[match.group(2).strip()].append(f'{path}:{i + 1}')
          definition_lines.add(i + 1)
    for match in CITATION.finditer(text):
      line = text.count('\n', 0, match.start()) + 1
      if line in definition_lines:
        continue
      name = ' '.join(re.sub(r'(//+|#+)', ' ', match.group(1)).split())
      cited[name].append(f'{path}:{line}')
  return defined, cited


def main(argv):
  args = [a for a in argv if not a.startswith('--')]
  root = args[0] if args else '.'
  defined, cited = scan(root)
  if '--list' in argv:
    for name in sorted(defined):
      print(f'{name}: {", ".join(defined[name])}')
  problems = 0
  for name in sorted(defined):
    if len(defined[name]) > 1:
      print(f'Note [{name}] is defined {len(defined[name])} times: {", ".join(defined[name])}'
            ' (give each its own name, or cite the one)')
      problems += 1
  for name in sorted(cited):
    if name not in defined:
      print(f'Note [{name}] is cited but defined nowhere: {", ".join(cited[name][:3])}'
            ' (define it where the reasoning lives: a comment line "Note [name]" alone,'
            ' the explanation below it)')
      problems += 1
  print(f'{len(defined)} Notes defined, {sum(len(c) for c in cited.values())} citations,'
        f' {problems} problem(s)')
  return 1 if problems else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
