"""The training side as the loops see it: N DeepSpeed ranks, one Ray actor each, placed by the run's `Reservation`.

A call on the group runs the same method on every rank and waits for all of
them; rank 0's answer (or every rank's, where they differ) comes back.
"""

from collections.abc import Callable
from pathlib import Path

import ray

from oxrl_core.cluster.bundles import Reservation
from oxrl_core.training.engine import TrainEngine
from oxrl_core.training.spec import TrainerSpec


class TrainGroup:
    def __init__(self, spec: TrainerSpec, model_path: str, log_dir: Path, reservation: Reservation):
        world, self.watch = reservation.placement.train_ranks, reservation.watch
        master = reservation.address(reservation.rank_options(0))
        self.ranks = [
            self.watch.add(
                ray.remote(TrainEngine)
                .options(**reservation.rank_options(rank))
                .remote(spec, model_path, rank, world, master, log_dir),
                f"rank{rank}",
                log_dir / f"rank{rank}.log",
            )
            for rank in range(world)
        ]
        # A colocated vLLM measures the GPU memory left to it, so the ranks must be built first; otherwise they
        # start while the rollout engines do, and the first call waits for them.
        if reservation.placement.weights_over_ipc:
            self.watch.get([rank.__ray_ready__.remote() for rank in self.ranks], "trainer start")

    def call(self, method: Callable, *per_rank_args, **common) -> list:
        """Run `method`, a method of `TrainEngine`, on every rank. Positional args are per-rank lists; keyword args go
        to all. Its deadline scales with the micro-batches, where the first per-rank argument is a list of them."""
        units = sum(len(x) for x in per_rank_args[0] if isinstance(x, list)) if per_rank_args else 0
        return self.watch.get(self.call_async(method, *per_rank_args, **common), method.__name__, max(units, 1))

    def call_async(self, method: Callable, *per_rank_args, **common) -> list:
        """`call` without waiting: the ranks' futures."""
        return [
            getattr(rank, method.__name__).remote(*(args[i] for args in per_rank_args), **common)
            for i, rank in enumerate(self.ranks)
        ]

    # What a weight refresh asks of the ranks (`rollout.pool.TrainerRanks`)
    def weight_plan(self) -> list:
        return self.call(TrainEngine.weight_plan)

    def share_weights(self, engine_here: list[bool], bucket: int, bucket_bytes: int) -> list:
        return self.call(TrainEngine.share_weights, engine_here, bucket=bucket, bucket_bytes=bucket_bytes)

    def release_shared_weights(self) -> list:
        return self.call_async(TrainEngine.release_shared_weights)

    def send_weights(self) -> list:
        return self.call_async(TrainEngine.send_weights)

    def shutdown(self) -> None:
        for rank in self.ranks:
            ray.kill(rank)
