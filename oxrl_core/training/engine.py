"""One DeepSpeed rank: the model, its optimizer and schedule, and what a loop asks of it.

`TrainEngine` runs inside a Ray actor (see `group.py`); every public method is
called on all ranks at once because ZeRO needs every rank for a forward,
a step, a gather or a checkpoint.
"""

import datetime
import importlib
import inspect
import os
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

from oxrl_core.algs.registry import BATCH_LOSSES, SL_ALGORITHMS
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.data.images import vision_inputs
from oxrl_core.models.hub import is_vision_language, resolve_model
from oxrl_core.models.value_head import VALUE_HEAD_FILE, PolicyWithValueHead
from oxrl_core.placement.transport import WeightChannel, WeightSpec, buckets, gpu_uuid, share_over_ipc
from oxrl_core.placement.watch import collective_timeout, dump_stacks_on_request
from oxrl_core.training.fused_head import LogprobsHead
from oxrl_core.training.logprobs import token_logprobs, token_logprobs_and_entropy
from oxrl_core.training.packing import ATTENTION as PACKED_ATTENTION, VISION_ATTENTION, pack, unpack, unpacking


def deepspeed_config(config: SLConfig | RLConfig) -> dict:
    train, ds = config.train, config.deepspeed
    zero: dict = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    zero |= ds.zero_optimization
    bf16 = {"enabled": model_dtype(config) == torch.bfloat16}
    if isinstance(config, RLConfig):
        # bf16 needs no loss scale, yet DeepSpeed checks every gradient for overflow at each step (per parameter, then
        # a read on the host): 2-5% of a training step on one GPU (benchmarks/RESULTS.md). The RL loop stops on a
        # non-finite gradient norm after the update, which DeepSpeed reports either way; the SL loop relies on
        # DeepSpeed skipping such a step instead, so there the check stays.
        bf16["check_grad_overflow"] = False
    return {
        "train_batch_size": train.batch_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": zero,
        "bf16": bf16,
        "fp16": {"enabled": model_dtype(config) == torch.float16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer (on by default) synchronizes the device in every forward and step: each
        # micro-batch then waits for the GPU to drain its queue and the GPU for the host's next launches.
        "timers": {"throughput": {"enabled": False}},
    }


def needs_reference_model(config: SLConfig | RLConfig) -> bool:
    """Whether a frozen copy of the starting model runs beside the policy at every step. SPIN's reference
    moves (the model at each iteration's start), so its logprobs are always computed ahead instead."""
    if isinstance(config, RLConfig):
        return config.train.kl_coeff > 0
    alg = config.train.alg
    return alg == "online-dpo" or (SL_ALGORITHMS[alg].reference and alg != "spin" and config.train.reference == "model")


def compiles_layers(config: SLConfig | RLConfig, on_gpu: bool) -> bool:
    """`model.compile`; `auto` where it was measured to pay: on GPUs, ZeRO-3 included (one graph per pass once
    torch's linear is back in place, `torch_linear`: the train pass 1.2x faster than eager on 2 H200s,
    benchmarks/RESULTS.md, "Two GPUs")."""
    if config.model.compile == "auto":
        return on_gpu
    return config.model.compile


def model_dtype(config: SLConfig | RLConfig) -> torch.dtype:
    if config.model.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, config.model.dtype)


