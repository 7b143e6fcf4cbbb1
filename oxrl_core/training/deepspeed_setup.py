"""What a run's config makes of DeepSpeed: its config, the models' dtype, the optimizer and its schedule."""

import os

import torch

from oxrl_core.config.sections import ModelSection
from oxrl_core.training.spec import TrainerSpec


def name_the_accelerator() -> None:
    """Without a GPU, DeepSpeed guesses its accelerator and warns on every import: say it before the process first
    imports it (a rank's first act; the driver's before it checks DeepSpeed's settings)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")


def deepspeed_config(spec: TrainerSpec) -> dict:
    """DeepSpeed's config for the run: batch sizes, clipping, ZeRO (its stage, offloading and the user's keys over
    them) and the precision."""
    train, ds = spec.train, spec.deepspeed
    zero: dict = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    zero |= ds.zero_optimization
    bf16 = {"enabled": model_dtype(spec.model) == torch.bfloat16}
    if not spec.check_grad_overflow:
        bf16["check_grad_overflow"] = False
    return {
        "train_batch_size": train.batch_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": zero,
        "bf16": bf16,
        "fp16": {"enabled": model_dtype(spec.model) == torch.float16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer (on by default) synchronizes the device in every forward and step: each
        # micro-batch then waits for the GPU to drain its queue and the GPU for the host's next launches.
        "timers": {"throughput": {"enabled": False}},
    }


def model_dtype(model: ModelSection) -> torch.dtype:
    """The dtype the models train and serve in; `auto`: bf16 on GPUs, float32 on the CPU."""
    if model.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, model.dtype)


def deepspeed_engine(model: torch.nn.Module, spec: TrainerSpec, ds_config: dict, on_gpu: bool):
    """The policy as a DeepSpeed engine that trains its parameters that take a gradient, with AdamW and the
    config's learning-rate schedule."""
    import deepspeed

    train = spec.train
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=trainable,
        optimizer=lambda params: _adamw(params, train.lr, train.weight_decay, on_gpu, spec.deepspeed.offload_optimizer),
        lr_scheduler=lambda opt: _scheduler(opt, train.lr_scheduler, train.warmup_steps, train.steps),
        config=ds_config,
    )
    return engine


def _adamw(params, lr: float, weight_decay: float, on_gpu: bool, offloaded: bool) -> torch.optim.Optimizer:
    """AdamW. Under ZeRO-Offload, where the optimizer states and the update live in CPU memory, DeepSpeed's CPU Adam
    (vectorised; DeepSpeed refuses another optimizer there; its op compiles on first use, about a minute); else
    torch's, fused on GPUs."""
    if offloaded:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=on_gpu)


def _scheduler(optimizer, name: str, warmup_steps: int, steps: int):
    """Transformers' schedule of that name over the run's steps; `constant` is taken with warm-up, so that
    `train.warmup_steps` holds for every schedule."""
    from transformers import get_scheduler

    name = "constant_with_warmup" if name == "constant" else name
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=steps)
