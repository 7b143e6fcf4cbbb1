"""One DeepSpeed rank: the model, its optimizer and schedule, and what a loop asks of it.

`TrainEngine` runs inside a Ray actor (see `group.py`); every public method is
called on all ranks at once because ZeRO needs every rank for a forward,
a step, a gather or a checkpoint.
"""

import importlib
import os
import sys
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

from oxrl_core.algs.base import BatchLoss, LossArgs
from oxrl_core.cluster.process import redirect_output
from oxrl_core.cluster.watchdog import collective_timeout
from oxrl_core.data.media import media_policy
from oxrl_core.models.families import family_of
from oxrl_core.models.hub import is_multimodal, model_type, resolve_model
from oxrl_core.models.value_head import PolicyWithValueHead
from oxrl_core.training.build_locks import wait_for_builds
from oxrl_core.training.checkpoint import Checkpoints
from oxrl_core.training.deepspeed_setup import deepspeed_config, deepspeed_engine, model_dtype, name_the_accelerator
from oxrl_core.training.logprobs import token_logprobs, token_logprobs_and_entropy
from oxrl_core.training.packing import pack, unpack, unpacking
from oxrl_core.training.publish import WeightPublisher
from oxrl_core.training.routing import RouterRecord
from oxrl_core.training.spec import TrainerSpec


