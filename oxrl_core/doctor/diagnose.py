"""`run_checks`: every doctor check, in the order the report shows them.

The slow probes (Ray start, DeepSpeed's op report, torch on the GPUs, the
all-reduce) run at once in child processes while the quick checks run here, so
that a plain `oxrl doctor` takes about as long as its slowest probe, the Ray
start. This process never imports torch (a second or more of CPU, which the
probes need). The RL step runs last, alone.
"""

from oxrl_core.doctor import gpu, probes, system
from oxrl_core.doctor.packages import package_checks
from oxrl_core.doctor.report import Check, Report


def run_checks(deep: bool, smoke: bool, timeout: float) -> Report:
    """All checks; `deep` adds a 2-process all-reduce, `smoke` one RL step; `timeout` bounds each probe (not the RL step)."""
    # The Ray start is the slowest: it goes first, before NVML is even read.
    ray = probes.Probe("ray_start", [], timeout)
    deepspeed = probes.Probe("deepspeed_report", [], timeout)
    nvml = gpu.read_nvml()
    has_gpu = not isinstance(nvml, str)
    # NCCL needs a GPU per rank; with fewer than two, the all-reduce goes over gloo.
    backend = "nccl" if has_gpu and len(nvml.gpus) >= 2 else "gloo"
    torch_gpus = probes.Probe("torch_sees_gpus", [], timeout) if has_gpu else None
    all_reduce = probes.Probe("all_reduce", [backend], timeout) if deep else None

    checks: list[Check] = [
        system.python_check(),
        system.os_check(),
        system.cpu_check(),
        system.ram_check(),
        *([] if has_gpu else [system.vllm_cpu_memory_check()]),
        system.disk_check("OXRL_DATA_DIR", "data"),
        system.disk_check("OXRL_CHECKPOINT_DIR", "checkpoints"),
        system.shm_check(),
        *gpu.gpu_checks(nvml),
    ]
    torch_cuda = gpu.torch_cuda()
    if has_gpu:
        if len(nvml.gpus) > 1:
            checks.append(gpu.topology_check(nvml))
        checks.append(gpu.cuda_driver_check(nvml, torch_cuda, torch_gpus.result()))
    checks.append(gpu.nvcc_check(torch_cuda, has_gpu))
    checks += package_checks(has_gpu)
    checks.append(system.huggingface_check())
    checks.append(system.build_locks_check())
    checks.append(probes.deepspeed_check(deepspeed.result(), has_gpu))
    checks.append(probes.ray_check(ray.result()))
    if all_reduce:
        checks.append(probes.all_reduce_check(all_reduce.result(), backend))
    if smoke:
        checks.append(probes.rl_step_check(probes.Probe("rl_step", [], probes.SMOKE_TIMEOUT_S).result()))
    return Report.of(checks)
