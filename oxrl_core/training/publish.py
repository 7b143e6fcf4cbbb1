"""Publishing the policy's weights to the vLLM engines (the transport itself: weights/transport.py)."""

import datetime
from collections.abc import Iterator

import torch

from oxrl_core.models.hub import media_encoder
from oxrl_core.weights.transport import WeightChannel, WeightSpec, buckets, gpu_uuid, share_over_ipc


class WeightPublisher:
    """A trainer rank's side of a weight refresh, methods of its Ray actor (`TrainEngine`, which provides `_policy()`,
    `spec`, `rank`, `multimodal` and `zero3`). Every rank calls each of them: under ZeRO-3 every weight is gathered from
    all of them."""

    def weight_plan(self) -> list[WeightSpec]:
        """What `refresh_weights` yields, in order: the policy's weights under their Hugging Face names, with
        LoRA merged (vLLM serves plain weights, no adapter machinery, and needs no restart)."""
        model_type = self._policy().config.model_type
        return [
            WeightSpec(
                _served_name(name, model_type),
                tuple(getattr(param, "ds_shape", param.shape)),
                str(param.dtype).removeprefix("torch."),
            )
            for name, param in self._refreshed_parameters()
        ]

    def _refreshed_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The policy's parameters the engines take at a refresh: all but the LoRA factors (merged into their base
        layer's weight) and a frozen vision tower (the engines loaded it from the same folder)."""
        policy = self._policy()
        frozen = (
            {id(p) for p in media_encoder(policy).parameters()}
            if self.multimodal and self.spec.model.freeze_vision
            else set()
        )
        return (
            (name, param)
            for name, param in policy.named_parameters()
            if not _is_lora_factor(name) and id(param) not in frozen
        )

    def refresh_weights(self, materialize: bool) -> Iterator[tuple[str, torch.Tensor | None]]:
        """The `weight_plan` weights, whole, one at a time (every rank must iterate: under ZeRO-3 each is gathered
        from all of them). With `materialize` each comes as a tensor valid until the next one (with LoRA, W + scale
        * B A, peft's own delta); without, as None."""
        import deepspeed

        policy = self._policy()
        model_type = policy.config.model_type
        for name, param in self._refreshed_parameters():
            lora_layer = policy.get_submodule(name.split(".base_layer.")[0]) if ".base_layer.weight" in name else None
            params = (
                [param, *lora_layer.lora_A.parameters(), *lora_layer.lora_B.parameters()] if lora_layer else [param]
            )
            with deepspeed.zero.GatheredParameters(params, enabled=self.zero3):
                weight = None
                if materialize:
                    weight = param.detach() if lora_layer is None else merged_lora_weight(param, lora_layer)
                yield _served_name(name, model_type), weight

    def share_weights(self, engine_here: bool, bucket: int, bucket_bytes: int) -> dict[str, tuple]:
        """Colocated, called for bucket 0, 1, ... of the weight plan cut into `bucket_bytes` in turn: that bucket of this
        rank's weights as a CUDA IPC handle, keyed by its GPU's UUID, when an engine worker shares its GPU (it copies
        them device to device); the copy stays alive here until the next bucket or `release_shared_weights`."""
        if bucket == 0:  # the refresh's plan and its one pass over the weights, kept for the buckets that follow
            self._refresh_buckets = buckets(self.weight_plan(), bucket_bytes)
            self._refreshing = self.refresh_weights(materialize=engine_here)
        plan = self._refresh_buckets
        self.release_shared_weights()  # the last bucket's: its engine worker has loaded it and let go of it
        if engine_here:
            self._shared_weights, handle = share_over_ipc(plan[bucket], self._refreshing)
        else:  # only join the gathers
            for _ in plan[bucket]:
                next(self._refreshing)
        if bucket == len(plan) - 1:
            assert next(self._refreshing, None) is None, "more weights than the plan"
        return {gpu_uuid(): (plan[bucket], handle)} if engine_here else {}

    def release_shared_weights(self) -> None:
        """Free the copy `share_weights` made once the engines have loaded it: kept, it would sit beside the next
        step's activations."""
        self._shared_weights = None
        torch.cuda.ipc_collect()  # memory the engines opened through IPC is freed only once they let go of it

    def open_weight_channel(
        self, address: str, port: int, world: int, bucket_bytes: int, timeout: datetime.timedelta
    ) -> None:
        """Rank 0 joins the broadcast group as its rank 0 (returns once every engine worker has joined)."""
        self._channel = WeightChannel(address, port, 0, world, self.weight_plan(), bucket_bytes, timeout)

    def send_weights(self) -> None:
        """Every rank joins the gathers; rank 0 broadcasts the weights to the engine workers."""
        if self.rank == 0:
            self._channel.send(self.refresh_weights(materialize=True))
        else:
            self._join_gathers()

    def _join_gathers(self) -> None:
        """Take part in a refresh without producing weights: under ZeRO-3 each is gathered from every rank."""
        for _ in self.refresh_weights(materialize=False):
            pass


def merged_lora_weight(weight: torch.Tensor, lora_layer) -> torch.Tensor:
    """W + scale * B A for each active adapter (peft's own delta), as a plain tensor: A and B require grad, and a
    tensor with autograd history cannot cross processes (CUDA IPC's `reduce_tensor` refuses it)."""
    with torch.no_grad():
        return weight + sum(lora_layer.get_delta_weight(a) for a in lora_layer.active_adapters)


def _served_name(name: str, model_type: str) -> str:
    """peft's parameter name as the model's checkpoints (and so vLLM) call it."""
    name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    for runtime, served in CHECKPOINT_PREFIXES.get(model_type, ()):
        if name.startswith(runtime):
            return served + name.removeprefix(runtime)
    return name


# Where transformers 5 names a model's modules otherwise than its checkpoints do and vLLM maps no name back (its
# Qwen-VL and Idefics3 models take transformers' names): (runtime prefix, checkpoint prefix), the first that matches
CHECKPOINT_PREFIXES = {
    "qwen2_audio": (
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.", ""),
    )
}


def _is_lora_factor(name: str) -> bool:
    """Whether the parameter is a LoRA adapter's A or B (merged into its base layer's weight, never sent alone)."""
    return ".lora_A." in name or ".lora_B." in name
