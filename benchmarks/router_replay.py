"""Router replay against none on the tiny mixtures of experts (CPU): the sampler-trainer gap (mean |log p_vLLM -
log p_trainer| and KL per response token) and the routing agreement (the share of token-layers whose trainer router
chose the engine's experts) of RL runs with `rollout.router_replay` on and off, seeds 0-2.

Where both sides compute in float32 they route alike and replay has nothing to remove; the gap appears in reduced
precision: Qwen3-MoE trained and sampled in bfloat16, and Qwen3.5-MoE sampled in bfloat16 (vLLM's CPU DeltaNet
kernel takes no other) beside a float32 trainer. Each run: `oxrl onboard`'s RL config of the model, --verify's
settings (LoRA off: full weights, learning rate 1e-3, 8 prompts x 4 samples of 16 tokens) for --steps steps.

    python benchmarks/router_replay.py [--steps 6] [--out benchmarks/results/DATE.cpu.router-replay.json]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from oxrl_core.model_registry.verify import RL_STEPS

OXRL = Path(sys.executable).parent / "oxrl"
MODELS = {"oxrl-tiny-qwen3-moe": ["model.dtype=bfloat16"], "oxrl-tiny-qwen3-5-moe": []}
SEEDS = (0, 1, 2)


def run(config: Path, out: Path, *overrides: str) -> list[dict]:
    result = subprocess.run(
        [str(OXRL), "train", "rl", "--config", str(config), *overrides, f"run.output_dir={out}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"{' '.join(overrides)} failed:\n{result.stderr[-3000:]}")
    (summary,) = out.glob("*/summary.json")
    return json.loads(summary.read_text())["history"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{date.today()}.cpu.router-replay.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for model, precision in MODELS.items():
            registry = Path(work) / "registry"
            subprocess.run([str(OXRL), "onboard", model, "--out", str(registry)], capture_output=True, check=True)
            config = registry / model / "rl.yaml"
            for seed in SEEDS:
                for replay in (False, True):
                    out = Path(work) / f"{model}-{seed}-{replay}"
                    steps = [s for s in RL_STEPS if not s.startswith(("train.steps", "lora."))]
                    history = run(
                        config,
                        out,
                        *steps,
                        *precision,
                        f"train.steps={args.steps}",
                        f"train.seed={seed}",
                        f"rollout.router_replay={str(replay).lower()}",
                        "lora.enabled=false",
                    )
                    row = {
                        "model": model,
                        "precision": " ".join(precision) or "engines bfloat16, trainer float32",
                        "seed": seed,
                        "router_replay": replay,
                        "gap_abs": [h["logprob_gap_abs"] for h in history],
                        "gap_kl": [h["logprob_gap_kl"] for h in history],
                        "routing_agreement": [h["routing_agreement"] for h in history],
                    }
                    rows.append(row)
                    print(
                        f"{model} seed {seed} replay {replay!s:5}: gap {statistics.mean(row['gap_abs']):.2e} "
                        f"(max {max(row['gap_abs']):.2e}), KL max {max(row['gap_kl']):.2e}, agreement "
                        f"{statistics.mean(row['routing_agreement']):.4f}",
                        flush=True,
                    )
    args.out.write_text(json.dumps({"date": str(date.today()), "machine": "cpu", "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
