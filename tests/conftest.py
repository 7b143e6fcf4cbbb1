"""Shared fixtures: the tiny model (built once per session, offline), the `oxrl` console script, and one Ray
cluster that the session's integration runs join."""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from oxrl_core.models.tiny import (
    TINY_AUDIO_MODEL_NAME,
    TINY_QWEN3_VL_MODEL_NAME,
    TINY_SMOLVLM_MODEL_NAME,
    TINY_VL_MODEL_NAME,
    resolve_tiny_model,
)

# Nothing in the suite may touch the network, and nothing may write into the checkout.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# vLLM's own level, which the runs inherit: tests read its lines in engine logs, and TRL (imported by the tests that
# compare losses with it) sets it to ERROR for the whole process where it is unset.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")

OXRL = Path(sys.executable).parent / "oxrl"
REPO = Path(__file__).resolve().parents[1]
FINGERPRINTS = REPO / "tests" / "integration" / "fingerprints.json"

# The shared cluster's head: the cluster a run starts for itself (`start_ray`), held until pytest closes stdin.
RAY_HEAD = """
import sys
import ray
from oxrl_core.cluster.session import start_ray
start_ray(num_cpus=16)  # CPU slots, as a user would give `ray start --num-cpus`: room for two runs at once
print("RAY_ADDRESS=" + ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`make test-all`: two workers) the integration tests go first, each file's on one worker and
    in order, so that its module fixtures train once; the files that start from the shipped SFT run share a worker,
    so that the session fixture trains it once. Each fingerprint comparison goes to the worker of the run it compares,
    after it (the runs are remembered in that worker's memory). The unit and CLI tests fill the gaps. Run serially,
    the comparisons come last."""
    from_sft = {item.path for item in items if "shipped_sft_run" in getattr(item, "fixturenames", ())}
    group = {item.path: "shipped-sft" if item.path in from_sft else item.path.stem for item in items}
    producers = {name: entry.get("test_file") for name, entry in json.loads(FINGERPRINTS.read_text()).items()}
    comparisons = [item for item in items if item.path == FINGERPRINTS.with_name("test_fingerprints.py")]
    ordered = sorted(
        (item for item in items if item not in comparisons), key=lambda item: not item.get_closest_marker("integration")
    )
    for item in ordered:
        if item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.xdist_group(group[item.path]))
    for item in comparisons:
        producer = producers.get(item.callspec.params["name"])
        runs = [i for i, run in enumerate(ordered) if run.path.name == producer]
        if runs:
            item.add_marker(pytest.mark.xdist_group(group[ordered[runs[-1]].path]))
        ordered.insert(runs[-1] + 1 if runs else len(ordered), item)
    items[:] = ordered


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "own_ray_cluster: an integration test whose runs start and stop their own Ray "
        "cluster, as `oxrl` does when RAY_ADDRESS is not set",
    )


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
def tiny_vl_model_dir(_isolated_dirs) -> Path:
    """`oxrl-tiny-vl`, built where the shipped VLM examples find it."""
    return resolve_tiny_model(TINY_VL_MODEL_NAME)


@pytest.fixture(scope="session")
def tiny_qwen3_vl_model_dir(_isolated_dirs) -> Path:
    return resolve_tiny_model(TINY_QWEN3_VL_MODEL_NAME)


@pytest.fixture(scope="session")
def tiny_smolvlm_model_dir(_isolated_dirs) -> Path:
    return resolve_tiny_model(TINY_SMOLVLM_MODEL_NAME)


@pytest.fixture(scope="session")
def tiny_audio_model_dir(_isolated_dirs) -> Path:
    return resolve_tiny_model(TINY_AUDIO_MODEL_NAME)


