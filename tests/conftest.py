"""Shared fixtures: the tiny model (built once per session, offline), the `oxrl` console script, and one Ray
cluster that the session's integration runs join."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from oxrl_core.models.tiny import resolve_tiny_model

# Nothing in the suite may touch the network, and nothing may write into the checkout.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

OXRL = Path(sys.executable).parent / "oxrl"
REPO = Path(__file__).resolve().parents[1]

# The shared cluster's head: the cluster a run starts for itself (`start_ray`), held until pytest closes stdin.
RAY_HEAD = """
import sys
import ray
from oxrl_core.placement import start_ray
start_ray(num_cpus=16)  # CPU slots, as a user would give `ray start --num-cpus`: room for two runs at once
print("RAY_ADDRESS=" + ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


def pytest_configure(config):
    config.addinivalue_line("markers", "own_ray_cluster: an integration test whose runs start and stop their own Ray "
                                       "cluster, as `oxrl` does when RAY_ADDRESS is not set")


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory):
    """Run folders, the `oxrl-tiny` cache and generated data go to a temporary folder."""
    root = tmp_path_factory.mktemp("oxrl-home")
    os.environ["OXRL_CHECKPOINT_DIR"] = str(root / "checkpoints")
    os.environ["OXRL_DATA_DIR"] = str(root / "data")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return root


@pytest.fixture(scope="session")
def tiny_model_dir(_isolated_dirs) -> Path:
    """Built where `oxrl-tiny` resolves to, so that runs naming it (the shipped examples) find it built."""
    return resolve_tiny_model()


@pytest.fixture(scope="session")
def ray_address(_isolated_dirs) -> str:
    """One Ray cluster for the session. Starting and stopping a cluster costs each run about 6 s; joining one
    through RAY_ADDRESS (as on a user's cluster) costs a fraction of a second. A run's actors end with the run."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    head = subprocess.Popen([sys.executable, "-c", RAY_HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    address = next((line.strip().removeprefix("RAY_ADDRESS=") for line in head.stdout if line.startswith("RAY_ADDRESS=")), "")
    assert address, f"the shared Ray cluster did not start (exit code {head.wait()})"
    yield address
    head.stdin.close()
    head.wait(timeout=120)


@pytest.fixture(autouse=True)
def _join_the_shared_ray_cluster(request, monkeypatch):
    """Integration tests run on the shared cluster, except those marked `own_ray_cluster`. Module-scoped fixtures
    are set up before this; those that train ask for `ray_address` themselves."""
    if request.node.get_closest_marker("integration") and not request.node.get_closest_marker("own_ray_cluster"):
        monkeypatch.setenv("RAY_ADDRESS", request.getfixturevalue("ray_address"))


@pytest.fixture(scope="session")
def oxrl():
    """Run the installed `oxrl` console script; returns the CompletedProcess (text)."""

    def run(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
        return subprocess.run([str(OXRL), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, cwd=REPO)

    return run


@pytest.fixture(scope="session")
def oxrl_side_by_side(oxrl):
    """Run two independent `oxrl` commands at once; returns both CompletedProcesses. A run leaves one of two cores
    idle through much of its start-up (imports, single-threaded set-up), which the other fills: two DeepSpeed-only
    runs take about a third less time than one after the other. Not for runs with vLLM: two engines at once need
    more memory than a small CI machine has."""

    def run(first: list, second: list, env: dict | None = None) -> tuple[subprocess.CompletedProcess, ...]:
        with ThreadPoolExecutor(2) as pool:
            started = [pool.submit(oxrl, *args, env=env) for args in (first, second)]
            return tuple(future.result() for future in started)

    return run
