"""`run_checks`: every doctor check, in the order the report shows them.

The slow probes (Ray start, DeepSpeed's op report, the all-reduce) run in
child processes while the quick checks run here, so that a plain
`oxrl doctor` answers within seconds. The RL step runs last, alone.
"""

import torch

from oxrl_core.doctor import gpu, probes, system
from oxrl_core.doctor.packages import package_checks
from oxrl_core.doctor.report import Check, Report


def run_checks(deep: bool, smoke: bool, timeout: float) -> Report:
    """All checks; `deep` adds a 2-process all-reduce, `smoke` one RL step; `timeout` bounds each probe (not the RL step)."""
    nvml = gpu.read_nvml()
    has_gpu = not isinstance(nvml, str)
    # NCCL needs a GPU per rank; with fewer than two, the all-reduce goes over gloo.
    backend = "nccl" if has_gpu and len(nvml.gpus) >= 2 else "gloo"
    ray = probes.Probe("ray_start", [], timeout)
    deepspeed = probes.Probe("deepspeed_report", [], timeout)
    all_reduce = probes.Probe("all_reduce", [backend], timeout) if deep else None

    checks: list[Check] = [
        system.python_check(), system.os_check(), system.cpu_check(), system.ram_check(),
        *([] if has_gpu else [system.vllm_cpu_memory_check()]),
        system.disk_check("OXRL_DATA_DIR", "data"), system.disk_check("OXRL_CHECKPOINT_DIR", "checkpoints"),
        system.shm_check(),
        *gpu.gpu_checks(nvml),
    ]
    if has_gpu:
        if len(nvml.gpus) > 1:
            checks.append(gpu.topology_check(nvml))
        checks.append(gpu.cuda_driver_check(nvml, torch.version.cuda, torch.cuda.is_available()))
    checks.append(gpu.nvcc_check(torch.version.cuda, has_gpu))
    checks += package_checks(has_gpu)
    checks.append(system.huggingface_check())
    checks.append(probes.deepspeed_check(deepspeed.result(), has_gpu))
    checks.append(probes.ray_check(ray.result()))
    if all_reduce:
        checks.append(probes.all_reduce_check(all_reduce.result(), backend))
    if smoke:
        checks.append(probes.rl_step_check(probes.Probe("rl_step", [], probes.SMOKE_TIMEOUT_S).result()))
    return Report.of(checks)
