"""The sampler-trainer gap of Qwen3.5 per layer type: `oxrl onboard --verify` on three text-only Qwen3.5s of the tiny
model's widths and 4 layers: all gated attention, DeltaNet and attention alternating, and the real models' mix (three
DeltaNet layers to one attention layer). The trainer runs transformers'
chunked kernels over whole sequences; vLLM samples token by token, the DeltaNet layers through its recurrent kernel
(in bfloat16 on CPU, where its kernel takes no other). Each verify reports the mean |log p_vLLM - log p_trainer| per
response token from the checkpoint and after a refresh.

    python benchmarks/qwen3_5_gap.py [--out benchmarks/results/DATE.cpu.qwen3_5-gap.json]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig, AutoTokenizer, Qwen3_5ForCausalLM

from oxrl_core.models.tiny import resolve_tiny_model

# DeltaNet layers alone are left out: vLLM 0.32's CPU sampler fails on them (`CPU Generator does not use offset`,
# in its bookkeeping of a seeded request), 2026-12-07.
PATTERNS = {
    "attention": ["full_attention"] * 4,
    "hybrid 1:1": ["linear_attention", "full_attention"] * 2,
    "hybrid 3:1": ["linear_attention"] * 3 + ["full_attention"],
}
OXRL = Path(sys.executable).parent / "oxrl"


def variant(layer_types: list[str], folder: Path) -> Path:
    tiny = resolve_tiny_model("oxrl-tiny-qwen3-5")
    text = AutoConfig.from_pretrained(tiny).text_config
    text.num_hidden_layers, text.layer_types = len(layer_types), layer_types
    text.architectures = ["Qwen3_5ForCausalLM"]
    torch.manual_seed(0)
    Qwen3_5ForCausalLM._from_config(text, dtype=torch.float32).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{date.today()}.cpu.qwen3_5-gap.json"))
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        for name, layer_types in PATTERNS.items():
            folder = variant(layer_types, Path(work) / name.replace(" ", "-").replace(":", "to"))
            result = subprocess.run(
                [str(OXRL), "onboard", str(folder), "--out", str(Path(work) / "registry"), "--verify"],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                sys.exit(f"{name}: verify failed\n{result.stderr[-3000:]}")
            (entry,) = (Path(work) / "registry").glob(f"local--{folder.name}.yaml")
            rows[name] = yaml.safe_load(entry.read_text())["verified_gap"]
            print(
                f"{name:12} checkpoint {rows[name]['checkpoint']:.2e}  refresh {rows[name]['refresh']:.2e}", flush=True
            )
    args.out.write_text(json.dumps({"date": str(date.today()), "machine": "cpu", "gaps": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