class TrainEngine(WeightPublisher, Checkpoints):
    """A trainer rank: its models, their forwards and its steps; its checkpoints and weight refreshes come from the
    mixins, methods of the same actor."""

    def __init__(
        self, spec: TrainerSpec, model_path: str, rank: int, world_size: int, master: tuple[str, int], log_dir: Path
    ):
        """`master`: the address and a free port of rank 0's node, where the ranks meet."""
        name_the_accelerator()
        # DeepSpeed's autotuner imports MLflow wherever it is installed, 1.2 s of every rank's start, and transformers'
        # generation utilities scikit-learn, 0.5-0.8 s; a rank never logs (the driver does) and never generates, so
        # here those imports fail at once (a process that has either already keeps it)
        sys.modules.setdefault("mlflow", None)
        sys.modules.setdefault("sklearn", None)
        redirect_output(log_dir / f"rank{rank}.log")
        on_gpu = torch.cuda.is_available()
        wait_for_builds()  # DeepSpeed may build ops from here on (its CPU collectives, CPU Adam): never on a dead lock
        join_ranks(spec, rank, world_size, master, on_gpu)
        from transformers.integrations import HfDeepSpeedConfig

        # Imported here, on the rank: the driver names this class but builds no model, and the build stack's imports
        # (torch.compile's, the packed attention's) would cost every run's driver about 2 s.
        from oxrl_core.training.build import frozen_model, load_options, pretrained_policy, trainable_policy

        self.spec, self.rank, self._dtype = spec, rank, model_dtype(spec.model)
        self.zero3 = spec.deepspeed.zero_stage == 3
        ds_config = deepspeed_config(spec)
        # Kept alive so from_pretrained builds ZeRO-3 models already partitioned.
        self._hf_ds_config = HfDeepSpeedConfig(ds_config) if self.zero3 else None
        torch.manual_seed(spec.train.seed)
        # A reward model is the backbone with a scalar head, saved as a sequence classifier: it loads with
        # AutoModelForSequenceClassification anywhere, which pools at the last non-pad token (so it runs padded).
        self.reward_model = spec.scalar_head
        # A model that reads images or audio: its processor makes each micro-batch's encoder inputs (data/media.py)
        self.multimodal, self.model_path = is_multimodal(model_path), model_path
        # Packed rows would need M-RoPE's 3-D positions per packed sequence: multimodal models run padded, as do the
        # families whose trainer needs an attention of its own (Gemma 2's eager).
        family = family_of(model_type(model_path))
        self.packed = (
            spec.model.attn_implementation == "varlen"
            and not self.reward_model
            and not self.multimodal
            and not (family and family.trainer_attention)
        )
        load = load_options(spec, self.packed, family)
        model = pretrained_policy(model_path, self.multimodal, self.reward_model, load)
        model, self.policy_head = trainable_policy(model, spec, self.multimodal, self.zero3, self.reward_model, on_gpu)
        self.critic = spec.critic
        if self.critic:
            model = PolicyWithValueHead(model, model.config.get_text_config().hidden_size, self._dtype)
        self.engine = deepspeed_engine(model, spec, ds_config, on_gpu)
        frozen = partial(
            frozen_model,
            multimodal=self.multimodal,
            load=load,
            zero3=self.zero3,
            ds_config=ds_config,
            device=self.engine.device,
        )
        # The starting policy, for a KL term or reference logprobs; KD's teacher (whose head only gives logits).
        self.reference, self.reference_head = frozen(model_path) if spec.reference_model else (None, None)
        self.teacher = frozen(resolve_model(spec.teacher))[0] if spec.teacher else None
        # A mixture of experts: its training forwards' routing, counted, and its load-balancing loss (training/routing.py)
        self.routing = None
        if family and family.router:
            policy = self._policy()
            coef = policy.config.get_text_config().router_aux_loss_coef if spec.model.router_aux_loss else None
            self.routing = RouterRecord(policy, family.router, coef, replay=spec.router_replay)
        torch.manual_seed(spec.train.seed + rank)  # per-rank stream for dropout

    # -- training ---------------------------------------------------------------

    def train_step(
        self,
        micro_batches: list[dict],
        loss: BatchLoss,
        args: LossArgs,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> dict:
        """One optimizer step over this rank's micro-batches with an algorithm's loss (`Algorithm.loss`).

        `args` carry the global batch's normalisers (tokens, sequences), so the
        summed micro-batch losses are the loss of the whole batch.
        """
        self.engine.train()
        lr = self.engine.get_lr()[0]  # the rate this step uses; the schedule advances in step()
        # DeepSpeed divides by grad_accum and averages over ranks; undo both so the
        # gradient is that of the global-batch loss.
        scale = self.engine.gradient_accumulation_steps() * self.engine.world_size
        # Sums stay 0-d tensors on the device, read once at the end: each read would wait for the GPU's queue to drain.
        loss_sum, sums = 0.0, {}
        entropy_grad = args.entropy_grad  # PPO's entropy bonus needs the entropy's gradient; the others only report it
        if self.routing:
            self.routing.start_step()
        for batch in micro_batches:
            batch = self._to_device(batch)
            mask = None if self.packed else batch["attention_mask"]  # a packed row holds tokens only
            routes = batch.get("routes")  # the engine's, where the samples carry them
            with self.routing.recording(mask, routes) if self.routing else nullcontext([]) as balancing:
                outputs = self._forward(
                    batch, temperature, entropy="grad" if entropy_grad else "metric" if with_entropy else None
                )
            micro_loss, metrics = loss(outputs, batch, args)
            objective = micro_loss
            if self.routing and self.routing.aux_loss_coef is not None:  # its mean over the global batch's forwards
                share = self.routing.aux_loss_coef / (len(micro_batches) * self.engine.world_size)
                objective = micro_loss + share * balancing[0]
            self.engine.backward(objective * scale)
            self.engine.step()
            loss_sum = loss_sum + micro_loss.detach()
            if with_entropy:
                metrics["entropy_sum"] = (outputs["entropy"].detach() * batch["response_mask"]).sum()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        grad_norm = self.engine.get_global_grad_norm()
        result = {
            "loss": float(loss_sum),
            **{key: float(value) for key, value in sums.items()},
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "lr": lr,
        }
        if self.routing:
            result |= self.routing.step_metrics()
        if torch.cuda.is_available():
            result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        return result

    @torch.no_grad()
    def eval_metrics(self, micro_batches: list[dict], loss: BatchLoss, args: LossArgs) -> dict:
        """The loss's metric sums over held-out micro-batches, without updating anything."""
        self.engine.eval()
        sums = {}
        for batch in micro_batches:
            batch = self._to_device(batch)
            _, metrics = loss(self._forward(batch), batch, args)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        return {key: float(value) for key, value in sums.items()}

    def token_logprobs(
        self, micro_batches: list[dict], temperature: float = 1.0, reference: bool = False
    ) -> list[torch.Tensor]:
        """Per-token logprobs [B, T-1] of each micro-batch under the current weights, or the frozen reference's."""
        outputs = self._forwards_without_grad(micro_batches, temperature, reference)
        return [
            o["logprobs"].cpu() for o in outputs
        ]  # after every forward is queued: a copy to the CPU waits for the GPU

    def logprobs_and_values(
        self, micro_batches: list[dict], temperature: float = 1.0
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """PPO: per-token logprobs and the critic's values, both [B, T-1], of each micro-batch from the same forward."""
        outputs = self._forwards_without_grad(micro_batches, temperature)
        return [(o["logprobs"].cpu(), o["values"].float().cpu()) for o in outputs]

    @torch.no_grad()
    def _forwards_without_grad(
        self, micro_batches: list[dict], temperature: float, reference: bool = False
    ) -> list[dict]:
        """`_forward`'s outputs for each micro-batch, from forwards of `train.logprobs_micro_batch_size` sequences:
        that many micro-batches' worth joined into one (right-padded to the longest), the outputs cut back. Counted in
        micro-batches, not rows, so that every rank runs as many forwards (ZeRO-3 gathers in each) when a last
        micro-batch is short on one rank only."""
        self.engine.eval()
        train = self.spec.train
        if train.logprobs_micro_batch_size:
            per_forward = train.logprobs_micro_batch_size // train.micro_batch_size
        else:  # 4 where a training micro-batch keeps every layer's activations and no [B, T, V] logits are made
            fused = (self.reference_head if reference else self.policy_head) is not None and self.teacher is None
            per_forward = 4 if fused and not self.spec.model.gradient_checkpointing else 1
        outputs = []
        for first in range(0, len(micro_batches), per_forward):
            group = micro_batches[first : first + per_forward]
            longest = max(b["input_ids"].shape[1] for b in group)  # the others right-padded to it (attention_mask 0)
            joined = {
                key: torch.cat([torch.nn.functional.pad(b[key], (0, longest - b[key].shape[1])) for b in group])
                for key in ("input_ids", "attention_mask")
            }
            if "routes" in group[0]:  # [B, T, L, k], padded with "none recorded"
                joined["routes"] = torch.cat(
                    [
                        torch.nn.functional.pad(b["routes"], (0, 0, 0, 0, 0, longest - b["routes"].shape[1]), value=-1)
                        for b in group
                    ]
                )
            if any("media" in b for b in group):
                joined |= {
                    "media": [item for b in group for item in b.get("media", [])],
                    "media_counts": torch.cat(
                        [b.get("media_counts", torch.zeros(len(b["input_ids"]), dtype=torch.long)) for b in group]
                    ),
                }
            joined = self._to_device(joined)
            # a forward without gradients counts nothing: its routers need hooks only to take the engine's routes
            replay = self.routing and self.routing.replay and "routes" in joined and not reference
            with self.routing.recording(None, joined["routes"], count=False) if replay else nullcontext():
                output = self._forward(joined, temperature, reference=reference)
            start = 0
            for batch in group:
                size, length = batch["input_ids"].shape
                outputs.append({key: value[start : start + size, : length - 1] for key, value in output.items()})
                start += size
        return outputs

    def _to_device(self, batch: dict) -> dict:
        """The micro-batch on this rank's device; packed, with its model inputs under "packed", built here on the CPU
        (their shapes depend on the data: on the GPU, building them would wait for its queue to drain); its media
        as what the model reads beside the tokens, under "media_inputs" (`MediaPolicy.model_inputs`)."""
        if "media" in batch:
            inputs = media_policy(self.model_path).model_inputs(
                batch["input_ids"], batch["media"], batch["media_counts"].tolist()
            )
            batch = {k: v for k, v in batch.items() if k not in ("media", "media_counts")} | {"media_inputs": inputs}
        if self.packed:
            batch = batch | {
                "packed": pack(batch["input_ids"], batch["attention_mask"]),
                "unpacking": unpacking(batch["attention_mask"]),
            }
        if "routes" in batch:  # [B, T, L, k] -> the routers' token rows [N, L, k]: the packed row's, or every position
            routes = batch["routes"]
            batch = batch | {"routes": routes[batch["attention_mask"].bool()] if self.packed else routes.flatten(0, 1)}
        return _moved(batch, self.engine.device)

    def _forward(
        self, batch: dict, temperature: float = 1.0, entropy: str | None = None, reference: bool = False
    ) -> dict:
        """Prediction-aligned [B, T-1] tensors: `logprobs` of the batch's tokens (the frozen reference's with
        `reference`); `values` (the critic's estimate of the state before each token) when the model has a value head;
        the policy's `entropy` at each position when asked, with its gradient (`grad`) or as a metric (`metric`). KD
        adds both models' `logits` [B, T-1, V]; a reward model gives only its `scores` [B]."""
        model, head = (self.reference, self.reference_head) if reference else (self.engine, self.policy_head)
        inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        if self.reward_model:
            return {"scores": model(**inputs).logits[:, 0]}  # [B]
        if self.packed:  # one row [1, N] of the real tokens; what comes out goes back to the padded layout
            inputs = batch["packed"] | {"use_cache": False}
        targets = inputs["input_ids"]  # the tokens scored; a multimodal model reads them with its media
        if "media_inputs" in batch:  # pixel values and audio features in the model's dtype
            inputs |= {k: v.to(self._dtype) if v.is_floating_point() else v for k, v in batch["media_inputs"].items()}
        padded = partial(unpack, layout=batch["unpacking"]) if self.packed else lambda x: x
        # The fused head gives the logprobs where the model's logits would be, never making them. The logits stay
        # where it cannot: KD, whose loss needs the student's full logits anyway, and output layers other than a
        # bias-free linear one (a LoRA adapter on lm_head), which have no LogprobsHead.
        fused = head is not None and self.teacher is None
        with head.scoring(targets, temperature, entropy is not None) if fused else nullcontext():
            output = model(**inputs)
        # what the output layer gave (PPO's value head returns it beside the values)
        head_output, values = output if isinstance(output, tuple) else (output.logits, None)
        if fused:
            logprobs, entropy_values = head_output  # [B, T-1] each (packed: [1, N-1]), the entropy None unless asked
        elif entropy is not None:
            logprobs, entropy_values = token_logprobs_and_entropy(head_output, targets, temperature)
        else:
            logprobs = token_logprobs(head_output, targets, temperature)
        outputs = {"logprobs": padded(logprobs)}
        if entropy is not None:  # from the logprobs' own softmax; only PPO's bonus needs its gradient
            outputs["entropy"] = padded(entropy_values if entropy == "grad" else entropy_values.detach())
        if values is not None:
            outputs["values"] = padded(values[:, :-1])
        if self.teacher is not None and not reference:  # KD: both full distributions, [B, T-1, V]
            with torch.no_grad():
                teacher_logits = self.teacher(**inputs).logits
            # Same tokenizer (checked at load), but embedding tables may be padded to different sizes.
            vocab = min(head_output.shape[-1], teacher_logits.shape[-1])
            outputs |= {
                "logits": padded(head_output[:, :-1, :vocab]),
                "teacher_logits": padded(teacher_logits[:, :-1, :vocab]),
            }
        return outputs

    def _policy(self):
        """The language model itself (a PeftModel with LoRA), without PPO's value head."""
        return self.engine.module.policy if self.critic else self.engine.module


def join_ranks(spec: TrainerSpec, rank: int, world_size: int, master: tuple[str, int], on_gpu: bool) -> None:
    """This process as rank `rank` of the training ranks' process group (NCCL on GPUs, gloo on the CPU)."""
    # DeepSpeed reads these even for one process (otherwise it looks for MPI).
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0", MASTER_ADDR=master[0], MASTER_PORT=str(master[1])
    )
    if not on_gpu:
        # Ranks share the cores; without this each takes them all and they thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    import deepspeed

    # The shared-memory all-reduce op compiles for a minute and training does not need it.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(
        dist_backend="nccl" if on_gpu else "gloo", timeout=collective_timeout(spec.hang_timeout_s)
    )


def _moved(value, device: torch.device):
    """Tensors (in nested dicts and tuples too) onto `device`; to a GPU from pinned memory without blocking: a copy from pageable
    memory waits for everything queued on the GPU first."""
    if isinstance(value, dict):
        return {key: _moved(v, device) for key, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_moved(v, device) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    return value.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else value.to(device)
