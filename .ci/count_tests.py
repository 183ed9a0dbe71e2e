#!/usr/bin/env python3
"""Counts passed and failed test cases of one `bazel test` run.

Usage: count_tests.py BAZEL_OUTPUT TESTLOGS_DIR

Reads Bazel's console output for the per-target summary and each executed
target's test.xml under TESTLOGS_DIR (`bazel info bazel-testlogs` of the same
configuration) for its test cases. A target that failed without a report
(build failure, crash, timeout) counts as one failed case. Prints a line per
failing target, then 'N passed, M failed'.
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
    total = failed = 0
    for suite in suites:
        for case in suite.iter("testcase"):
            total += 1
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
    return total, failed


def main():
    log_path, testlogs = sys.argv[1], sys.argv[2]
    passed = failed = 0
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
        total = bad = 0
        if status not in ("FAILED TO BUILD", "NO STATUS") and os.path.exists(xml):
            try:
                total, bad = cases_from_xml(xml)
            except ET.ParseError:
                total = bad = 0
        if status in ("PASSED", "FLAKY"):
            if total == 0:
                total = 1
            passed += total - bad
            failed += bad
        else:
            bad = max(bad, 1)
            total = max(total, bad)
            passed += total - bad
            failed += bad
            print(f"failed: {target} ({status})")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
