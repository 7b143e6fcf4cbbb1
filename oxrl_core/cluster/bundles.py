"""A placement made real: Ray placement groups, and the actor options that put each rank and engine worker in its
bundle. A bundle is one GPU (and a CPU slot) on GPU clusters, one CPU slot on CPU; two actors sharing a bundle
(colocated) each ask for half of it, so Ray can never put two trainer ranks on one GPU."""

import json
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from oxrl_core.cluster.placement import Placement
from oxrl_core.cluster.ports import free_port
from oxrl_core.cluster.watchdog import ActorWatch
from oxrl_core.errors import OxrlError

PLACEMENT_TIMEOUT_S = 120


class Reservation:
    def __init__(self, placement: Placement, watch: ActorWatch):
        """`watch`: every actor placed here is added to it, and the driver waits on them through it."""
        self.placement, self.watch = placement, watch
        bundle = {"GPU": 1, "CPU": 1} if placement.on_gpu else {"CPU": 1}
        # The trainer's bundles pack onto as few nodes as fit; an engine's workers must share a node (its
        # tensor-parallel group), so each split engine has a group of its own.
        self._trainer = placement_group([bundle] * placement.train_ranks, strategy="PACK")
        self._engines = (
            []
            if placement.mode == "colocated"
            else [
                placement_group([bundle] * placement.tensor_parallel_size, strategy="STRICT_PACK")
                for _ in range(placement.engines)
            ]
        )
        self._judge = placement_group([bundle]) if placement.judge == "own" else None
        ready, _ = ray.wait(
            [g.ready() for g in self._groups], num_returns=len(self._groups), timeout=PLACEMENT_TIMEOUT_S
        )
        if len(ready) < len(self._groups):
            self.release()
            raise OxrlError(
                f"placement ({placement.describe()}) needs {placement.bundles} bundle(s) of {bundle}, "
                f"an engine's on one node; Ray could not place them in {PLACEMENT_TIMEOUT_S} s. "
                f"The cluster has {ray.cluster_resources()}, free {ray.available_resources()}"
            )
        if placement.mode == "colocated" and placement.tensor_parallel_size > 1:
            self._check_engines_on_one_node()

    def _check_engines_on_one_node(self) -> None:
        """Colocated, an engine's tensor-parallel workers sit on consecutive trainer bundles, which PACK may have put
        on two nodes (nodes whose GPU count tensor_parallel_size does not divide): refused, not run across nodes."""
        p, nodes = self.placement, ray.util.placement_group_table(self._trainer)["bundles_to_node_id"]
        tp = p.tensor_parallel_size
        for engine in range(p.engines):
            if len({nodes[engine * tp + shard] for shard in range(tp)}) > 1:
                self.release()
                raise OxrlError(
                    f"placement ({p.describe()}): engine {engine}'s {tp} tensor-parallel workers would sit on the GPUs of "
                    f"trainer ranks {engine * tp}-{engine * tp + tp - 1}, which Ray placed on more than one node; use a "
                    f"rollout.tensor_parallel_size that divides each node's GPUs, or rollout.placement=split"
                )

    def rank_options(self, rank: int) -> dict:
        return self._options(self._trainer, rank)

    def engine_worker_options(self, engine: int, shard: int) -> dict:
        """Worker `shard` (its tensor-parallel rank) of `engine`."""
        if self.placement.mode == "colocated":
            return self._options(self._trainer, engine * self.placement.tensor_parallel_size + shard)
        return self._options(self._engines[engine], shard)

    def judge_options(self) -> dict:
        """The LLM judge's engine: its own bundle, or a share of trainer bundle 0."""
        return self._options(self._judge, 0) if self._judge else self._options(self._trainer, 0)

    def address(self, options: dict) -> tuple[str, int]:
        """The address of the node where an actor with these options lives, and a free port there: where a
        process group of ranks (or of an engine's tensor-parallel workers) meets."""
        where = options["scheduling_strategy"]
        return ray.get(_node_address.options(scheduling_strategy=where).remote(), timeout=PLACEMENT_TIMEOUT_S)

    def _options(self, group, bundle: int) -> dict:
        """An actor's options in `bundle` of `group`: an equal share of it with whatever else lives there."""
        p = self.placement
        sharing = (
            1
            if group is not self._trainer
            else (1 + (p.mode == "colocated" and bundle < p.engine_workers) + (p.judge == "colocated" and bundle == 0))
        )
        share = round(1 / sharing, 4)  # Ray counts in units of 1e-4: three thirds must not exceed the bundle
        options = {"num_cpus": share, "scheduling_strategy": PlacementGroupSchedulingStrategy(group, bundle)}
        if self.placement.on_gpu:
            options["num_gpus"] = share
        return options

    def record(self, run_dir: Path, ranks: list, engines: list[list]) -> str:
        """Write where each trainer rank and engine worker runs (node, address, GPUs) to placement.json; return the
        placement in a line for the console. Each actor answers once built, which may take minutes (a large model,
        DeepSpeed's CPU Adam under offload), so the wait is the run's hang deadline, not the placement's."""
        where = self.watch.get(
            [self.watch.where(actor) for actor in [*ranks, *(w for e in engines for w in e)]], "actor start"
        )
        workers = iter(where[len(ranks) :])
        (run_dir / "placement.json").write_text(
            json.dumps(
                {
                    "placement": self.placement.describe(),
                    "mode": self.placement.mode,
                    "ranks": where[: len(ranks)],
                    "engines": [[next(workers) for _ in e] for e in engines],
                },
                indent=2,
            )
        )
        return self.placement.describe()

    def release(self) -> None:
        for group in self._groups:
            remove_placement_group(group)

    @property
    def _groups(self) -> list:
        return [self._trainer, *self._engines, *([self._judge] if self._judge else [])]


@ray.remote(num_cpus=0)
def _node_address() -> tuple[str, int]:
    return ray.util.get_node_ip_address(), free_port()
