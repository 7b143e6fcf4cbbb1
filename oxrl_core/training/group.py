"""The training side as the loops see it: N DeepSpeed ranks, one Ray actor each.

A call on the group runs the same method on every rank and waits for all of
them; rank 0's answer (or every rank's, where they differ) comes back.
"""

import logging
import os
import socket
from contextlib import contextmanager
from pathlib import Path

import ray
import torch

from oxrl_core.algs.registry import uses_rollout
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.training.engine import TrainEngine

RAY_CALL_TIMEOUT_S = 3600


@contextmanager
def ray_cluster():
    """`start_ray`, and shut down what it started."""
    start_ray()
    try:
        yield
    finally:
        ray.shutdown()


def start_ray(num_cpus: int | None = None) -> None:
    """Join `RAY_ADDRESS` when set, else start a private local cluster of `num_cpus` (default: all cores)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 object_store_memory=256 * 1024**2)


def colocated(config: SLConfig | RLConfig) -> bool:
    """True when the trainer ranks and the vLLM engines share GPUs: there are fewer GPUs than they take apart.
    Each then asks Ray for half a GPU, and vLLM takes `rollout.gpu_memory_utilization` of the memory."""
    if not (uses_rollout(config) and torch.cuda.is_available()):
        return False
    return config.run.train_ranks + config.rollout.engines * config.rollout.tensor_parallel_size > torch.cuda.device_count()


class TrainGroup:
    def __init__(self, config: SLConfig | RLConfig, model_path: str, log_dir: Path):
        world = config.run.train_ranks
        port = _free_port()
        if torch.cuda.is_available():
            actor = ray.remote(num_gpus=0.5 if colocated(config) else 1, num_cpus=1)(TrainEngine)
        else:
            # On CPU the ranks are processes sharing the cores: ask Ray for a sliver so
            # that other actors (rollout engines) can still be placed beside them.
            actor = ray.remote(num_cpus=0.01)(TrainEngine)
        self.ranks = [actor.remote(config, model_path, rank, world, port, log_dir) for rank in range(world)]
        # A colocated vLLM measures the GPU memory left to it, so the ranks must be built first; otherwise they
        # start while the rollout engines do, and the first call waits for them.
        if colocated(config):
            ray.get([rank.__ray_ready__.remote() for rank in self.ranks], timeout=RAY_CALL_TIMEOUT_S)

    def call(self, method: str, *per_rank_args, **common) -> list:
        """Run `method` on every rank. Positional args are per-rank lists; keyword args go to all."""
        futures = [
            getattr(rank, method).remote(*(args[i] for args in per_rank_args), **common)
            for i, rank in enumerate(self.ranks)
        ]
        return ray.get(futures, timeout=RAY_CALL_TIMEOUT_S)

    def shutdown(self) -> None:
        for rank in self.ranks:
            ray.kill(rank)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
