"""Where a suite run's time went: its 25 slowest tests, the slowest files, and each part's total.

    python scripts/slowest_tests.py [.test-results/test-all.xml]

Reads the JUnit file `make test-all` (or `make test-slow`) writes. A test's time is its call with its own set-up and
tear-down, so a module fixture's run counts in the first test that asks for it.
"""

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

XDIST_GROUP = re.compile(r"@[\w.-]+$")  # pytest-xdist's loadgroup appends a test's group to its name


def main(path: Path) -> None:
    if not path.is_file():
        sys.exit(f"{path}: no such file; `make test-all` writes it")
    cases = [
        (float(c.get("time", 0)), c.get("classname", ""), XDIST_GROUP.sub("", c.get("name", "")), _outcome(c))
        for c in ET.parse(path).getroot().iter("testcase")
    ]
    cases.sort(reverse=True)
    print(f"{len(cases)} tests, {sum(t for t, *_ in cases):.0f} s in all (summed over workers)\n")
    print("slowest 25:")
    for seconds, module, name, outcome in cases[:25]:
        print(f"  {seconds:7.1f} s  {module}::{name}{'' if outcome == 'passed' else f'  ({outcome})'}")
    files, parts = defaultdict(float), defaultdict(lambda: [0.0, 0])
    for seconds, module, _, _ in cases:
        files[module] += seconds
        part = parts[".".join(module.split(".")[:2])]  # tests.unit, tests.cli, tests.integration
        part[0] += seconds
        part[1] += 1
    print("\nslowest files:")
    for module, seconds in sorted(files.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {seconds:7.1f} s  {module}")
    print("\neach part:")
    for part, (seconds, count) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
        print(f"  {seconds:7.1f} s  {part} ({count} tests)")


def _outcome(case: ET.Element) -> str:
    for child in case:
        if child.tag in ("failure", "error", "skipped"):
            return child.tag
    return "passed"


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".test-results/test-all.xml"))
