"""Ready-to-run SFT and RL configs for an onboarded model, checked against the run schema before they are written.

They train on the shipped synthetic data (paths relative to the repository root): arithmetic, or for a
vision-language model the squares-counting pictures, for an audio model the beeps-counting clips. Point `data.train`
at your own data for real work.
"""

from pathlib import Path

import torch
import yaml

from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.model_registry.schema import RegistryEntry

DATA = Path("examples/data")


def write_configs(entry: RegistryEntry, trust_remote_code: bool, folder: Path) -> tuple[Path, Path]:
    """Write `<folder>/sft.yaml` and `<folder>/rl.yaml`; return their paths."""
    ranks = max(torch.cuda.device_count(), 1)  # one DeepSpeed rank per GPU; one process on CPU
    lora = entry.recommended_mode == "lora"
    model = {
        "name_or_path": entry.model,
        "dtype": "auto",
        "gradient_checkpointing": entry.params > 1e9,
        "trust_remote_code": trust_remote_code,
    }
    lora_section = {"enabled": lora, "r": 16, "alpha": 32.0, "target_modules": entry.lora_targets}
    deepspeed = {
        "zero_stage": 2 if lora else 3
    }  # LoRA's trainable weights are small; full training needs everything sharded
    stem = Path(entry.model).name
    task = {"image-text-to-text": "squares", "audio-text-to-text": "beeps"}.get(entry.model_class, "arithmetic")
    sft = {
        "model": model,
        "lora": lora_section,
        "data": {
            "train": [{"path": str(DATA / f"{task}_sft_train.jsonl")}],
            "val": str(DATA / f"{task}_sft_val.jsonl"),
            "max_len": min(1024, entry.context_length),
        },
        "train": {
            "alg": "sft",
            "lr": 1e-4 if lora else 1e-5,
            "steps": 100,
            "batch_size": 8 * ranks,
            "micro_batch_size": 2,
            "grad_accum": 4,
            "warmup_steps": 10,
            "lr_scheduler": "cosine",
        },
        "deepspeed": deepspeed,
        "run": {"name": f"{stem}-sft", "train_ranks": ranks},
    }
    rl = {
        "model": model,
        "lora": lora_section,
        "data": {"train": [{"path": str(DATA / f"{task}_rl_train.jsonl")}], "val": str(DATA / f"{task}_rl_val.jsonl")},
        "train": {
            "alg": "cispo",
            "lr": 1e-5 if lora else 1e-6,
            "steps": 100,
            "batch_size": 16 * ranks,  # 2 prompts x 8 samples per rank
            "micro_batch_size": 8,
            "grad_accum": 2,
            "lr_scheduler": "constant",
        },
        "rollout": {
            "n_samples": 8,
            "temperature": 1.0,
            "max_tokens": 256,
            "max_prompt_len": min(512, entry.context_length),
            "gpu_memory_utilization": 0.5,
        },  # on GPU; on CPU the KV cache is sized for a step's samples
        "reward": {"func": "math"},
        "deepspeed": deepspeed,
        "run": {"name": f"{stem}-rl", "train_ranks": ranks},
    }
    SLConfig.model_validate(sft)
    RLConfig.model_validate(rl)
    folder.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Written by `oxrl onboard {entry.model}`. Run from the repository root (data paths are relative to it):\n"
    )
    paths = folder / "sft.yaml", folder / "rl.yaml"
    for path, tree, command in zip(paths, (sft, rl), ("sl", "rl")):
        path.write_text(header + f"#   oxrl train {command} --config {path}\n" + yaml.safe_dump(tree, sort_keys=False))
    return paths
