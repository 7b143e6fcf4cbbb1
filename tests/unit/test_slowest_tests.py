"""scripts/slowest_tests.py: where a suite run's time went, read from the JUnit file the run writes."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.integration.test_rl" name="test_resume@test_rl" time="120.5"/>
<testcase classname="tests.integration.test_rl" name="test_two_steps[cispo]@test_rl" time="60.0"><failure/></testcase>
<testcase classname="tests.unit.test_math" name="test_loss" time="0.25"/>
<testcase classname="tests.cli.test_cli" name="test_help" time="2.0"><skipped/></testcase>
</testsuite></testsuites>"""


def test_the_slowest_tests_come_first_with_each_file_and_each_parts_total(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "slowest_tests.py"), str(tmp_path / "run.xml")],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "4 tests, 183 s in all (summed over workers)"
    slowest = lines[lines.index("slowest 25:") + 1 : lines.index("slowest 25:") + 5]
    assert [line.split()[0] for line in slowest] == ["120.5", "60.0", "2.0", "0.2"]
    assert slowest[0].endswith("tests.integration.test_rl::test_resume")  # the xdist group left off
    assert slowest[1].endswith("test_two_steps[cispo]  (failure)") and slowest[2].endswith("(skipped)")
    assert "    180.5 s  tests.integration.test_rl" in lines
    assert "    180.5 s  tests.integration (2 tests)" in lines and "      0.2 s  tests.unit (1 tests)" in lines


def test_a_missing_file_says_which_command_writes_it(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "slowest_tests.py"), str(tmp_path / "none.xml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "`make test-all` writes it" in result.stderr
