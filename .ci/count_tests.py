#!/usr/bin/env python3
"""Counts passed and failed test cases of one `bazel test` run.

Usage: count_tests.py BAZEL_OUTPUT TESTLOGS_DIR

Reads Bazel's console output for the per-target summary and each executed
target's test.xml under TESTLOGS_DIR (`bazel info bazel-testlogs` of the same
configuration) for its test cases. A target that failed without a report
(build failure, crash, timeout) counts as one failed case. Prints a line per
failing target, then 'N passed, M failed, K skipped' (skipped: test cases
that said why they could not run here, e.g. GPU tests without a GPU).
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

SUMMARY = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|SKIPPED)\b")


def cases_from_xml(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failed = skipped = 0
    for suite in suites:
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None or case.get("status") == "notrun" \
                    or case.get("result") == "skipped":
                skipped += 1
                continue
            total += 1
    return total, failed, skipped


def main():
    log_path, testlogs = sys.argv[1], sys.argv[2]
    passed = failed = skipped = 0
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    seen = set()
    for line in lines:
        m = SUMMARY.match(line.strip())
        if not m or m.group(1) in seen:
            continue
        target, status = m.group(1), m.group(2)
        seen.add(target)
        xml = os.path.join(testlogs, target[2:].replace(":", "/"), "test.xml")
        total = bad = skip = 0
        if status not in ("FAILED TO BUILD", "NO STATUS") and os.path.exists(xml):
            try:
                total, bad, skip = cases_from_xml(xml)
            except ET.ParseError:
                total = bad = skip = 0
        skipped += skip
        if status in ("PASSED", "FLAKY"):
            if total == 0 and skip == 0:
                total = 1
            passed += total - bad
            failed += bad
        else:
            bad = max(bad, 1)
            total = max(total, bad)
            passed += total - bad
            failed += bad
            print(f"failed: {target} ({status})")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
