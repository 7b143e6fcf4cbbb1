"""`oxrl demo`, the embedded default: tiny model -> SFT -> CISPO with a verifiable reward -> evaluation.

On seeded synthetic arithmetic ("What is 7 + 12?" -> "<answer>19</answer>"): SFT teaches
the format, RL raises the share of right answers. Accuracy is measured with vLLM on
each of the task's 200 problems, scored by the math reward: sampled at the training
temperature (pass@1 from 8 samples each) and greedy. A PNG of the RL curves is
written to the RL run folder.
"""

import os
import random
import time
from pathlib import Path

from rich.console import Console

from oxrl_core.loops.train import train
from oxrl_core.preprocess.arithmetic import every_arithmetic_problem, off_by_one_sft_records, sft_records, write_jsonl
from oxrl_core.resolve.run import resolve_run

SFT_CONFIG = Path(__file__).with_name("demo_sft.yaml")
RL_CONFIG = Path(__file__).with_name("demo_rl.yaml")
MAX_OPERAND = 9  # 200 distinct problems
OFF_BY_ONE_SHARE = 0.5


def run_demo(console: Console, seed: int) -> dict:
    """`seed` draws the training problems, the demonstrations' errors, the data order and the samples (the tiny
    model's initial weights stay fixed). Accuracy is measured on every problem of the task once: the demo shows RL
    correcting what SFT learned, not generalisation to unseen problems (the 0.35M-parameter model memorises the
    200 problems; in one try with 50 of them held out of training, RL moved their accuracy by 0-2 points)."""
    files = demo_data(seed)
    name = time.strftime(f"demo-%Y%m%d-%H%M%S-seed{seed}")
    start = time.perf_counter()
    console.rule("1/2 SFT: learn the answer format")
    sft, sft_steps = train_demo_sft(console, files, seed, f"{name}-sft")
    console.rule("2/2 CISPO: reward right answers")
    rl, rl_steps = train_demo_rl(console, files, sft["checkpoint"], seed, f"{name}-rl", RL_CONFIG)
    evals = [(0, rl["eval_before"]["eval_accuracy"])] + [
        (h["step"], h["eval_accuracy"]) for h in rl["history"] if "eval_accuracy" in h
    ]
    evals.append((rl["history"][-1]["step"], rl["eval_after"]["eval_accuracy"]))
    plot = plot_curves(rl["history"], evals, Path(rl["run_dir"]) / "curves.png")
    return {
        "sft_eval_loss": sft["eval_loss"],
        "after_sft": rl["eval_before"],
        "after_rl": rl["eval_after"],
        "sft_steps": sft_steps,
        "rl_steps": rl_steps,
        "wall_time_s": time.perf_counter() - start,
        "checkpoint": rl["checkpoint"],
        "plot": str(plot),
    }


def demo_data(seed: int) -> dict[str, Path]:
    """The demo's four JSONL files for `seed`: SFT train/val and RL train/val."""
    data = Path(os.environ.get("OXRL_DATA_DIR", "data")) / "arithmetic" / f"seed-{seed}"
    rng = random.Random(seed)
    problems = every_arithmetic_problem(MAX_OPERAND)
    records = {
        # Half the demonstrations are one too high: SFT learns the format and to waver between the right answer
        # and the one above it; only the verifiable reward tells them apart.
        "sft_train": off_by_one_sft_records(rng.choices(problems, k=4000), share=OFF_BY_ONE_SHARE, rng=rng),
        "sft_val": sft_records(problems),
        "rl_train": rng.choices(problems, k=2000),
        "rl_val": problems,
    }
    return {name: write_jsonl(rows, data / f"{name}.jsonl") for name, rows in records.items()}


def train_demo_sft(console: Console, files: dict[str, Path], seed: int, name: str) -> tuple[dict, int]:
    """The demo's SFT run; returns its summary and step count."""
    run = resolve_run(
        "sl",
        SFT_CONFIG,
        [
            f"data.train=[{{path: {files['sft_train']}}}]",
            f"data.val={files['sft_val']}",
            f"run.name={name}",
            f"train.seed={seed}",
        ],
    )
    return train(run, resume=False, console=console), run.config.train.steps


def train_demo_rl(
    console: Console,
    files: dict[str, Path],
    sft_checkpoint: str,
    seed: int,
    name: str,
    config_path: Path = RL_CONFIG,
    overrides: tuple[str, ...] = (),
) -> tuple[dict, int]:
    """The demo's RL run from `sft_checkpoint` (`config_path` and `overrides` let a benchmark change the algorithm);
    returns its summary and step count."""
    run = resolve_run(
        "rl",
        config_path,
        [
            f"model.name_or_path={sft_checkpoint}",
            f"data.train=[{{path: {files['rl_train']}}}]",
            f"data.val={files['rl_val']}",
            f"run.name={name}",
            f"train.seed={seed}",
            *overrides,
        ],
    )
    return train(run, resume=False, console=console), run.config.train.steps


def plot_curves(history: list[dict], evals: list[tuple[int, float]], path: Path) -> Path:
    """Reward, accuracy (with the evaluations `evals` as (step, accuracy)) and response length per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, key, title in zip(
        axes,
        ("reward_mean", "accuracy", "response_length"),
        ("mean reward", "sample accuracy", "response length (tokens)"),
    ):
        values = [h[key] for h in history]
        ax.plot(steps, values, alpha=0.35)
        window = max(1, len(values) // 20)  # a moving average shows the trend through sampling noise
        smooth = [
            sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))
        ]
        ax.plot(steps, smooth)
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[1].plot(*zip(*evals), "o-", label="accuracy on all 200 problems")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