@pytest.fixture(scope="session")
def ray_address(_isolated_dirs) -> str:
    """One Ray cluster for the session. Starting and stopping a cluster costs each run about 6 s; joining one
    through RAY_ADDRESS (as on a user's cluster) costs a fraction of a second. A run's actors end with the run."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    head = subprocess.Popen(
        [sys.executable, "-c", RAY_HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    address = next(
        (line.strip().removeprefix("RAY_ADDRESS=") for line in head.stdout if line.startswith("RAY_ADDRESS=")), ""
    )
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
        return subprocess.run(
            [str(OXRL), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=REPO,
        )

    return run


@pytest.fixture(scope="session")
def shipped_sft_run(tmp_path_factory, tiny_model_dir, oxrl, ray_address) -> Path:
    """The shipped SFT example as shipped (60 steps, ZeRO-3 on 2 ranks), trained once: its metrics and checkpoints
    are checked (tests/integration/test_sft.py), and its final model, which the RL examples that start from it name,
    plays DAPO's example and the environment examples' episodes. (Session fixtures are set up before the per-test
    one that sets RAY_ADDRESS: this one passes it itself.)"""
    out = tmp_path_factory.mktemp("sft") / "runs"
    result = oxrl(
        "train",
        "sl",
        "--alg",
        "sft",
        "--config",
        "examples/sft_tiny.yaml",
        f"run.output_dir={out}",
        env={"RAY_ADDRESS": ray_address},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "sft-tiny"


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


@dataclass
class SignalledRun:
    returncode: int
    stdout: str
    stderr: str
    seconds_to_exit: float  # from the signal to the exit
    leftover_processes: list[str]  # processes of the run alive after it exited
    leftover_shm: list[str]  # /dev/shm entries made during the run that no live process holds: the run's orphans


@pytest.fixture(scope="session")
def oxrl_signalled():
    """`oxrl_signalled(args, when, signum, to="driver", env=None, after_signal=None, pid_of=None)`: run the console
    script in a session of its own, send `signum` once `when(stdout so far)` is true (`to`: "driver", the process,
    as Kubernetes does; "group", its process group, as Ctrl-C and `timeout` do; "job", every process of the run at
    once, as Slurm does; or the process `pid_of()` names), call `after_signal` and wait for the exit. Every process
    of the run carries a marker in its environment, so those left behind are found wherever they were reparented."""

    def run(
        args: list, when, signum: int, to: str = "driver", env: dict | None = None, after_signal=None, pid_of=None
    ) -> SignalledRun:
        marker = f"oxrl-test-{uuid.uuid4().hex}"
        shm_before = set(os.listdir("/dev/shm"))
        process = subprocess.Popen(
            [str(OXRL), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            start_new_session=True,
            env={**os.environ, **(env or {}), "OXRL_TEST_MARKER": marker},
        )
        lines, errors = [], []
        readers = [
            threading.Thread(target=lambda s=s, into=into: into.extend(s), daemon=True)
            for s, into in ((process.stdout, lines), (process.stderr, errors))
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 600
        while not when("".join(lines)) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, f"the run ended before the signal:\n{''.join(errors)[-3000:]}"
        signalled = time.monotonic()
        if pid_of or to == "driver":
            os.kill(pid_of() if pid_of else process.pid, signum)
        elif to == "group":
            os.killpg(process.pid, signum)
        else:
            for pid in _pids_with(f"OXRL_TEST_MARKER={marker}".encode()):
                with suppress(ProcessLookupError):
                    os.kill(pid, signum)
        if after_signal:
            after_signal()
        returncode = process.wait(timeout=300)
        seconds = time.monotonic() - signalled
        for reader in readers:
            reader.join()
        time.sleep(2)  # what the run's exit kills needs a moment to go
        left = [f"{pid}: {_cmdline(pid)}" for pid in _pids_with(f"OXRL_TEST_MARKER={marker}".encode())]
        shm = sorted(set(os.listdir("/dev/shm")) - shm_before - _shm_in_use())  # another worker's runs hold theirs
        return SignalledRun(returncode, "".join(lines), "".join(errors), seconds, left, shm)

    return run


def _pids_with(environ_entry: bytes) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and environ_entry in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return pids


def _shm_in_use() -> set[str]:
    """The /dev/shm entries some live process has open or mapped."""
    held = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            maps = (entry / "maps").read_text().splitlines()
            held.update(line.split("/dev/shm/", 1)[1].split(" ")[0] for line in maps if "/dev/shm/" in line)
        with suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with suppress(OSError):
                    if (target := os.readlink(fd)).startswith("/dev/shm/"):
                        held.add(target.removeprefix("/dev/shm/"))
    return held


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "(gone)"
