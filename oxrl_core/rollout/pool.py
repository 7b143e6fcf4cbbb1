"""A run's vLLM engines as the loops use them: sample from all of them, refresh all of them from the trainer.

An engine is one or more workers (Ray actors, one per GPU: its tensor-parallel ranks). Where they live and how
the weights reach them follow from the run's placement (`oxrl_core.cluster`).
"""

from pathlib import Path
from typing import Protocol

import ray

from oxrl_core.cluster.bundles import Reservation
from oxrl_core.cluster.watchdog import collective_timeout
from oxrl_core.config.sections import RolloutSection
from oxrl_core.rollout.engine import RolloutEngine, start_error
from oxrl_core.rollout.records import Rollout, SampleRequest, sample_seed
from oxrl_core.rollout.stream import EngineStream, FollowUp, Sampling
from oxrl_core.weights.transport import buckets


class TrainerRanks(Protocol):
    """What a refresh asks of the trainer ranks (`training.group.TrainGroup`): each rank's Ray actor, and the weights'
    plan, shares and broadcast (`weights/transport.py`)."""

    ranks: list

    def weight_plan(self) -> list:  # rank 0's: the tensors' names, shapes and dtypes, in the order they are sent
        ...

    def share_weights(self, engine_here: list[bool], bucket: int, bucket_bytes: int) -> list:  # each rank's handles
        ...

    def release_shared_weights(self) -> list:  # every rank's future
        ...

    def send_weights(self) -> list:  # every rank's future
        ...


