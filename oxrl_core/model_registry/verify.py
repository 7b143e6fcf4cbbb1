"""`oxrl onboard --verify`: one SFT step and one RL step on the model, through the same code as `oxrl train`."""

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
RL_STEP = [
    "train.steps=1",
    "run.train_ranks=1",
    "train.batch_size=4",
    "train.micro_batch_size=4",
    "train.grad_accum=1",
    "rollout.n_samples=2",
    "rollout.max_tokens=16",
    "data.val=null",
]


def verify(entry: RegistryEntry, sft_config: Path, rl_config: Path, console: Console) -> RegistryEntry:
    """The entry marked verified with today's date and the versions used; OxrlError if a step fails."""
    from oxrl_core.loops.train import train  # here: the loops import torch and Ray, which `oxrl onboard` need not

    with tempfile.TemporaryDirectory(prefix="oxrl-verify-") as runs:  # the checkpoints are not kept
        console.rule(f"verify 1/2: one SFT step on {entry.model}")
        sft = train(resolve_run("sl", sft_config, [*SFT_STEP, f"run.output_dir={runs}"]), resume=False, console=console)
        if not math.isfinite(sft["last_loss"]):
            raise OxrlError(f"--verify: the SFT step on {entry.model} gave loss {sft['last_loss']}")
        console.rule(f"verify 2/2: one RL step on {entry.model}")
        rl = train(resolve_run("rl", rl_config, [*RL_STEP, f"run.output_dir={runs}"]), resume=False, console=console)
        if [h["step"] for h in rl["history"]] != [1] or not math.isfinite(rl["history"][0]["loss"]):
            raise OxrlError(
                f"--verify: the RL step on {entry.model} did not finish with a finite loss: {rl['history']}"
            )
    return entry.model_copy(
        update={"status": "verified", "verified_date": date.today(), "verified_versions": _versions()}
    )


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
