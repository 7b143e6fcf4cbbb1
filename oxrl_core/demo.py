"""`oxrl demo`, the embedded default: tiny model -> SFT -> CISPO with a verifiable reward -> evaluation.

On seeded synthetic arithmetic ("What is 7 + 12?" -> "<answer>19</answer>"): SFT teaches
the format, RL raises the share of right answers. Accuracy is greedy decoding with
vLLM on held-out problems, scored by the math reward: sampled at the training
temperature (pass@1 from 8 samples each) and greedy. A PNG of the RL curves is
written to the RL run folder.
"""

import os
import time
from pathlib import Path

from rich.console import Console

from oxrl_core.config import load_rl_config, load_sl_config
from oxrl_core.loops.rl import train_rl
from oxrl_core.loops.sl import train_sl
from oxrl_core.preprocess.arithmetic import arithmetic_problems, sft_records, write_jsonl

SFT_CONFIG = Path(__file__).with_name("demo_sft.yaml")
RL_CONFIG = Path(__file__).with_name("demo_rl.yaml")
MAX_OPERAND = 9


def run_demo(console: Console, seed: int) -> dict:
    """`seed` draws the problems, the data order and the samples (the tiny model's initial weights stay fixed)."""
    data = Path(os.environ.get("OXRL_DATA_DIR", "data")) / "arithmetic" / f"seed-{seed}"
    files = {
        name: write_jsonl(make(arithmetic_problems(n, seed=4 * seed + k, max_operand=MAX_OPERAND)), data / f"{name}.jsonl")
        for k, (name, n, make) in enumerate([("sft_train", 4000, sft_records), ("sft_val", 200, sft_records),
                                             ("rl_train", 2000, list), ("rl_val", 200, list)])
    }
    name = time.strftime(f"demo-%Y%m%d-%H%M%S-seed{seed}")
    start = time.perf_counter()

    console.rule("1/2 SFT: learn the answer format")
    sft_config, model_path = load_sl_config(SFT_CONFIG, [
        f"data.train=[{{path: {files['sft_train']}}}]", f"data.val={files['sft_val']}", f"run.name={name}-sft",
        f"train.seed={seed}"])
    sft = train_sl(sft_config, model_path, resume=False, console=console)

    console.rule("2/2 CISPO: reward right answers")
    rl_config, sft_model = load_rl_config(RL_CONFIG, [
        f"model.name_or_path={sft['checkpoint']}", f"data.train=[{{path: {files['rl_train']}}}]",
        f"data.val={files['rl_val']}", f"run.name={name}-rl", f"train.seed={seed}"])
    rl = train_rl(rl_config, sft_model, resume=False, console=console)
    evals = [(0, rl["eval_before"]["eval_accuracy"])] + [(h["step"], h["eval_accuracy"]) for h in rl["history"] if "eval_accuracy" in h]
    evals.append((rl["history"][-1]["step"], rl["eval_after"]["eval_accuracy"]))
    plot = plot_curves(rl["history"], evals, Path(rl["run_dir"]) / "curves.png")
    return {
        "sft_eval_loss": sft["eval_loss"], "after_sft": rl["eval_before"], "after_rl": rl["eval_after"],
        "sft_steps": sft_config.train.steps, "rl_steps": rl_config.train.steps,
        "wall_time_s": time.perf_counter() - start, "checkpoint": rl["checkpoint"], "plot": str(plot),
    }


def plot_curves(history: list[dict], evals: list[tuple[int, float]], path: Path) -> Path:
    """Reward, accuracy (with held-out `evals` as (step, accuracy)) and response length per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, key, title in zip(axes, ("reward_mean", "accuracy", "response_length"),
                              ("mean reward", "sample accuracy", "response length (tokens)")):
        values = [h[key] for h in history]
        ax.plot(steps, values, alpha=0.35)
        window = max(1, len(values) // 20)  # a moving average shows the trend through sampling noise
        smooth = [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]
        ax.plot(steps, smooth)
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[1].plot(*zip(*evals), "o-", label="held-out accuracy")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