class RolloutPool:
    def __init__(
        self,
        rollout: RolloutSection,
        model_path: str,
        dtype: str,
        seed: int,
        step_samples: int,
        hang_timeout_s: float,
        log_dir: Path,
        reservation: Reservation,
        group: TrainerRanks,
        router_replay: bool | None = None,
    ):
        """Starts the engines (`dtype`: the trainer's, e.g. "bfloat16"; engine e seeded `seed + e`; their KV caches
        sized on the CPU for `step_samples` samples a step, shared) and waits for them (an engine that cannot start is
        one line, `start_error`), then connects them to the trainer for weight refreshes. `router_replay`: the
        resolved `rollout.router_replay` (a mixture of experts: each sample carries its routes; `RolloutEngine`)."""
        self.rollout = rollout
        self.group, self.watch = group, reservation.watch
        self.placement, tp = reservation.placement, rollout.tensor_parallel_size
        self.engines, logs = [], []  # engines: each its workers, tensor-parallel rank 0 first
        max_model_len = rollout.max_prompt_len + (
            rollout.env.max_episode_tokens if rollout.env.name else rollout.max_tokens
        )
        for e in range(rollout.engines):
            options = [reservation.engine_worker_options(e, shard) for shard in range(tp)]
            meeting = reservation.address(options[0]) if tp > 1 else None
            workers = []
            for shard in range(tp):
                logs.append(log_dir / (f"engine{e}.log" if tp == 1 else f"engine{e}-tp{shard}.log"))
                workers.append(
                    self.watch.add(
                        ray.remote(RolloutEngine)
                        .options(**options[shard])
                        .remote(
                            model_path,
                            dtype,
                            max_model_len,
                            rollout.gpu_memory_utilization,
                            seed + e,
                            -(-step_samples // rollout.engines),
                            logs[-1],
                            (shard, tp, *meeting) if meeting else None,
                            router_replay,
                        ),
                        logs[-1].stem,
                        logs[-1],
                    )
                )
            self.engines.append(workers)
        self.workers = [w for workers in self.engines for w in workers]
        self.samples = EngineStream(self.engines, self.watch)
        self._releasing: list[ray.ObjectRef] = []  # the ranks' frees of their last refresh's copies
        for failure, log in zip(self.watch.get([w.start_failure.remote() for w in self.workers], "engine start"), logs):
            if failure:
                raise start_error(failure, log)
        plan, self.bucket_bytes = group.weight_plan()[0], rollout.weight_bucket_mb * 2**20
        self.weight_buckets = len(buckets(plan, self.bucket_bytes))
        if not self.placement.weights_over_ipc:
            # The broadcast group: trainer rank 0 (its rank 0, where the group meets) and every engine worker.
            address, port = reservation.address(reservation.rank_options(0))
            world, timeout = 1 + len(self.workers), collective_timeout(hang_timeout_s)
            self.watch.get(
                [
                    group.ranks[0].open_weight_channel.remote(address, port, world, self.bucket_bytes, timeout),
                    *(
                        w.open_weight_channel.remote(address, port, 1 + i, world, plan, self.bucket_bytes, timeout)
                        for i, w in enumerate(self.workers)
                    ),
                ],
                "weight channel",
            )

    def requests(
        self,
        prompts: list[list[int]],
        n: int,
        temperature: float,
        seed_base: int,
        media: list[tuple] | None = None,
        max_tokens: list[int] | None = None,
    ) -> list[SampleRequest]:
        """`n` samples of each prompt (key: prompt i's j-th sample is i * n + j), each with its prompt's `media` (if
        any), of at most `max_tokens` tokens each (each prompt's; default rollout.max_tokens). Each sample has its
        own seed, so a resumed run resamples alike: prompt i's are spaced by n, as vLLM seeds a request of n."""
        rollout = self.rollout
        max_tokens = max_tokens or [rollout.max_tokens] * len(prompts)
        return [
            SampleRequest(
                i * n + j,
                ids,
                max_tokens[i],
                sample_seed(seed_base, i, n, j),
                temperature,
                rollout.top_p,
                tuple(media[i]) if media and media[i] else (),
            )
            for i, ids in enumerate(prompts)
            for j in range(n)
        ]

    def stream(self, requests: list[SampleRequest], groups: list[int], follow_up: FollowUp | None = None) -> Sampling:
        """Sample `requests`, each finished one yielded as it ends (`stream.py`). A group (`groups`: each request's,
        e.g. its prompt) stays on one engine, where its samples share the prompt's cache; groups are dealt to the
        engines round-robin."""
        return self.samples.submit(requests, [g % len(self.engines) for g in groups], follow_up)

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        temperature: float,
        seed_base: int,
        media: list[tuple] | None = None,
        max_tokens: list[int] | None = None,
    ) -> list[Rollout]:
        """All `requests(...)` at once, as rollouts sorted by prompt (`Rollout.group`)."""
        requests = self.requests(prompts, n, temperature, seed_base, media, max_tokens)
        done = sorted(self.stream(requests, [r.key // n for r in requests]), key=lambda c: c.key)
        return [Rollout.of(c, c.key // n, prompts[c.key // n], requests[c.key].media) for c in done]

    def refresh(self, policy_version: int) -> None:
        """Bring every engine worker to the trainer's current weights; their samples then carry `policy_version`."""
        group = self.group
        if self.placement.weights_over_ipc:
            self.watch.get(self._releasing, "release_shared_weights")  # the last refresh's (its errors surface here)
            engine_here = [r < len(self.workers) for r in range(len(group.ranks))]  # the other ranks join the gathers
            for bucket in range(self.weight_buckets):
                handles = {}
                for shared in group.share_weights(engine_here, bucket=bucket, bucket_bytes=self.bucket_bytes):
                    handles |= shared
                self.watch.get(
                    [w.load_shared_weights.remote(handles, policy_version) for w in self.workers], "load_shared_weights"
                )
            # Not waited for: the ranks free their last copy while the engines sample the next step, and run it before
            # any later call to them (a Ray actor runs one caller's calls in order).
            self._releasing = group.release_shared_weights()
        else:
            self.watch.get(
                [*group.send_weights(), *(w.receive_weights.remote(policy_version) for w in self.workers)],
                "weight broadcast",
            )
