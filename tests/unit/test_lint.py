"""The code is formatted and linted as pyproject.toml's [tool.ruff] says, everywhere: the package, tests, benchmarks."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_finds_nothing_to_lint_and_nothing_to_reformat():
    lint = ruff("check", ".")
    assert lint.returncode == 0, lint.stdout[-4000:]
    formatted = ruff("format", "--check", ".")
    assert formatted.returncode == 0, formatted.stdout[-4000:]


def test_ruff_reports_a_line_over_the_limit(tmp_path):
    """The check above can fail: a line of 141 characters in a file under its rules is refused."""
    (tmp_path / "long.py").write_text(f"TEXT = {'x' * 132!r}\n")
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(REPO / "pyproject.toml"), "long.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 1 and "E501" in lint.stdout
