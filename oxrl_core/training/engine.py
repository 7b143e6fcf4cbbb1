"""One DeepSpeed rank: the model, its optimizer and schedule, and what a loop asks of it.

`TrainEngine` runs inside a Ray actor (see `group.py`); every public method is
called on all ranks at once because ZeRO needs every rank for a forward,
a step, a gather or a checkpoint.
"""

import importlib
import os
import sys
from pathlib import Path

import torch

from oxrl_core.algs.sft import sft_loss
from oxrl_core.config.schema import SLConfig
from oxrl_core.training.logprobs import token_logprobs


def deepspeed_config(config: SLConfig) -> dict:
    train, ds = config.train, config.deepspeed
    zero: dict = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_batch_size": train.batch_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": model_dtype(config) == torch.bfloat16},
        "fp16": {"enabled": model_dtype(config) == torch.float16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def model_dtype(config: SLConfig) -> torch.dtype:
    if config.model.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, config.model.dtype)


class TrainEngine:
    def __init__(self, config: SLConfig, model_path: str, rank: int, world_size: int, master_port: int, log_dir: Path):
        _redirect_output(log_dir / f"rank{rank}.log")
        on_gpu = torch.cuda.is_available()
        # DeepSpeed reads these even for one process (otherwise it looks for MPI).
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
        if not on_gpu:
            # Ranks share the cores; without this each takes them all and they thrash.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        import deepspeed
        from transformers import AutoModelForCausalLM
        from transformers.integrations import HfDeepSpeedConfig

        # The shared-memory all-reduce op compiles for a minute and training does not need it.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")

        self.config, self.rank = config, rank
        self.zero3 = config.deepspeed.zero_stage == 3
        ds_config = deepspeed_config(config)
        # Kept alive so from_pretrained builds ZeRO-3 models already partitioned.
        self._hf_ds_config = HfDeepSpeedConfig(ds_config) if self.zero3 else None
        torch.manual_seed(config.train.seed)
        model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=model_dtype(config), attn_implementation=config.model.attn_implementation,
            trust_remote_code=config.model.trust_remote_code,
        )
        if config.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        if config.lora.enabled:
            from peft import LoraConfig, get_peft_model

            if config.model.gradient_checkpointing:
                model.enable_input_require_grads()  # frozen embeddings would cut the checkpointed graph
            lora = config.lora
            model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                     target_modules=lora.target_modules, task_type="CAUSAL_LM"))
        train = config.train
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=trainable,
            optimizer=lambda params: torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay),
            lr_scheduler=lambda opt: _scheduler(opt, train.lr_scheduler, train.warmup_steps, train.steps),
            config=ds_config,
        )
        torch.manual_seed(train.seed + rank)  # per-rank stream for dropout

    # -- training ---------------------------------------------------------------

    def train_step(self, micro_batches: list[dict], num_tokens: float) -> dict:
        """One optimizer step over this rank's micro-batches; `num_tokens` counts the global batch's response tokens."""
        self.engine.train()
        lr = self.engine.get_lr()[0]  # the rate this step uses; the schedule advances in step()
        nll_sum = tokens = 0.0
        # DeepSpeed divides by grad_accum and averages over ranks; undo both so the
        # gradient is that of (sum of all response-token NLL) / num_tokens.
        scale = self.engine.gradient_accumulation_steps() * self.engine.world_size
        for batch in micro_batches:
            logprobs = self._logprobs(batch)
            loss, metrics = sft_loss(logprobs, batch["response_mask"].to(logprobs.device), num_tokens)
            self.engine.backward(loss * scale)
            self.engine.step()
            nll_sum += metrics["nll_sum"]
            tokens += metrics["tokens"]
        grad_norm = self.engine.get_global_grad_norm()
        return {"nll_sum": nll_sum, "tokens": tokens, "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                "lr": lr}

    @torch.no_grad()
    def eval_nll(self, micro_batches: list[dict]) -> dict:
        self.engine.eval()
        nll_sum = tokens = 0.0
        for batch in micro_batches:
            logprobs = self._logprobs(batch)
            mask = batch["response_mask"].to(logprobs.device)
            nll_sum += -(logprobs * mask).sum().item()
            tokens += mask.sum().item()
        return {"nll_sum": nll_sum, "tokens": tokens}

    def _logprobs(self, batch: dict) -> torch.Tensor:
        device = self.engine.device
        input_ids = batch["input_ids"].to(device)
        logits = self.engine(input_ids=input_ids, attention_mask=batch["attention_mask"].to(device), use_cache=False).logits
        return token_logprobs(logits, input_ids)

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
        """A Hugging Face folder (safetensors + tokenizer); with LoRA, the adapter only.

        Under ZeRO-3 each rank holds a shard of every parameter: gather them one
        at a time (every rank must join) and let rank 0 write.
        """
        import deepspeed

        module = self.engine.module
        state = {}
        for name, param in module.named_parameters():
            if self.config.lora.enabled and not param.requires_grad:
                continue  # the adapter is the trainable part; the base is unchanged
            with deepspeed.zero.GatheredParameters([param], enabled=self.zero3):
                if self.rank == 0:
                    state[name] = param.detach().to("cpu", copy=True)
        if self.rank == 0:
            from transformers import AutoTokenizer

            module.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
            AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
        torch.distributed.barrier()


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


def _redirect_output(path: Path) -> None:
    """Send this process's stdout/stderr (DeepSpeed is chatty) to a per-rank log in the run folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
