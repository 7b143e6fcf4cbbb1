"""Shared fixtures: the tiny model (built once per session, offline) and the `oxrl` console script."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oxrl_core.models.tiny import build_tiny_model

# Nothing in the suite may touch the network, and nothing may write into the checkout.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

OXRL = Path(sys.executable).parent / "oxrl"


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory):
    """Run folders, the `oxrl-tiny` cache and generated data go to a temporary folder."""
    root = tmp_path_factory.mktemp("oxrl-home")
    os.environ["OXRL_CHECKPOINT_DIR"] = str(root / "checkpoints")
    os.environ["OXRL_DATA_DIR"] = str(root / "data")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return root


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "oxrl-tiny")


@pytest.fixture(scope="session")
def oxrl():
    """Run the installed `oxrl` console script; returns the CompletedProcess (text)."""

    def run(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
        return subprocess.run([str(OXRL), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, cwd=Path(__file__).resolve().parents[1])

    return run