class TrainEngine:
    def __init__(self, config: SLConfig | RLConfig, model_path: str, rank: int, world_size: int, master: tuple[str, int],
                 log_dir: Path):
        """`master`: the address and a free port of rank 0's node, where the ranks meet."""
        redirect_output(log_dir / f"rank{rank}.log")
        on_gpu = torch.cuda.is_available()
        # DeepSpeed reads these even for one process (otherwise it looks for MPI).
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                          MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        if not on_gpu:
            # Ranks share the cores; without this each takes them all and they thrash.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        import deepspeed
        from transformers import AutoImageProcessor, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification
        from transformers.integrations import HfDeepSpeedConfig

        # The shared-memory all-reduce op compiles for a minute and training does not need it.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", timeout=collective_timeout(config.run.hang_timeout_s))

        self.config, self.rank, self._dtype = config, rank, model_dtype(config)
        self.zero3 = config.deepspeed.zero_stage == 3
        ds_config = deepspeed_config(config)
        # Kept alive so from_pretrained builds ZeRO-3 models already partitioned.
        self._hf_ds_config = HfDeepSpeedConfig(ds_config) if self.zero3 else None
        torch.manual_seed(config.train.seed)
        # A reward model is the backbone with a scalar head, saved as a sequence classifier: it loads with
        # AutoModelForSequenceClassification anywhere, which pools at the last non-pad token (so it runs padded).
        self.reward_model = isinstance(config, SLConfig) and config.train.alg == "rm"
        # A vision-language model: its image processor makes each micro-batch's pixel values (data/images.py)
        self.vision = is_vision_language(model_path)
        self.image_processor = AutoImageProcessor.from_pretrained(model_path) if self.vision else None
        # Packed rows would need M-RoPE's 3-D positions per packed sequence: vision-language models run padded.
        self.packed = config.model.attn_implementation == "varlen" and not self.reward_model and not self.vision
        language_model = AutoModelForImageTextToText if self.vision else AutoModelForCausalLM
        attention = PACKED_ATTENTION if self.packed else config.model.attn_implementation.replace("varlen", "sdpa")
        load = dict(dtype=self._dtype, attn_implementation=attention, trust_remote_code=config.model.trust_remote_code)
        if self.reward_model:
            from oxrl_core.loops.run_folder import load_tokenizer

            model = AutoModelForSequenceClassification.from_pretrained(
                model_path, num_labels=1, pad_token_id=load_tokenizer(model_path)[1], **load)
        else:
            model = language_model.from_pretrained(model_path, **load)
        if self.vision:
            self.image_token_id = model.config.image_token_id
            tower = vision_tower(model)
            # Towers whose blocks attend within boundaries (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: `cu_seqlens`): all images'
            # (and windows') patches in one variable-length attention call per block
            if any("cu_seqlens" in inspect.signature(m.forward).parameters for m in tower.modules()):
                tower.config._attn_implementation = VISION_ATTENTION
            if config.model.freeze_vision:
                tower.requires_grad_(False)
        if self.zero3:
            rope_in_float32(model)
            torch_linear()
        if config.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        if config.lora.enabled:
            from peft import LoraConfig, get_peft_model

            # Frozen embeddings would cut the checkpointed graph, and ZeRO-3 gathers a leaf block's weights for its
            # backward only when the block's input takes a gradient (gather_by_block)
            if config.model.gradient_checkpointing or self.zero3:
                model.enable_input_require_grads()
            lora = config.lora
            # SEQ_CLS also trains (and saves) the reward model's new scalar head in full
            model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                     target_modules=lora.target_modules,
                                                     task_type="SEQ_CLS" if self.reward_model else "CAUSAL_LM"))
        causal_lm = model.get_base_model() if config.lora.enabled else model  # the Hugging Face model, adapters in it
        if compiles_layers(config, on_gpu):
            compile_blocks(causal_lm, self.vision, self.zero3)
        if self.zero3:
            gather_by_block(causal_lm)
        # The policy's logprobs come from its output layer without logits [B, T, V] (fused_head.py); in place before
        # DeepSpeed wraps the model, so that its ZeRO-3 hooks gather the weight around the fused op.
        self.policy_head = LogprobsHead.replace_output_layer(causal_lm)
        self.critic = isinstance(config, RLConfig) and config.train.alg == "ppo"
        if self.critic:
            model = PolicyWithValueHead(model, model.config.get_text_config().hidden_size, model_dtype(config))
        train = config.train
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=trainable,
            optimizer=lambda params: _adamw(params, train.lr, train.weight_decay, on_gpu, config.deepspeed.offload_optimizer),
            lr_scheduler=lambda opt: _scheduler(opt, train.lr_scheduler, train.warmup_steps, train.steps),
            config=ds_config,
        )

        def frozen(path: str) -> tuple:
            """A model that only runs forwards, and its LogprobsHead (or None); under ZeRO-3 sharded like the policy."""
            model = language_model.from_pretrained(path, **load).eval()
            model.requires_grad_(False)
            head = LogprobsHead.replace_output_layer(model)
            if self.zero3:
                rope_in_float32(model)
                torch_linear()
                gather_by_block(model)
                model = deepspeed.initialize(model=model, config=ds_config)[0]
            return model.to(self.engine.device), head

        # The starting policy, for a KL term or reference logprobs; KD's teacher (whose head only gives logits).
        self.reference, self.reference_head = frozen(model_path) if needs_reference_model(config) else (None, None)
        self.teacher = frozen(resolve_model(config.train.teacher))[0] if isinstance(config, SLConfig) and config.train.alg == "kd" else None
        torch.manual_seed(train.seed + rank)  # per-rank stream for dropout

    # -- training ---------------------------------------------------------------

    def train_step(self, micro_batches: list[dict], alg: str, loss_kwargs: dict, temperature: float = 1.0,
                   with_entropy: bool = False) -> dict:
        """One optimizer step over this rank's micro-batches with the loss of `alg`.

        `loss_kwargs` carry the global batch's normalisers (tokens, sequences), so the
        summed micro-batch losses are the loss of the whole batch.
        """
        self.engine.train()
        lr = self.engine.get_lr()[0]  # the rate this step uses; the schedule advances in step()
        batch_loss = BATCH_LOSSES[alg]
        # DeepSpeed divides by grad_accum and averages over ranks; undo both so the
        # gradient is that of the global-batch loss.
        scale = self.engine.gradient_accumulation_steps() * self.engine.world_size
        # Sums stay 0-d tensors on the device, read once at the end: each read would wait for the GPU's queue to drain.
        loss_sum, sums = 0.0, {}
        # PPO's entropy bonus needs the entropy's gradient; the others only report it.
        entropy_grad = loss_kwargs.get("entropy_coeff", 0.0) > 0
        for batch in micro_batches:
            batch = self._to_device(batch)
            outputs = self._forward(batch, temperature, entropy="grad" if entropy_grad else "metric" if with_entropy else None)
            loss, metrics = batch_loss(outputs, batch, **loss_kwargs)
            self.engine.backward(loss * scale)
            self.engine.step()
            loss_sum = loss_sum + loss.detach()
            if with_entropy:
                metrics["entropy_sum"] = (outputs["entropy"].detach() * batch["response_mask"]).sum()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        grad_norm = self.engine.get_global_grad_norm()
        result = {"loss": float(loss_sum), **{key: float(value) for key, value in sums.items()},
                  "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"), "lr": lr}
        if torch.cuda.is_available():
            result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        return result

    @torch.no_grad()
    def eval_metrics(self, micro_batches: list[dict], alg: str, loss_kwargs: dict) -> dict:
        """The loss's metric sums over held-out micro-batches, without updating anything."""
        self.engine.eval()
        sums = {}
        for batch in micro_batches:
            batch = self._to_device(batch)
            _, metrics = BATCH_LOSSES[alg](self._forward(batch), batch, **loss_kwargs)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        return {key: float(value) for key, value in sums.items()}

    def token_logprobs(self, micro_batches: list[dict], temperature: float = 1.0, reference: bool = False) -> list[torch.Tensor]:
        """Per-token logprobs [B, T-1] of each micro-batch under the current weights, or the frozen reference's."""
        outputs = self._forwards_without_grad(micro_batches, temperature, reference)
        return [o["logprobs"].cpu() for o in outputs]  # after every forward is queued: a copy to the CPU waits for the GPU

    def logprobs_and_values(self, micro_batches: list[dict], temperature: float = 1.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """PPO: per-token logprobs and the critic's values, both [B, T-1], of each micro-batch from the same forward."""
        outputs = self._forwards_without_grad(micro_batches, temperature)
        return [(o["logprobs"].cpu(), o["values"].float().cpu()) for o in outputs]

    @torch.no_grad()
    def _forwards_without_grad(self, micro_batches: list[dict], temperature: float, reference: bool = False) -> list[dict]:
        """`_forward`'s outputs for each micro-batch, from forwards of `train.logprobs_micro_batch_size` sequences:
        that many micro-batches' worth joined into one (right-padded to the longest), the outputs cut back. Counted in
        micro-batches, not rows, so that every rank runs as many forwards (ZeRO-3 gathers in each) when a last
        micro-batch is short on one rank only."""
        self.engine.eval()
        train = self.config.train
        if train.logprobs_micro_batch_size:
            per_forward = train.logprobs_micro_batch_size // train.micro_batch_size
        else:  # 4 where a training micro-batch keeps every layer's activations and no [B, T, V] logits are made
            fused = (self.reference_head if reference else self.policy_head) is not None and self.teacher is None
            per_forward = 4 if fused and not self.config.model.gradient_checkpointing else 1
        outputs = []
        for first in range(0, len(micro_batches), per_forward):
            group = micro_batches[first:first + per_forward]
            longest = max(b["input_ids"].shape[1] for b in group)  # the others right-padded to it (attention_mask 0)
            joined = {key: torch.cat([torch.nn.functional.pad(b[key], (0, longest - b[key].shape[1])) for b in group])
                      for key in ("input_ids", "attention_mask")}
            if any("images" in b for b in group):
                joined |= {"images": [image for b in group for image in b.get("images", [])],
                           "image_counts": torch.cat([b.get("image_counts", torch.zeros(len(b["input_ids"]), dtype=torch.long))
                                                      for b in group])}
            output = self._forward(self._to_device(joined), temperature, reference=reference)
            start = 0
            for batch in group:
                size, length = batch["input_ids"].shape
                outputs.append({key: value[start:start + size, :length - 1] for key, value in output.items()})
                start += size
        return outputs

    def _to_device(self, batch: dict) -> dict:
        """The micro-batch on this rank's device; packed, with its model inputs under "packed", built here on the CPU
        (their shapes depend on the data: on the GPU, building them would wait for its queue to drain); its images
        as the model's inputs (`vision_inputs`)."""
        if "images" in batch:
            batch = {k: v for k, v in batch.items() if k not in ("images", "image_counts")} | vision_inputs(
                batch, self.image_processor, self.image_token_id)
        if self.packed:
            batch = batch | {"packed": pack(batch["input_ids"], batch["attention_mask"]),
                             "unpacking": unpacking(batch["attention_mask"])}
        return _moved(batch, self.engine.device)

    def _forward(self, batch: dict, temperature: float = 1.0, entropy: str | None = None, reference: bool = False) -> dict:
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
        targets = inputs["input_ids"]  # the tokens scored; a vision-language model reads them with its images
        if "pixel_values" in batch:
            inputs |= {"input_ids": batch["model_input_ids"], "pixel_values": batch["pixel_values"].to(self._dtype),
                       "image_grid_thw": batch["image_grid_thw"], "mm_token_type_ids": batch["mm_token_type_ids"]}
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
            outputs |= {"logits": padded(head_output[:, :-1, :vocab]), "teacher_logits": padded(teacher_logits[:, :-1, :vocab])}
        return outputs

    # -- checkpoints ------------------------------------------------------------

    def save_checkpoint(self, ds_dir: Path, tag: str) -> None:
        """Optimizer, schedule, weights (DeepSpeed's format) and this rank's RNG state."""
        self.engine.save_checkpoint(str(ds_dir), tag=tag, save_latest=False)
        torch.save(_rng_state(), ds_dir / tag / f"rng_rank{self.rank}.pt")

    def load_checkpoint(self, ds_dir: Path, tag: str) -> None:
        path, _ = self.engine.load_checkpoint(str(ds_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint {tag} in {ds_dir}")
        _set_rng_state(torch.load(ds_dir / tag / f"rng_rank{self.rank}.pt", weights_only=False))

    def save_hf(self, out_dir: Path, tokenizer_dir: str) -> None:
        """A Hugging Face folder (safetensors + tokenizer); with LoRA, the adapter only; PPO's value head beside it."""
        state = self._gathered(trainable_only=self.config.lora.enabled)  # with LoRA the base is unchanged
        if self.rank == 0:
            from safetensors.torch import save_file
            from transformers import AutoProcessor, AutoTokenizer

            policy_state = {name.removeprefix("policy."): t for name, t in state if not name.startswith("value_head.")}
            self._policy().save_pretrained(out_dir, state_dict=policy_state, safe_serialization=True)
            if self.critic:
                save_file({n.removeprefix("value_head."): t for n, t in state if n.startswith("value_head.")}, out_dir / VALUE_HEAD_FILE)
            # a vision-language model's processor: the tokenizer, the image processor and the chat template
            (AutoProcessor if self.vision else AutoTokenizer).from_pretrained(tokenizer_dir).save_pretrained(out_dir)
        torch.distributed.barrier()

    # -- weights for the vLLM engines (placement/transport.py) -----------------------------------

    def weight_plan(self) -> list[WeightSpec]:
        """What `refresh_weights` yields, in order: the policy's weights under their Hugging Face names, with
        LoRA merged (vLLM serves plain weights, no adapter machinery, and needs no restart)."""
        return [WeightSpec(_served_name(name), tuple(getattr(param, "ds_shape", param.shape)), str(param.dtype).removeprefix("torch."))
                for name, param in self._refreshed_parameters()]

    def _refreshed_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The policy's parameters the engines take at a refresh: all but the LoRA factors (merged into their base
        layer's weight) and a frozen vision tower (the engines loaded it from the same folder)."""
        policy = self._policy()
        frozen = {id(p) for p in vision_tower(policy).parameters()} if self.vision and self.config.model.freeze_vision else set()
        return ((name, param) for name, param in policy.named_parameters()
                if not _is_lora_factor(name) and id(param) not in frozen)

    def refresh_weights(self, materialize: bool) -> Iterator[tuple[str, torch.Tensor | None]]:
        """The `weight_plan` weights, whole, one at a time (every rank must iterate: under ZeRO-3 each is gathered
        from all of them). With `materialize` each comes as a tensor valid until the next one (with LoRA, W + scale
        * B A, peft's own delta); without, as None."""
        import deepspeed

        policy = self._policy()
        for name, param in self._refreshed_parameters():
            lora_layer = policy.get_submodule(name.split(".base_layer.")[0]) if ".base_layer.weight" in name else None
            params = [param, *lora_layer.lora_A.parameters(), *lora_layer.lora_B.parameters()] if lora_layer else [param]
            with deepspeed.zero.GatheredParameters(params, enabled=self.zero3):
                weight = None
                if materialize:
                    weight = param.detach() if lora_layer is None else merged_lora_weight(param, lora_layer)
                yield _served_name(name), weight

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

    def open_weight_channel(self, address: str, port: int, world: int, bucket_bytes: int, timeout: datetime.timedelta) -> None:
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

    def _policy(self):
        """The language model itself (a PeftModel with LoRA), without PPO's value head."""
        return self.engine.module.policy if self.critic else self.engine.module

    def _gathered(self, trainable_only: bool) -> list[tuple[str, torch.Tensor]]:
        """(name, full tensor) on rank 0. Under ZeRO-3 each rank holds a shard of every
        parameter: gather them one at a time (every rank must join) and copy to CPU."""
        import deepspeed

        pairs = []
        for name, param in self.engine.module.named_parameters():
            if trainable_only and not param.requires_grad:
                continue
            with deepspeed.zero.GatheredParameters([param], enabled=self.zero3):
                if self.rank == 0:
                    pairs.append((name, param.detach().to("cpu", copy=True)))
        return pairs


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision encoder (with its merger into the language model's width) of a vision-language model."""
    inner = getattr(model, "model", model)
    for name in ("visual", "vision_tower", "vision_model"):
        if hasattr(inner, name):
            return getattr(inner, name)
    raise ValueError(f"{type(model).__name__}: no vision tower found (visual, vision_tower or vision_model)")


def compile_blocks(model: torch.nn.Module, vision: bool = False, zero3: bool = False) -> None:
    """Regional compilation: torch.compile (inductor) each of the model's repeated blocks, the decoder layers its
    `_no_split_modules` names. They share one compiled code (torch >= 2.5 does not specialise it on the module
    instance), so a first step compiles one layer, not the whole model; a model naming no block is compiled whole.
    A vision tower's blocks stay eager: their attention splits the patches per image and window at lengths read to the
    host (`.tolist()`), which the compiler unrolls and specialises on, recompiling for every batch of images.
    Under ZeRO-3 only each block's `forward` is compiled: compiling its whole call would trace DeepSpeed's gather and
    release hooks, which read each module's and parameter's `ds_id`, and the compiler, guarding on those numbers,
    recompiled for every layer until its limit of 8 and ran the other layers eager (slower than all eager)."""
    eager = {id(m) for m in vision_tower(model).modules()} if vision else set()
    for block in [m for m in repeated_blocks(model) if id(m) not in eager] or [model]:
        if zero3:
            block.forward = torch.compile(block.forward)
        else:
            block.compile()


def gather_by_block(model: torch.nn.Module) -> None:
    """ZeRO-3: each repeated block one leaf module, its weights gathered and released once per call instead of around
    each of its linear layers: the hooks of a 0.5B model's 290 tensors per micro-batch become 24 of its layers'
    (host time per micro-batch: benchmarks/probes/host_overhead.py, variants zero3 and zero3+leaf)."""
    from deepspeed.utils import set_z3_leaf_modules

    blocks = repeated_blocks(model)
    if blocks:
        set_z3_leaf_modules(model, sorted({type(b) for b in blocks}, key=lambda t: t.__name__))


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the modules of the classes its `_no_split_modules` names (decoder layers, vision
    blocks)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


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


def _is_lora_factor(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def _served_name(name: str) -> str:
    """peft's parameter name as the base model (and vLLM) calls it."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def merged_lora_weight(weight: torch.Tensor, lora_layer) -> torch.Tensor:
    """W + scale * B A for each active adapter (peft's own delta), as a plain tensor: A and B require grad, and a
    tensor with autograd history cannot cross processes (CUDA IPC's `reduce_tensor` refuses it)."""
    with torch.no_grad():
        return weight + sum(lora_layer.get_delta_weight(a) for a in lora_layer.active_adapters)


def rope_in_float32(model: torch.nn.Module) -> None:
    """Rebuild each rotary embedding's buffers in float32. ZeRO-3 builds a model partitioned (zero.Init), which makes
    every floating tensor created in a module's __init__ bf16, RoPE's inverse frequencies too: made there and never
    loaded from a checkpoint, they come out up to 0.6% off (Qwen2.5's: angles off by up to 0.74 rad at position 639).
    Transformers' rotary modules take their config alone; rebuilt here, outside zero.Init, they compute in float32.
    Known upstream since 2024 (DeepSpeed issue 4932, transformers issue 28596), still so in DeepSpeed 0.19."""
    for module in model.modules():
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor) and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for name, buffer in fresh.named_buffers(recurse=False):
                setattr(module, name, buffer.to(module.inv_freq.device))


def torch_linear() -> None:
    """Give `torch.nn.functional.linear` back to torch. DeepSpeed's zero.Init, which builds a ZeRO-3 model, replaces it
    for the whole process with an autograd function whose backward gathers a weight still partitioned then (it reads the
    weight's `ds_id`). oxrl gathers each repeated block's weights for its backward anyway (gather_by_block), and other
    modules' by DeepSpeed's hooks. With that function, the compiler of torch 2.11 guarded on each weight's `ds_id` in
    every compiled layer and recompiled for each layer until its limit of 8, the rest eager (benchmarks/RESULTS.md,
    "Two GPUs")."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as zero_init

    torch.nn.functional.linear = getattr(zero_init, "linear_bk", torch.nn.functional.linear)


def _adamw(params, lr: float, weight_decay: float, on_gpu: bool, offloaded: bool) -> torch.optim.Optimizer:
    """AdamW. Under ZeRO-Offload, where the optimizer states and the update live in CPU memory, DeepSpeed's CPU Adam
    (vectorised; DeepSpeed refuses another optimizer there; its op compiles on first use, about a minute); else
    torch's, fused on GPUs."""
    if offloaded:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=on_gpu)


def _scheduler(optimizer, name: str, warmup_steps: int, steps: int):
    from transformers import get_scheduler

    name = "constant_with_warmup" if name == "constant" else name
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=steps)


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def redirect_output(path: Path) -> None:
    """Send this process's stdout/stderr (DeepSpeed is chatty) to a per-rank log in the run folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    dump_stacks_on_request(path)  # an actor's process: the driver asks for its stacks when it hangs
