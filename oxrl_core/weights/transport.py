"""How new weights travel from the trainer to the vLLM engine workers, never through the driver or Ray's object store.

- CUDA IPC (colocated on GPUs): bucket by bucket (the same buckets as below), every trainer rank copies its gathered
  weights into one flat buffer and shares it as a handle keyed by its GPU's UUID; each engine worker opens the one of
  its own GPU, copies device to device and waits for the copies before the next bucket. One buffer per bucket, not
  one per tensor: every handle opened costs a `cudaIpcOpenMemHandle` of milliseconds; and not one for the model:
  a whole copy would sit on each GPU beside the trainer's shard and vLLM's weights (64 GB for a 32B model).
- Broadcast (split, and always on CPU): a process group of trainer rank 0 and every engine worker (NCCL on GPUs,
  gloo on CPU), outside both sides' default groups. Rank 0 packs the weights in the order of a plan both sides
  hold into flat buckets of at most `bucket_bytes` and broadcasts them one by one; the workers unpack each bucket
  into views and load them as they arrive, so either side holds one bucket, not the model.
"""

import datetime
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class WeightSpec:
    """One tensor as vLLM loads it: its Hugging Face name, full shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "bfloat16"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def buckets(plan: list[WeightSpec], bucket_bytes: int) -> list[list[WeightSpec]]:
    """The plan cut into consecutive buckets of one dtype and at most `bucket_bytes` (a larger tensor alone)."""
    out: list[list[WeightSpec]] = []
    size = 0
    for spec in plan:
        nbytes = spec.numel * getattr(torch, spec.dtype).itemsize
        if not out or spec.dtype != out[-1][0].dtype or size + nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(spec)
        size += nbytes
    return out


class WeightChannel:
    """This process's end of the broadcast group: rank 0 is the trainer, 1..N the engine workers."""

    def __init__(
        self,
        address: str,
        port: int,
        rank: int,
        world: int,
        plan: list[WeightSpec],
        bucket_bytes: int,
        timeout: datetime.timedelta,
    ):
        """`timeout`: how long joining, and each broadcast, may wait for the others (`watchdog.collective_timeout`)."""
        store = dist.TCPStore(address, port, world, is_master=rank == 0, timeout=timeout)
        store = dist.PrefixStore("oxrl-weights", store)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        if self.device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(store, rank, world, timeout)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world, timeout)
        self.buckets = buckets(plan, bucket_bytes)

    def send(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Rank 0: broadcast `weights` (in plan order) bucket by bucket."""
        for bucket in self.buckets:
            self._broadcast(packed(bucket, weights, self.device))
        assert next(weights, None) is None, "more weights than the plan"

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Engine worker: the weights as (name, view of the current bucket), one bucket received at a time."""
        for bucket in self.buckets:
            flat = _flat_buffer(bucket, self.device)
            self._broadcast(flat)
            yield from unpacked(bucket, flat)

    def _broadcast(self, flat: torch.Tensor) -> None:
        self.group.broadcast([flat], dist.BroadcastOptions()).wait()
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()


def gpu_uuid() -> str:
    """The current GPU's UUID: one name for it in every process, whatever CUDA_VISIBLE_DEVICES each sees."""
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def share_over_ipc(bucket: list[WeightSpec], weights: Iterator[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, tuple]:
    """The next len(bucket) of `weights` packed into one flat buffer on this GPU, and the buffer's CUDA IPC handle;
    the buffer must stay alive until the engine worker has loaded it."""
    from torch.multiprocessing.reductions import reduce_tensor

    flat = packed(bucket, weights, torch.device("cuda", torch.cuda.current_device()))
    return flat, reduce_tensor(flat)


def open_ipc(handles: dict[str, tuple]) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine worker: views of the bucket shared by the trainer rank on this worker's GPU, tensor by tensor."""
    bucket, (rebuild, args) = handles[gpu_uuid()]
    yield from unpacked(bucket, rebuild(*args))


def packed(bucket: list[WeightSpec], weights: Iterator[tuple[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    """The next len(bucket) of `weights`, checked against the bucket's names, copied end to end into one flat tensor."""
    flat = _flat_buffer(bucket, device)
    offset = 0
    for spec in bucket:
        name, tensor = next(weights)
        assert name == spec.name, f"weight {name} sent where the plan has {spec.name}"
        flat[offset : offset + spec.numel].copy_(tensor.reshape(-1))
        offset += spec.numel
    return flat


def unpacked(bucket: list[WeightSpec], flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """`packed`'s inverse: (name, view of `flat` in the tensor's shape) for each tensor of the bucket."""
    offset = 0
    for spec in bucket:
        yield spec.name, flat[offset : offset + spec.numel].view(spec.shape)
        offset += spec.numel


def _flat_buffer(bucket: list[WeightSpec], device: torch.device) -> torch.Tensor:
    """Room for the bucket's tensors end to end (one dtype per bucket)."""
    return torch.empty(sum(s.numel for s in bucket), dtype=getattr(torch, bucket[0].dtype), device=device)
