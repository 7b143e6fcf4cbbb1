"""`oxrl onboard --verify`: one SFT step and two RL steps on the model, through the same code as `oxrl train`.

The RL run trains LoRA adapters on the entry's own targets (or, with `full_weights`, every weight), and its second
step samples from the weights the first step's refresh sent to the engines. Each step measures the sampler-trainer
gap, the mean |log p_vLLM - log p_trainer| over the response tokens: at step 1 it checks that vLLM reads the model's
checkpoint as the trainer does, at step 2 that the refresh puts every trained weight where vLLM reads it. It must
stay within GAP_BOUND for the engines' dtype.
A mixture of experts' RL steps replay the engines' routes (`rollout.router_replay`, on by default); each step also
measures how often the trainer's own routers chose the engines' experts, recorded as `routing_agreement`.
"""

import math
import tempfile
from datetime import date
from pathlib import Path

from rich.console import Console

from oxrl_core.errors import OxrlError
from oxrl_core.model_registry.schema import RegistryEntry
from oxrl_core.resolve.run import resolve_run
from oxrl_core.version import __version__

# One step on the smallest batches, no held-out evaluation: this proves the model loads, trains and samples.
SFT_STEP = [
    "train.steps=1",
    "run.train_ranks=1",
    "train.batch_size=2",
    "train.micro_batch_size=2",
    "train.grad_accum=1",
    "data.val=null",
]
# Two steps, the second sampled after a refresh. The reward varies between any model's samples (digit_share), and
# the learning rate moves every trained weight by about 1e-3 (Adam's first step), so the refresh carries weights the
# engines do not have: one it left out, or put elsewhere, moves the sampler off the trainer.
RL_STEPS = [
    "train.steps=2",
    "run.train_ranks=1",
    "train.batch_size=8",
    "train.micro_batch_size=8",
    "train.grad_accum=1",
    "train.lr=1e-3",
    "rollout.n_samples=4",
    "rollout.max_tokens=16",
    "reward.func=oxrl_core.model_registry.verify:digit_share",
    "data.val=null",
]
# Mean |log p_vLLM - log p_trainer| per response token, at most. Float32 engines agree with the trainer to 2e-7 to
# 4e-7 on the tiny models on CPU (other kernels, other summation orders), to 1.1e-4 on an H100; a
# refresh that swapped the tiny Llama's gate and up projections gave 1.6e-2, one that left LoRA's deltas out of
# Qwen2.5-VL's vision MLP 7e-4. Bf16 engines round every weight and activation to 8 bits of mantissa: 1.0e-3 on the
# tiny Qwen3.5 (a float32 trainer), 0.033 to 0.046 on a random-weight 7B trained and sampled in bf16 on an H100 or
# H200; the 32B shape with its RoPE frequencies computed in bf16 (a bug, fixed) gave 0.53.
GAP_BOUND = {"float32": 2e-4, "bfloat16": 0.1, "float16": 0.1}


def digit_share(response: str, sample: dict) -> float:
    """The share of the response's characters that are digits: a reward that differs between samples of any model,
    trained or random, so that a step's advantages are not all zero."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def verify(
    entry: RegistryEntry, sft_config: Path, rl_config: Path, console: Console, full_weights: bool = False
) -> RegistryEntry:
    """The entry marked verified with today's date, the versions used, the weights trained and the gaps measured;
    OxrlError if a step fails or a gap passes its bound."""
    from oxrl_core.loops.train import train  # here: the loops import torch and Ray, which `oxrl onboard` need not

    with tempfile.TemporaryDirectory(prefix="oxrl-verify-") as runs:  # the checkpoints are not kept
        console.rule(f"verify 1/2: one SFT step on {entry.model}")
        sft = train(resolve_run("sl", sft_config, [*SFT_STEP, f"run.output_dir={runs}"]), resume=False, console=console)
        if not math.isfinite(sft["last_loss"]):
            raise OxrlError(f"--verify: the SFT step on {entry.model} gave loss {sft['last_loss']}")
        console.rule(f"verify 2/2: two RL steps on {entry.model}")
        weights = "full weights" if full_weights else f"LoRA on {', '.join(entry.lora_targets)}"
        console.print(weights, highlight=False)  # wrapped, where a rule cuts it
        lora = (
            ["lora.enabled=false"]
            if full_weights
            else ["lora.enabled=true", f"lora.target_modules=[{', '.join(entry.lora_targets)}]"]
        )
        run = resolve_run("rl", rl_config, [*RL_STEPS, *lora, f"run.output_dir={runs}"])
        history = train(run, resume=False, console=console)["history"]
    if [h["step"] for h in history] != [1, 2] or not all(math.isfinite(h["loss"]) for h in history):
        raise OxrlError(f"--verify: the RL steps on {entry.model} did not finish with finite losses: {history}")
    gaps = [h["logprob_gap_abs"] for h in history]
    routed = {"routing_agreement": min(h["routing_agreement"] for h in history)} if run.router_replay else {}
    bound = GAP_BOUND[run.sampler_dtype]
    if not all(gap <= bound for gap in gaps):
        raise OxrlError(
            f"--verify: the sampler-trainer gap on {entry.model} is {gaps[0]:.2e} at step 1 (vLLM's reading of the "
            f"checkpoint) and {gaps[1]:.2e} at step 2 (after a refresh), mean |log p| per response token; at most "
            f"{bound:.0e} for {run.sampler_dtype} engines: the model's weights do not reach vLLM as the trainer has them"
        )
    return entry.model_copy(
        update={
            "status": "verified",
            "verified_date": date.today(),
            "verified_versions": _versions(),
            "verified_by": f"{_name(entry.model)} ({entry.architecture}, {entry.params / 1e6:,.1f}M parameters) on "
            f"{_device()}, {'full weights' if full_weights else 'LoRA'}",
            "verified_gap": {"checkpoint": gaps[0], "refresh": gaps[1], "sampler_dtype": run.sampler_dtype} | routed,
        }
    )


def _name(model: str) -> str:
    """A Hub id, or a local folder's name (a tiny model's, e.g. oxrl-tiny-llama)."""
    return Path(model).name if Path(model).is_absolute() else model


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def _versions() -> dict[str, str]:
    import deepspeed
    import peft
    import torch
    import transformers
    import vllm

    return {
        "oxrl": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm.__version__,
        "deepspeed": deepspeed.__version__,
        "peft": peft.__version__,
    }
