"""Rules the suite keeps so that it checks the same things on every machine (CONTRIBUTING.md, "Tests")."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# The exact-number fingerprints are keyed to what decides the numerics; nothing else may look at the machine.
FINGERPRINTS = {"fingerprint.py", "test_fingerprints.py"}
MACHINE_IDENTITY = re.compile(
    r"/proc/cpuinfo|platform\.(processor|machine|node)|get_cpu_capability|gethostname"
    r"|cpu_count\(|cpu_model|lscpu"
)
SKIP = re.compile(r"pytest\.skip\(|skipif\(|importorskip\(")
# A test may skip only where what it needs is missing (a GPU, root and Slurm), never for what a machine reports.
SKIP_REASON = re.compile(r"""(reason=)?f?["'](needs |no /etc/shadow here)""")


def _test_sources() -> list[Path]:
    return [path for path in TESTS.rglob("*.py") if path.name not in FINGERPRINTS]


def test_no_test_reads_the_machine_it_runs_on():
    found = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in _test_sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if MACHINE_IDENTITY.search(line) and path.name != Path(__file__).name
    ]
    assert not found, "a test that sizes itself from, or skips on, the machine it runs on:\n" + "\n".join(found)


def test_tests_skip_only_for_a_missing_device_or_tool():
    found = []
    for path in _test_sources():
        if path.name == Path(__file__).name:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in SKIP.finditer(line):
                if not SKIP_REASON.search(line, match.end()):
                    found.append(f"{path.relative_to(TESTS)}:{number}: {line.strip()}")
    assert not found, "a skip whose reason is not a missing device or tool:\n" + "\n".join(found)


def test_the_rules_catch_a_machine_conditioned_skip():
    line = 'if cpu_model() != RECORDED: pytest.skip(f"recorded on another CPU")'
    assert MACHINE_IDENTITY.search(line)
    match = SKIP.search(line)
    assert match and not SKIP_REASON.search(line, match.end())
